"""The graph a multi-host Parallelize emits, built in one process (nothing runs, so no peer
is needed): op sequences of the GLOO and the other-engine paths, common worlds, control
inputs, barrier nets, blob syncs, computed params and BMUF (dpm-distributed-facts.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dpgraph import brew, data_parallel_model, model_helper, workspace
from dpgraph.errors import NotSupportedError
from dpgraph.proto import caffe2_pb2

GRADS = ["fc2_b_grad", "fc2_w_grad", "fc1_b_grad", "fc1_w_grad"]  # reverse param order
PARAMS = ["ITER", "ONE", "fc1_b", "fc1_w", "fc2_b", "fc2_w"]  # the initial sync, sorted


@pytest.fixture(autouse=True)
def _fresh_workspace(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(data_parallel_model, "_DEFAULT_TIMEOUT_SEC", 7)
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def rendezvous(**extra: Any) -> dict[str, Any]:
    return {"kv_handler": "store", "shard_id": 1, "num_shards": 2, "engine": "GLOO", **extra}


def mlp(model: Any, loss_scale: float) -> list[Any]:
    hidden = brew.relu(model, brew.fc(model, "data", "fc1", 6, 5), "relu1")
    out = brew.fc(model, hidden, "fc2", 5, 3)
    loss = model.net.AveragedLoss(model.net.SquaredL2Distance([out, "label"], "d"), "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def with_bn(model: Any, loss_scale: float) -> list[Any]:
    bn = brew.spatial_bn(model, "image", "bn", 2, epsilon=1e-5, momentum=0.9, is_test=False)
    out = brew.fc(model, model.net.Flatten(bn, "flat"), "fc", 18, 3)
    loss = model.net.AveragedLoss(model.net.SquaredL2Distance([out, "label"], "d"), "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def sgd(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        model.net.WeightedSum([param, one, model.param_to_grad[param], lr], param)


def build(gpu: bool = False, forward: Any = mlp, **kwargs: Any) -> Any:
    if gpu:
        workspace.SetVirtualGpus(2)
    kwargs.setdefault("rendezvous", rendezvous())
    model = model_helper.ModelHelper(name="multihost_graph")
    data_parallel_model.Parallelize(model, lambda m: None, forward,
                                    param_update_builder_fun=sgd, devices=[0, 1],
                                    cpu_device=not gpu, **kwargs)
    return model


def ops(net: Any, *types: str) -> list[Any]:
    return [op for op in net.Proto().op if not types or op.type in types]


def arg(op: Any, name: str) -> Any:
    found = [a for a in op.arg if a.name == name]
    assert found, f"{op.type} has no argument {name}"
    return found[0].i if found[0].HasField("i") else found[0].s.decode()


def worlds(net: Any, prefix: str) -> list[tuple[str, list[str], str]]:
    return [(op.type, list(op.input), op.output[0]) for op in ops(net)
            if op.type in ("CreateCommonWorld", "CloneCommonWorld")
            and op.output[0].startswith(prefix)]


def test_loss_scale_workers_and_common_worlds() -> None:
    model = build(max_concurrent_distributed_ops=3)
    scale = ops(model.net, "Scale")[0]
    assert [a.f for a in scale.arg if a.name == "scale"] == [0.25]  # 1 / (2 devices * 2)
    assert model.net.Proto().num_workers == 2 * 4 + 8
    assert worlds(model.param_init_net, "allreduce_") == [
        ("CreateCommonWorld", ["store"], "allreduce_0_cw"),
        ("CloneCommonWorld", ["allreduce_0_cw"], "allreduce_1_cw"),
        ("CloneCommonWorld", ["allreduce_0_cw"], "allreduce_2_cw")]
    create = ops(model.param_init_net, "CreateCommonWorld")[0]
    assert (arg(create, "size"), arg(create, "rank"), arg(create, "timeout_ms")) == (2, 1, 7000)
    assert create.engine == "GLOO" and arg(create, "transport") == "tcp"


def test_gloo_allreduce_one_op_per_gradient_chained_per_world() -> None:
    model = build(max_concurrent_distributed_ops=3)
    reduces = ops(model.net, "Allreduce")
    assert [op.name for op in reduces] == GRADS
    assert [op.input[0] for op in reduces] == [
        "allreduce_0_cw", "allreduce_1_cw", "allreduce_2_cw", "allreduce_0_cw"]
    for op, grad in zip(reduces, GRADS):
        assert list(op.input)[1:] == list(op.output) == [f"cpu_0/{grad}", f"cpu_1/{grad}"]
        assert op.engine == "GLOO" and arg(op, "gpu_direct") == 0
        assert op.device_option.device_id == 0
    assert [list(op.control_input) for op in reduces] == [[], [], [], [f"cpu_0/{GRADS[0]}"]]
    assert not ops(model.net, "Sum", "Copy")  # no single-host path


def test_ibverbs_asks_for_gpu_direct() -> None:
    model = build(rendezvous=rendezvous(transport="ibverbs"))
    assert {arg(op, "gpu_direct") for op in ops(model.net, "Allreduce")} == {1}


def test_gloo_param_sync_is_one_broadcast_per_param_on_one_world() -> None:
    model = build()
    casts = ops(model.param_init_net, "Broadcast")
    assert [op.name for op in casts] == PARAMS
    assert {op.input[0] for op in casts} == {"broadcast_0_cw"}
    for prev, op in zip([None, *casts], casts):
        assert list(op.input)[1:] == list(op.output) == [f"cpu_0/{op.name}", f"cpu_1/{op.name}"]
        assert list(op.control_input) == ([] if prev is None else list(prev.output))
    assert worlds(model.param_init_net, "broadcast_") == [
        ("CloneCommonWorld", ["allreduce_0_cw"], "broadcast_0_cw")]  # same timeout: a clone
    assert not ops(model.param_init_net, "Copy")


def test_other_engine_stages_one_copy_per_host() -> None:
    model = build(gpu=True, use_nccl=True, rendezvous=rendezvous(engine="NCCL"))
    grad = GRADS[0]
    master, red = f"gpu_0/{grad}", f"gpu_0/{grad}_red"
    seq = [(op.type, list(op.input), list(op.output)) for op in ops(model.net)]
    start = seq.index(("ConstantFill", [master], [red]))
    assert seq[start:start + 6] == [
        ("ConstantFill", [master], [red]),
        ("NCCLAllreduce", [master, f"gpu_1/{grad}"], [master, f"gpu_1/{grad}"]),
        ("Copy", [master], [red]),
        ("Allreduce", ["allreduce_0_cw", red], [red]),
        ("Copy", [red], [master]),
        ("NCCLBroadcast", [master, f"gpu_1/{grad}"], [master, f"gpu_1/{grad}"])]
    nccl = ops(model.net, "NCCLAllreduce")
    assert [list(op.control_input) for op in nccl] == [[]] + [
        [f"gpu_0/{g}"] for g in GRADS[:-1]]
    assert {op.engine for op in ops(model.net, "Allreduce")} == {"NCCL"}
    assert ops(model.param_init_net, "CreateCommonWorld")[0].engine == "NCCL"
    assert model._data_parallel_model_nets == [model.net]  # no barrier without GLOO


def test_other_engine_param_sync_goes_through_a_cpu_copy() -> None:
    model = build(gpu=True, rendezvous=rendezvous(engine="NCCL"))
    seq = [(op.type, list(op.input), list(op.output), op.device_option.device_type)
           for op in ops(model.param_init_net)
           if op.type in ("CopyGPUToCPU", "Broadcast", "CopyCPUToGPU", "Copy")]
    gpu, cpu = caffe2_pb2.CUDA, caffe2_pb2.CPU
    start = seq.index(("CopyGPUToCPU", ["gpu_0/fc1_b"], ["gpu_0/fc1_bcpu"], gpu))
    assert seq[start:start + 4] == [
        ("CopyGPUToCPU", ["gpu_0/fc1_b"], ["gpu_0/fc1_bcpu"], gpu),
        ("Broadcast", ["broadcast_0_cw", "gpu_0/fc1_bcpu"], ["gpu_0/fc1_bcpu"], cpu),
        ("CopyCPUToGPU", ["gpu_0/fc1_bcpu"], ["gpu_0/fc1_b"], gpu),
        ("Copy", ["gpu_0/fc1_b"], ["gpu_1/fc1_b"], gpu)]
    # the iteration counter lives on the CPU: plain copies
    assert seq[:2] == [("Copy", ["gpu_0/ITER"], ["gpu_0/ITERcpu"], cpu),
                       ("Broadcast", ["broadcast_0_cw", "gpu_0/ITERcpu"], ["gpu_0/ITERcpu"],
                        cpu)]


def test_barrier_nets_come_first() -> None:
    model = build(barrier_net_timeout_sec=11)
    init_nets, nets = model._data_parallel_model_init_nets, model._data_parallel_model_nets
    assert init_nets == [model._barrier_init_net, model.param_init_net]
    assert nets == [model._barrier_net, model.net]
    assert worlds(model._barrier_init_net, "") == [
        ("CreateCommonWorld", ["store"], "pre_training_barrier_cw")]
    assert arg(ops(model._barrier_init_net)[0], "timeout_ms") == 11000
    (barrier,) = ops(model._barrier_net)
    assert (barrier.type, list(barrier.input), list(barrier.output), barrier.engine) == (
        "Barrier", ["pre_training_barrier_cw"], [], "GLOO")


def test_add_distributed_blob_sync_is_one_allreduce_across_hosts() -> None:
    model = build()
    data_parallel_model.AddDistributedBlobSync(model, ["cpu_0/x"])
    last = ops(model.net)[-1]
    assert (last.type, list(last.input), list(last.output)) == (
        "Allreduce", ["cpu_0/x_cw", "cpu_0/x"], ["cpu_0/x"])
    assert worlds(model.param_init_net, "cpu_0/x_cw") == [
        ("CloneCommonWorld", ["allreduce_0_cw"], "cpu_0/x_cw")]


def test_computed_params_are_broadcast_across_hosts() -> None:
    model = build(forward=with_bn)
    casts = ops(model.net, "Broadcast")
    assert [op.name for op in casts] == ["bn_rm", "bn_riv"]
    assert {op.input[0] for op in casts} == {"broadcast_computed_0_cw", "broadcast_computed_1_cw"}
    first_allreduce = ops(model.net).index(ops(model.net, "Allreduce")[0])
    assert all(ops(model.net).index(op) < first_allreduce for op in casts)


def test_sparse_gradients_are_refused_across_hosts() -> None:
    def sparse(model: Any, loss_scale: float) -> list[Any]:
        emb = model.param_init_net.XavierFill([], "emb", shape=[10, 4])
        model.params.append(emb)
        rows = model.net.Gather([emb, "indices"], "rows")
        loss = model.net.AveragedLoss(model.net.SquaredL2Distance([rows, "label"], "d"), "l")
        return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    model = model_helper.ModelHelper(name="sparse")
    with pytest.raises(NotSupportedError, match="sparse gradient"):
        data_parallel_model.Parallelize(model, lambda m: None, sparse,
                                        param_update_builder_fun=sgd, devices=[0, 1],
                                        cpu_device=True, rendezvous=rendezvous())
    assert not model.net.Proto().op  # transactional


def test_bmuf_all_reduces_params_over_devices_and_hosts() -> None:
    def local_sgd(model: Any) -> None:
        sgd(model)

    model = model_helper.ModelHelper(name="bmuf")
    data_parallel_model.Parallelize_CPU_BMUF(model, lambda m: None, mlp, local_sgd,
                                             devices=[0, 1], rendezvous=rendezvous())
    net = model._global_model_param_updates_net
    reduces = ops(net, "Allreduce")
    assert sorted(op.name for op in reduces) == ["fc1_b", "fc1_w", "fc2_b", "fc2_w"]
    for op in reduces:
        assert list(op.input)[1:] == [f"cpu_0/{op.name}", f"cpu_1/{op.name}"]
    first_scale = ops(net, "Scale")[0]
    assert [a.f for a in first_scale.arg if a.name == "scale"] == [0.25]  # 1 / (2 * 2)
    assert {op.name for op in ops(net, "Broadcast")} == {"fc1_b", "fc1_w", "fc2_b", "fc2_w"}
    assert model._data_parallel_model_nets[0] is model._barrier_net
