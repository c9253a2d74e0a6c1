"""Structural tests: the op sequences Parallelize emits."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from _parallel_helpers import build, manual_sgd, mlp_forward, ops_of, sparse_forward

from dpgraph import core, data_parallel_model, scope, workspace
from dpgraph.proto import caffe2_pb2

GRADS = ["fc1_w_grad", "fc1_b_grad", "fc2_w_grad", "fc2_b_grad"]


def _reduction_ops(model, first_grad_op: str = "dpm"):
    """Ops after the backward pass that touch gradients (Sum/Copy/NCCL)."""
    return [op for op in model.net.Proto().op
            if op.type in ("Sum", "Copy", "NCCLAllreduce", "NCCLBroadcast")
            and any(b.endswith("_grad") or "_grad_gpu" in b for b in op.output)]


def test_model_attributes_cpu() -> None:
    model = build(range(3))
    assert model._device_type == caffe2_pb2.CPU
    assert model._device_prefix == "cpu"
    assert model._devices == [0, 1, 2]
    assert model._shared_model is False
    assert isinstance(model._device_grouped_blobs, OrderedDict)
    assert list(model._device_grouped_blobs)[:4] == ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]
    assert model._device_grouped_blobs["fc1_w"] == {d: f"cpu_{d}/fc1_w" for d in range(3)}
    assert model._param_names == ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]
    assert model._computed_param_names == []
    assert model._grad_names == GRADS
    assert set(model._losses_by_gpu) == {0, 1, 2}
    assert [str(x) for x in model._losses_by_gpu[1]] == ["cpu_1/loss_scaled"]
    assert model._blob_to_device["cpu_2/fc1_w"].device_id == 2
    assert model._data_parallel_model_init_nets == [model.param_init_net]
    assert model._data_parallel_model_nets == [model.net]
    assert {"ITER", "ONE"} <= set(model._device_grouped_blobs)


def test_net_settings() -> None:
    model = build(range(3), net_type="simple", num_threads_per_device=2)
    proto = model.net.Proto()
    assert proto.type == "simple"
    assert proto.num_workers == 6
    assert [(a.name, a.i) for a in proto.arg] == [("first_iter_only_one_worker", 1)]
    assert build(range(2)).net.Proto().num_workers == 8


def test_cpu_sum_then_copy_broadcast_in_reverse_param_order() -> None:
    model = build(range(3))
    ops = _reduction_ops(model)
    expected = []
    for grad in reversed(GRADS):
        expected.append(("Sum", [f"cpu_{d}/{grad}" for d in range(3)], [f"cpu_0/{grad}"]))
        expected += [("Copy", [f"cpu_0/{grad}"], [f"cpu_{d}/{grad}"]) for d in (1, 2)]
    assert [(op.type, list(op.input), list(op.output)) for op in ops] == expected
    for op in ops:
        assert op.device_option.device_type == caffe2_pb2.CPU
        assert op.device_option.device_id == 0
        assert op.name == ""


def test_shared_model_has_no_broadcast_and_one_param_copy() -> None:
    model = build(range(3), shared_model=True)
    ops = _reduction_ops(model)
    assert [op.type for op in ops] == ["Sum"] * 4
    assert [str(p) for p in model.params] == [f"cpu_0/{n}" for n in
                                              ("fc1_w", "fc1_b", "fc2_w", "fc2_b")]
    init_outputs = {o for op in model.param_init_net.Proto().op for o in op.output}
    assert "cpu_0/fc1_w" in init_outputs and "cpu_1/fc1_w" not in init_outputs
    fc_inputs = [list(op.input) for op in model.net.Proto().op if op.type == "FC"]
    assert all(inputs[1] == "cpu_0/fc1_w" or inputs[1] == "cpu_0/fc2_w"
               for inputs in fc_inputs)
    updates = ops_of(model.net, "WeightedSum")
    assert {op.output[0] for op in updates} == {str(p) for p in model.params}


def _sum_pairs(model):
    return [[int(b.split("/")[0][4:]) for b in op.input]
            for op in ops_of(model.net, "Sum") if op.output[0].endswith("fc2_b_grad")]


@pytest.mark.parametrize("ndev,pairs", [
    (2, [[0, 1]]),
    (3, [[0, 1, 2]]),
    (4, [[0, 1], [2, 3], [0, 2]]),
    (8, [[0, 1], [2, 3], [4, 5], [6, 7], [0, 2], [4, 6], [0, 4]]),
    (16, [[2 * j, 2 * j + 1] for j in range(8)] + [[4 * j, 4 * j + 2] for j in range(4)]
     + [[0, 4], [8, 12], [0, 8]]),
])
def test_gpu_sum_trees(ndev: int, pairs) -> None:
    model = build(range(ndev), gpu=True)
    assert _sum_pairs(model) == pairs
    sums = [op for op in ops_of(model.net, "Sum") if op.output[0].endswith("fc2_b_grad")]
    for op, pair in zip(sums, pairs):
        assert op.name == "dpm"
        assert op.output[0] == op.input[0]
        assert op.device_option.device_type == caffe2_pb2.CUDA
        assert op.device_option.device_id == pair[0]
    copies = [op for op in ops_of(model.net, "Copy") if op.output[0].endswith("fc2_b_grad")]
    assert [(op.input[0], op.output[0], op.device_option.device_id) for op in copies] == [
        ("gpu_0/fc2_b_grad", f"gpu_{d}/fc2_b_grad", d) for d in range(1, ndev)]


def test_gpu_copy_inserted_without_peer_access() -> None:
    peer = np.ones((4, 4), dtype=bool)
    peer[0, 2] = peer[2, 0] = False
    workspace.SetVirtualGpus(4, peer_access=peer)
    model = build(range(4), gpu=True)
    grad = "fc2_b_grad"
    ops = [op for op in model.net.Proto().op
           if any(grad in b for b in list(op.input) + list(op.output))
           and op.type in ("Sum", "Copy")]
    got = [(op.type, list(op.input), list(op.output), op.device_option.device_id)
           for op in ops]
    assert got[:4] == [
        ("Sum", [f"gpu_0/{grad}", f"gpu_1/{grad}"], [f"gpu_0/{grad}"], 0),
        ("Sum", [f"gpu_2/{grad}", f"gpu_3/{grad}"], [f"gpu_2/{grad}"], 2),
        ("Copy", [f"gpu_2/{grad}"], [f"gpu_0/{grad}_gpu2_copy"], 0),
        ("Sum", [f"gpu_0/{grad}", f"gpu_0/{grad}_gpu2_copy"], [f"gpu_0/{grad}"], 0),
    ]


def test_nccl_ops() -> None:
    model = build(range(4), gpu=True, use_nccl=True)
    nccl = ops_of(model.net, "NCCLAllreduce")
    assert [op.output[0].split("/")[1] for op in nccl] == list(reversed(GRADS))
    for i, op in enumerate(nccl):
        name = op.input[0].split("/")[1]
        assert list(op.input) == list(op.output) == [f"gpu_{d}/{name}" for d in range(4)]
        assert op.device_option.device_id == 0
        assert list(op.control_input) == ([] if i == 0 else [nccl[i - 1].input[0]])
    assert not ops_of(model.net, "Sum")


def test_sparse_gradients_all_gathered_on_gpus() -> None:
    model = build(range(2), gpu=True, forward=sparse_forward)
    key = "indices:rows_grad"
    assert key in model._grad_names
    concat = ops_of(model.net, "Concat")
    assert [list(op.output) for op in concat] == [
        [f"gpu_0/{key}_index_concat", f"gpu_0/{key}_index_splitinfo"],
        [f"gpu_0/{key}_val_concat", f"gpu_0/{key}_val_splitinfo"],
    ]
    assert list(concat[0].input) == ["gpu_0/indices", "gpu_1/indices"]
    assert list(concat[1].input) == ["gpu_0/rows_grad", "gpu_1/rows_grad"]
    copies = [(op.input[0], op.output[0], op.device_option.device_id)
              for op in ops_of(model.net, "Copy") if "concat" in op.input[0]]
    assert copies == [
        (f"gpu_0/{key}_index_concat", "gpu_0/indices", 0),
        (f"gpu_0/{key}_index_concat", "gpu_1/indices", 1),
        (f"gpu_0/{key}_val_concat", "gpu_0/rows_grad", 0),
        (f"gpu_0/{key}_val_concat", "gpu_1/rows_grad", 1),
    ]


def test_shared_indices_concatenated_once() -> None:
    def two_gathers(model, loss_scale):
        from _parallel_helpers import EMB, OUT, VOCAB, _initializer

        from dpgraph import brew

        losses = []
        for tag in ("a", "b"):
            emb = model.create_param(f"emb_{tag}", [VOCAB, EMB], _initializer("XavierFill"))
            rows = model.net.Gather([emb, "indices"], f"rows_{tag}")
            out = brew.fc(model, rows, f"fc_{tag}", EMB, OUT)
            dist = model.net.SquaredL2Distance([out, "label"], f"dist_{tag}")
            losses.append(model.net.AveragedLoss(dist, f"loss_{tag}"))
        return losses

    model = build(range(2), gpu=True, forward=two_gathers)
    index_concats = [op for op in ops_of(model.net, "Concat") if "index" in op.output[0]]
    assert len(index_concats) == 1
    assert len([op for op in ops_of(model.net, "Concat") if "val" in op.output[0]]) == 2


def test_computed_params_broadcast_from_first_device() -> None:
    from _parallel_helpers import bn_forward

    model = build(range(3), forward=bn_forward)
    assert model._computed_param_names == ["bn_rm", "bn_riv"]
    copies = [(op.input[0], op.output[0]) for op in ops_of(model.net, "Copy")
              if op.input[0].endswith(("bn_rm", "bn_riv"))]
    assert copies == [(f"cpu_0/{n}", f"cpu_{d}/{n}") for n in ("bn_rm", "bn_riv")
                      for d in (1, 2)]
    model = build(range(3), forward=bn_forward, broadcast_computed_params=False)
    assert not [op for op in ops_of(model.net, "Copy") if op.input[0].endswith("bn_rm")]


def test_initial_param_sync_appended_to_init_net() -> None:
    model = build(range(3))
    ops = model.param_init_net.Proto().op
    first_copy = next(i for i, op in enumerate(ops) if op.type == "Copy")
    assert all(op.type == "Copy" for op in ops[first_copy:])
    synced = [(op.input[0], op.output[0]) for op in ops[first_copy:]]
    names = sorted({"fc1_w", "fc1_b", "fc2_w", "fc2_b", "ITER", "ONE"})
    assert synced == [(f"cpu_0/{n}", f"cpu_{d}/{n}") for n in names for d in (1, 2)]


def test_net_transformer_called_once() -> None:
    calls = []

    def transformer(model, ndev, prefix, device_type):
        calls.append((ndev, prefix, device_type, len(model.param_to_grad)))

    build(range(4), net_transformer_fun=transformer)
    assert calls == [(4, "cpu", caffe2_pb2.CPU, 16)]
    calls.clear()
    build(range(2), gpu=True, net_transformer_fun=transformer)
    assert calls == [(2, "gpu", caffe2_pb2.CUDA, 8)]


def test_builder_functions_called_per_device_in_scopes() -> None:
    seen = []

    def record(name):
        def fun(model, *args):
            seen.append((name, core.ScopedName("x"),
                         scope.CurrentDeviceScope().device_id if
                         scope.CurrentDeviceScope() else None))
            return mlp_forward(model, *args) if name == "fwd" else None
        return fun

    model = build([1, 2], forward=record("fwd"),
                  param_update_builder_fun=lambda m: (record("upd")(m), manual_sgd(m)),
                  post_sync_builder_fun=record("post"),
                  pre_grad_net_transformer_fun=lambda m: seen.append(("pre", None, None)))
    assert seen == [("fwd", "cpu_1/x", 1), ("fwd", "cpu_2/x", 2), ("pre", None, None),
                    ("upd", "cpu_1/x", 1), ("upd", "cpu_2/x", 2),
                    ("post", "cpu_1/x", 1), ("post", "cpu_2/x", 2)]
    assert model._devices == [1, 2]


def test_forward_only_model() -> None:
    model = build(range(2), update=None)
    assert not model.param_to_grad
    assert not ops_of(model.net, "Sum", "Copy")
    assert model._grad_names == []
    assert "cpu_1/fc1_w" in model._blob_to_device


def test_checkpoint_params() -> None:
    from dpgraph import brew

    def with_iter(model, loss_scale):
        return mlp_forward(model, loss_scale)

    model = build(range(2), update="sgd", forward=with_iter)
    params = {str(b) for b in data_parallel_model.GetCheckpointParams(model)}
    assert params == {"cpu_0/fc1_w", "cpu_0/fc1_b", "cpu_0/fc2_w", "cpu_0/fc2_b",
                      "optimizer_iteration"} | {b for b in params if b.startswith("cpu_0/ONE")}
    model = build(range(2))
    params = {str(b) for b in data_parallel_model.GetCheckpointParams(model)}
    assert params == {"cpu_0/" + n for n in ("fc1_w", "fc1_b", "fc2_w", "fc2_b", "ITER", "ONE")}
    del brew


def test_add_blob_sync() -> None:
    model = build(range(3))
    n_ops = len(model.net.Proto().op)
    data_parallel_model.AddBlobSync(model, ["extra"])
    new = model.net.Proto().op[n_ops:]
    assert [(op.type, op.input[0], op.output[0]) for op in new] == [
        ("Copy", "cpu_0/extra", "cpu_1/extra"), ("Copy", "cpu_0/extra", "cpu_2/extra")]
    assert model._device_grouped_blobs["extra"] == {d: f"cpu_{d}/extra" for d in range(3)}
    other = core.Net("other")
    data_parallel_model.AddBlobSync(model, ["more"], net=other)
    assert len(other.Proto().op) == 2
    with pytest.raises(AssertionError, match="unprefixed"):
        data_parallel_model.AddBlobSync(model, ["cpu_0/x"])


def test_learning_rate_blob_names() -> None:
    assert data_parallel_model.GetLearningRateBlobNames(build(range(2))) == [
        "cpu_0/LR", "cpu_1/LR"]
    names = data_parallel_model.GetLearningRateBlobNames(build(range(2), update="sgd"))
    assert len(names) == 1 and names[0].startswith("SgdOptimizer_") and \
        names[0].endswith("_lr_cpu")
    names = data_parallel_model.GetLearningRateBlobNames(
        build(range(2), gpu=True, update="sgd"))
    assert [n.split("_lr_")[1] for n in names] == ["gpu0", "gpu1"]


def test_convert_net_for_device() -> None:
    net = core.Net("convert_me")
    net.Relu("x", "y")
    converted = data_parallel_model.ConvertNetForDevice(
        net, core.DeviceOption(caffe2_pb2.CUDA, 3))
    op = converted.Proto().op[0]
    assert (list(op.input), list(op.output)) == (["gpu_3/x"], ["gpu_3/y"])
    assert op.device_option.device_id == 3
    assert list(converted.Proto().external_input) == ["gpu_3/x"]
    assert list(net.Proto().op[0].input) == ["x"]
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 1)):
        cpu = data_parallel_model.ConvertNetForDevice(net)
    assert cpu.Proto().op[0].input[0] == "cpu_1/x"
    rnn = core.Net("rnn")
    rnn.Proto().op.add(type="RecurrentNetwork", input=["a"], output=["b"])
    with pytest.raises(NotImplementedError, match="RecurrentNetwork"):
        data_parallel_model.ConvertNetForDevice(rnn, core.DeviceOption(caffe2_pb2.CPU, 0))


def test_strip_blob_name() -> None:
    assert data_parallel_model.stripBlobName("gpu_0/a/b") == "a/b"
    slice_ = core.GradientSlice(core.BlobReference("gpu_1/i"), core.BlobReference("gpu_1/v"))
    assert data_parallel_model.stripBlobName(slice_) == "i:v"


def test_module_constants_and_names() -> None:
    assert data_parallel_model._DEFAULT_TIMEOUT_SEC == 30
    assert data_parallel_model._DEFAULT_BARRIER_NET_TIMEOUT_SEC == 300
    import inspect

    params = inspect.signature(data_parallel_model.Parallelize).parameters
    assert list(params)[:9] == [
        "model_helper_obj", "input_builder_fun", "forward_pass_builder_fun",
        "param_update_builder_fun", "optimizer_builder_fun", "post_sync_builder_fun",
        "pre_grad_net_transformer_fun", "net_transformer_fun", "devices"]
    defaults = {k: v.default for k, v in params.items()}
    assert defaults["net_type"] == "dag" and defaults["max_concurrent_distributed_ops"] == 16
    assert defaults["num_threads_per_device"] == 4
    assert defaults["barrier_net_timeout_sec"] == 300
