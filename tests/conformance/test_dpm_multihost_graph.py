"""Graph-level facts of a multi-host Parallelize (GLOO rendezvous, dict form), built on one
process without running anything: common worlds, Allreduce/Broadcast ops, the barrier net
and ``_DEFAULT_TIMEOUT_SEC`` (dpm-distributed-facts.md).  The multi-host passes are in
:mod:`dpgraph.parallel.multihost`; Parallelize's pipeline calls them directly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dpgraph import brew, data_parallel_model, model_helper, workspace

GRADS = ["fc_w_grad", "fc_b_grad"]


@pytest.fixture(autouse=True)
def _fresh_workspace() -> Iterator[None]:
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def rendezvous(**extra: Any) -> dict[str, Any]:
    return {"kv_handler": "store_handler", "shard_id": 0, "num_shards": 2, "engine": "GLOO",
            **extra}


def forward(model: Any, loss_scale: float) -> list[Any]:
    fc = brew.fc(model, "data", "fc", 4, 1)
    sq = model.net.SquaredL2Distance([fc, "label"], "sq")
    return [model.net.Scale(model.net.AveragedLoss(sq, "loss"), "ls", scale=loss_scale)]


def update(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for p in model.GetParams():
        model.WeightedSum([p, one, model.param_to_grad[p], lr], p)


def build(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> tuple[Any, list[float]]:
    monkeypatch.setattr(data_parallel_model, "_DEFAULT_TIMEOUT_SEC", 2)
    scales: list[float] = []
    model = model_helper.ModelHelper(name="multihost")
    data_parallel_model.Parallelize_CPU(
        model, input_builder_fun=lambda m: None,
        forward_pass_builder_fun=lambda m, s: scales.append(s) or forward(m, s),
        param_update_builder_fun=update, devices=[1, 2, 3], rendezvous=rendezvous(),
        barrier_net_timeout_sec=5, **kwargs)
    return model, scales


def _timeout(op: Any) -> int:
    return next(a.i for a in op.arg if a.name == "timeout_ms")


def test_loss_scale_and_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    model, scales = build(monkeypatch)
    assert scales == [pytest.approx(1 / 6)] * 3
    loss_scales = [a.f for op in model.net.Proto().op
                   if op.type == "Scale" and op.output[0].endswith("/ls")
                   for a in op.arg if a.name == "scale"]
    assert loss_scales == [pytest.approx(1 / 6)] * 3
    assert model.net.Proto().num_workers == 3 * 4 + 8


def test_gloo_allreduce_per_gradient_reverse_order(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = build(monkeypatch)
    allreduces = [op for op in model.net.Proto().op if op.type == "Allreduce"]
    assert [list(op.input)[1:] for op in allreduces] == [
        [f"cpu_{d}/{grad}" for d in (1, 2, 3)] for grad in reversed(GRADS)]
    for op in allreduces:
        assert list(op.output) == list(op.input)[1:]
        assert op.engine == "GLOO"
        assert op.input[0].startswith("allreduce_")
    worlds = [op for op in model.param_init_net.Proto().op
              if op.type in ("CreateCommonWorld", "CloneCommonWorld")
              and op.output[0].startswith("allreduce_")]
    assert worlds and worlds[0].type == "CreateCommonWorld"
    assert _timeout(worlds[0]) == 2000  # _DEFAULT_TIMEOUT_SEC, read when building
    args = {a.name: a.i for a in worlds[0].arg}
    assert args["size"] == 2 and args["rank"] == 0
    assert list(worlds[0].input) == ["store_handler"]


def test_gloo_param_sync_broadcasts(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = build(monkeypatch)
    bcasts = [op for op in model.param_init_net.Proto().op if op.type == "Broadcast"]
    names = [op.input[1].split("/", 1)[1] for op in bcasts]
    assert names == sorted(names) and {"fc_w", "fc_b"} <= set(names)
    for op, name in zip(bcasts, names):
        assert list(op.input)[1:] == [f"cpu_{d}/{name}" for d in (1, 2, 3)]
        assert list(op.output) == list(op.input)[1:]
        assert op.engine == "GLOO"


def test_barrier_nets_prepended(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = build(monkeypatch)
    init_nets = model._data_parallel_model_init_nets
    nets = model._data_parallel_model_nets
    assert len(init_nets) == 2 and init_nets[1] is model.param_init_net
    assert len(nets) == 2 and nets[1] is model.net
    cw = [op for op in init_nets[0].Proto().op if op.type == "CreateCommonWorld"]
    assert len(cw) == 1 and _timeout(cw[0]) == 5000
    barrier = [op for op in nets[0].Proto().op if op.type == "Barrier"]
    assert len(barrier) == 1 and list(barrier[0].input) == [cw[0].output[0]]
    assert list(barrier[0].output) == [] and barrier[0].engine == "GLOO"
