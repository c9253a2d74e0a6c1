"""bench/parallelize.py still builds and parallelizes its ResNet-50 (smoke test only:
benchmarks never gate on timing)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "parallelize.py"


def test_bench_runs_on_one_and_two_devices(capsys) -> None:
    spec = importlib.util.spec_from_file_location("bench_parallelize", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--devices", "1", "3", "--repeat", "1", "--no-passes"])
    result = json.loads(capsys.readouterr().out)
    rows = {r["devices"]: r for r in result["results"]}
    assert rows[1]["net_ops"] > 400  # 53 conv+BN layers, forward and backward
    assert rows[3]["output_ops"] > 3 * rows[1]["output_ops"]
    assert all(r["ratio_to_copyfrom"] > 0 for r in rows.values())
    assert result["per_op_spread_2_to_64"] == 1.0  # one multi-device row
    assert set(result["meets"]) == {"16_devices_s", "ratio_to_copyfrom", "per_op_spread"}
