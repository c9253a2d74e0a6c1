"""bench/input.py runs and reports its figures (smoke test only: timings never gate)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "input.py"


def test_bench_input_reports_json(capsys) -> None:
    spec = importlib.util.spec_from_file_location("bench_input", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--images", "32", "--records", "64", "--rounds", "1"])
    report = json.loads(capsys.readouterr().out)
    assert report["image_input"]["decode_threads_2_images_per_s"] > 0
    assert report["tensor_protos_db_input"]["ratio"] > 0
