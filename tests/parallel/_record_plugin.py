"""A pytest plugin that records every Parallelize / Parallelize_BMUF output of a test run.

It is a broad cross-check for refactors of :mod:`dpgraph.parallel` beyond the committed
scenarios of :mod:`_snapshots`: record once before a change, once after, and compare::

    PYTHONHASHSEED=0 python -m pytest -q -p _record_plugin tests/parallel tests/bmuf \\
        tests/conformance tests/scenarios --record-netdefs=/tmp/before.json
    ... change the code, record /tmp/after.json the same way ...
    python tests/parallel/_record_plugin.py /tmp/before.json /tmp/after.json

Each successful call is keyed by the test's node id and the call's index in that test, and
stored as a sha256 of every net the model runs (its text, with the process-wide counters
renumbered: the committed snapshots are the byte-exact check).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
from typing import Any

_RECORDS: dict[str, dict[str, str]] = {}
_CURRENT = {"nodeid": "", "count": 0}


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--record-netdefs", default=None,
                     help="write the sha256 of every Parallelize output NetDef here (JSON)")


def _nets(model: Any) -> dict[str, Any]:
    from _snapshots import model_nets

    return model_nets(model)


_NET_SUFFIX = re.compile(r"_\d+$")
_OPTIMIZER = re.compile(r"(\w*Optimizer)_(\d+)_")


def _digest(proto: Any) -> str:
    """sha256 of the NetDef's text with the process-wide counters (net-name suffixes,
    optimizer instance numbers, Python-op tokens) renumbered, so that runs with different
    test selections compare."""
    from _snapshots import normalized

    copy = normalized(proto)
    copy.name = _NET_SUFFIX.sub("", copy.name)
    seen: dict[str, str] = {}
    text = _OPTIMIZER.sub(
        lambda m: f"{m.group(1)}_#{seen.setdefault(m.group(0), str(len(seen)))}_",
        str(copy))
    return hashlib.sha256(text.encode()).hexdigest()


def _record(model: Any) -> None:
    index = _CURRENT["count"]
    _CURRENT["count"] += 1
    key = f"{_CURRENT['nodeid']}#{index}"
    _RECORDS[key] = {_NET_SUFFIX.sub("", name): proto if isinstance(proto, str)
                     else _digest(proto) for name, proto in _nets(model).items()}


def _wrap(fun: Any) -> Any:
    @functools.wraps(fun)
    def wrapper(model: Any, *args: Any, **kwargs: Any) -> Any:
        result = fun(model, *args, **kwargs)
        _record(model)
        return result

    wrapper.__wrapped_by_recorder__ = True  # type: ignore[attr-defined]
    return wrapper


def _patch() -> None:
    from dpgraph import data_parallel_model
    from dpgraph.parallel import bmuf

    for module, name in ((data_parallel_model, "Parallelize"), (bmuf, "Parallelize_BMUF"),
                         (data_parallel_model, "Parallelize_BMUF")):
        fun = getattr(module, name, None)
        if fun is not None and not getattr(fun, "__wrapped_by_recorder__", False):
            setattr(module, name, _wrap(fun))


def pytest_configure(config: Any) -> None:
    if config.getoption("--record-netdefs"):
        _patch()


def pytest_runtest_setup(item: Any) -> None:
    _CURRENT["nodeid"] = item.nodeid
    _CURRENT["count"] = 0


def pytest_unconfigure(config: Any) -> None:
    path = config.getoption("--record-netdefs")
    if path:
        with open(path, "w") as handle:
            json.dump(_RECORDS, handle, indent=1, sort_keys=True)


def compare(before_path: str, after_path: str) -> int:
    """Print the keys whose nets differ or that only one run has; return their count."""
    with open(before_path) as handle:
        before = json.load(handle)
    with open(after_path) as handle:
        after = json.load(handle)
    problems = 0
    for key in sorted(set(before) | set(after)):
        if key not in after or key not in before:
            print(f"only in {'before' if key in before else 'after'}: {key}")
            problems += 1
        elif before[key] != after[key]:
            nets = sorted(n for n in set(before[key]) | set(after[key])
                          if before[key].get(n) != after[key].get(n))
            print(f"differs: {key}: {nets}")
            problems += 1
    print(f"{len(before)} calls before, {len(after)} after, {problems} differ")
    return problems


if __name__ == "__main__":
    sys.exit(1 if compare(sys.argv[1], sys.argv[2]) else 0)
