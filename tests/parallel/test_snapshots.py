"""Parallelize output is byte-identical to the committed snapshots (see ``_snapshots``).

After a deliberate change of the emitted graph, regenerate with
``python tests/parallel/_snapshots.py --update`` and review the diff of
``tests/parallel/data/netdef_snapshots.json``.
"""

from __future__ import annotations

import pytest
from _snapshots import SCENARIOS, differences, load, run

STORED = load()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_netdefs_match_snapshot(name: str) -> None:
    assert name in STORED, f"no snapshot for {name}; run _snapshots.py --update {name}"
    problems = differences(name, STORED[name], run(name))
    assert not problems, "\n".join(problems)


def test_every_snapshot_has_a_scenario() -> None:
    assert sorted(STORED) == sorted(SCENARIOS)


def test_differences_name_the_first_changed_op() -> None:
    name = "cpu_2_manual"
    changed = {label: dict(value) for label, value in STORED[name].items()}
    lines = list(changed["net"]["lines"])
    lines[5] = lines[5].replace("FC(", "FCTransposed(")
    changed["net"] = {"sha256": "0" * 64, "lines": lines}
    (problem,) = differences(name, STORED[name], changed)
    assert "net net differs" in problem and "+FCTransposed(" in problem
