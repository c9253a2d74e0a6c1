"""The cost model, step profiles, planner and ``dpgraph plan``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph import brew, cli, model_helper
from dpgraph.errors import ParallelizeError
from dpgraph.parallel.plan import AlphaBeta, CostModel, load, predict, resnet50_profile
from dpgraph.parallel.plan.calibrate import fit, probe_flops, probe_local
from dpgraph.parallel.plan.planner import (
    MB,
    best_bucket_bytes,
    bucket_sizes,
    scaling_table,
    sqrt_rule_bytes,
)
from dpgraph.parallel.plan.profile import (
    GradTiming,
    StepProfile,
    profile_from_nets,
    resnet50_shapes,
)


def test_ring_allreduce_formula() -> None:
    model = AlphaBeta(alpha=1e-3, beta=1e-9)
    n, p = 100e6, 4
    assert model.allreduce(n, p) == pytest.approx(2 * 3 * 1e-3 + 2 * 3 / 4 * n * 1e-9)
    assert model.allreduce(n, 1) == 0.0
    assert model.local_reduce(8.0, 1) == 0.0


def test_cost_model_file_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = CostModel({"gloo": AlphaBeta(2e-4, 3e-10)}, flops_per_sec=1e11)
    path = tmp_path / "cost.json"
    model.save(path)
    monkeypatch.setenv("DPGRAPH_COST_MODEL", str(path))
    loaded = load()
    assert loaded.backend("gloo") == AlphaBeta(2e-4, 3e-10)
    assert loaded.backend("local") == CostModel().backend("local")  # defaults fill in
    assert loaded.flops_per_sec == 1e11
    path.write_text("{\"backends\": {\"gloo\": {\"alpha\": 1}}}")
    with pytest.raises(ParallelizeError, match="expected"):
        load(path)
    with pytest.raises(ParallelizeError, match="Cannot read"):
        load(tmp_path / "missing.json")
    with pytest.raises(ParallelizeError, match="no figures for backend 'mpi'"):
        loaded.backend("mpi")


def test_fit_recovers_alpha_and_beta() -> None:
    sizes = [1e3, 1e5, 1e6, 1e7]
    times = [2 * 5e-5 + 1 * n * 2e-9 for n in sizes]
    figures = fit(sizes, times, steps=2, volume=1)
    assert figures.alpha == pytest.approx(5e-5, rel=1e-6)
    assert figures.beta == pytest.approx(2e-9, rel=1e-6)


def test_local_and_flops_probes_are_positive() -> None:
    local = probe_local(sizes=(4096, 1 << 20), repeats=2)
    assert local.beta > 0 and local.alpha >= 0
    assert probe_flops(n=64, repeats=2) > 1e6


def test_resnet50_profile() -> None:
    shapes = resnet50_shapes()
    assert len(shapes) == 161
    assert sum(int(np.prod(s)) for _, s in shapes) == 25_557_032
    profile = resnet50_profile(batch=1)
    assert profile.grad_bytes == 4 * 25_557_032
    assert 7.5e9 < profile.forward_flops < 8.5e9  # 3.9 GMACs + BN
    # the backward pass starts at the end; FCGradient writes w's then b's gradient
    assert [g.name for g in profile.grads[:2]] == ["last_out_w_grad", "last_out_b_grad"]
    readies = [g.ready_flops for g in profile.grads]
    assert readies == sorted(readies) and readies[-1] == profile.backward_flops
    by_op: dict[int, set[float]] = {}
    for g in profile.grads:  # one op's gradients (a batch norm's scale and bias) exist together
        by_op.setdefault(g.op, set()).add(g.ready_flops)
    assert len(by_op) == 107 and all(len(ready) == 1 for ready in by_op.values())
    assert len({g.ready_flops for g in profile.grads}) == len(by_op)


def test_profile_from_nets_counts_flops_and_orders_gradients() -> None:
    model = model_helper.ModelHelper(name="plan_mlp")
    hidden = brew.relu(model, brew.fc(model, "data", "fc1", 6, 5), "relu")
    brew.fc(model, hidden, "fc2", 5, 3)
    profile = profile_from_nets(model.net.Proto(), model.param_init_net.Proto(),
                                {"data": [8, 6]})
    assert profile.forward_flops == 2 * 8 * 5 * 6 + 8 * 5 + 2 * 8 * 3 * 5
    assert [g.name for g in profile.grads] == ["fc2_w_grad", "fc2_b_grad", "fc1_w_grad",
                                               "fc1_b_grad"]
    assert [g.nbytes for g in profile.grads] == [60, 12, 120, 20]
    assert profile.backward_flops == 2 * 2 * 8 * 3 * 5 + 8 * 5 + 2 * 2 * 8 * 5 * 6


def test_zoo_resnet50_profile_matches_the_builtin() -> None:
    from dpgraph.modeling.zoo.resnet import create_resnet50

    model = model_helper.ModelHelper(name="plan_r50")
    create_resnet50(model, "data", num_input_channels=3, num_labels=1000, no_bias=True)
    profile = profile_from_nets(model.net.Proto(), model.param_init_net.Proto(),
                                {"data": [1, 3, 224, 224]})
    assert len(profile.grads) == 161 and profile.grad_bytes == 4 * 25_557_032
    assert profile.forward_flops == pytest.approx(resnet50_profile(1).forward_flops, rel=0.1)


def _toy(n: int = 10, nbytes: int = MB) -> StepProfile:
    grads = tuple(GradTiming(f"g{i}", nbytes, (i + 1) * 1e9) for i in range(n))
    return StepProfile("toy", 5e9, n * 1e9, grads)


def test_bucket_sizes_and_predictions() -> None:
    assert bucket_sizes([4, 4, 4, 9, 1], 8) == [(1, 8), (2, 4), (3, 9), (4, 1)]
    assert bucket_sizes([4, 4], None) == [(0, 4), (1, 4)]
    model = CostModel({"gloo": AlphaBeta(1e-3, 1e-9)}, flops_per_sec=1e12)
    one = predict(_toy(), model, 1, None)
    assert one.step_s == one.compute_s == pytest.approx(15e9 / 1e12)
    per_blob = predict(_toy(), model, 8, None)
    bucketed = predict(_toy(), model, 8, 5 * MB)
    assert per_blob.collectives == 10 and bucketed.collectives == 2
    assert bucketed.comm_s < per_blob.comm_s
    assert 0 < per_blob.efficiency <= 1 and per_blob.comm_share == pytest.approx(
        1 - per_blob.efficiency)


def test_overlap_hides_communication_behind_the_backward_pass() -> None:
    model = CostModel({"gloo": AlphaBeta(0.0, 1e-9)}, flops_per_sec=1e9)  # 1 s per GFLOP
    profile = _toy(n=10, nbytes=10 * MB)  # each bucket's comm ~ 0.01 s << 1 s compute
    pred = predict(profile, model, 2, 10 * MB)
    last = bucket_sizes([g.nbytes for g in profile.grads], 10 * MB)[-1][1]
    assert pred.step_s == pytest.approx(pred.compute_s + model.backend("gloo").allreduce(
        last, 2))  # only the last bucket is exposed


def test_best_bucket_beats_extremes() -> None:
    model = CostModel({"gloo": AlphaBeta(5e-3, 1e-9)}, flops_per_sec=1e12)
    profile = _toy(n=40, nbytes=4 * MB)
    best = best_bucket_bytes(profile, model, 16)
    step = predict(profile, model, 16, best).step_s
    assert step <= predict(profile, model, 16, None).step_s
    assert step <= predict(profile, model, 16, profile.grad_bytes).step_s
    assert sqrt_rule_bytes(100 * MB, model, "gloo", 2, 1) == pytest.approx(
        np.sqrt(100 * MB * 2 * 5e-3 / 1e-9), rel=0.26)


def test_scaling_table_rows() -> None:
    rows = scaling_table(resnet50_profile(32), CostModel(), [1, 8, 64], "auto")
    assert [r["workers"] for r in rows] == [1, 8, 64]
    assert rows[0]["per_blob"]["collectives"] == 161
    # "auto" takes the fewest collectives within 0.2% of the best predicted step
    assert all(r["bucketed"]["step_s"] <= r["per_blob"]["step_s"] * 1.003 for r in rows)


def _run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_resnet50_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_cli(["--workers", "8,256", "--gflops", "15000", "--bandwidth",
                             "1.25e9"], capsys)
    assert code == 0
    assert "161 gradients" in out and "per-blob step" in out
    data = json.loads(out.strip().splitlines()[-1])
    assert [r["workers"] for r in data["rows"]] == [8, 256]
    code, out, _ = _run_cli(["--json", "--workers", "2", "--bucket-mb", "25"], capsys)
    data = json.loads(out)
    assert code == 0 and data["rows"][0]["bucketed"]["bucket_mb"] == 25


def test_cli_on_a_saved_net(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = model_helper.ModelHelper(name="plan_saved")
    brew.fc(model, "data", "fc", 6, 3)
    (tmp_path / "predict_net.pb").write_bytes(model.net.Proto().SerializeToString())
    (tmp_path / "init_net.pb").write_bytes(model.param_init_net.Proto().SerializeToString())
    code, out, _ = _run_cli([str(tmp_path), "--input", "data=4,6", "--json", "--workers",
                             "1,2"], capsys)
    assert code == 0 and json.loads(out)["gradients"] == 2
    code, _, err = _run_cli([str(tmp_path / "predict_net.pb"), "--workers", "2"], capsys)
    assert code == 2 and "--init-net" in err
    code, _, err = _run_cli(["no_such_model"], capsys)
    assert code == 2 and "is not resnet50" in err
    code, _, err = _run_cli([str(tmp_path), "--input", "data=a"], capsys)
    assert code == 2 and "NAME=D0,D1" in err


def test_cli_python_model(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    import types

    module = types.ModuleType("plan_test_models")

    def make() -> Any:
        model = model_helper.ModelHelper(name="plan_py")
        brew.fc(model, "data", "fc", 6, 3)
        return model

    module.make = make  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "plan_test_models", module)
    code, out, _ = _run_cli(["plan_test_models:make", "--input", "data=2,6", "--json"],
                            capsys)
    assert code == 0 and json.loads(out)["gradients"] == 2
