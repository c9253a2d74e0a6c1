"""Journey 1: a user Parallelizes a small model and unit-tests the graph structure with
``dpgraph.testing``, the text format, the verifier and the Graphviz drawing."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import pytest
from _journey_models import forward, parallelize, train

from dpgraph import data_parallel_model, memonger, model_helper, workspace
from dpgraph.errors import MissingDependencyError
from dpgraph.export import render, to_dot
from dpgraph.ir import format_net, parse_net, verify, verify_problems
from dpgraph.proto import caffe2_pb2
from dpgraph.testing import (
    UPDATE_ENV,
    assert_matches_snapshot,
    assert_nets_equal,
    collectives,
    count_ops,
    op_types,
    ops_by_device,
)

CONFIGS = [
    dict(cpu=cpu, use_nccl=nccl, shared_model=shared, bn=bn, combine_spatial_bn=combine)
    for cpu, nccl, shared, bn, combine in itertools.product(*[(False, True)] * 5)
    if not (cpu and nccl) and not (shared and not cpu) and not (combine and not bn)
]
RENDEZVOUS = dict(kv_handler="store_handler", shard_id=0, num_shards=2, engine="GLOO",
                  transport="tcp", interface="", mpi_rendezvous=False)


def _proto(net: Any) -> caffe2_pb2.NetDef:
    return net.Proto() if hasattr(net, "Proto") else net


def assert_round_trip_and_valid(net: Any, known: tuple[str, ...] = ()) -> None:
    """What users rely on for every net dpgraph makes: a lossless text form, no verifier
    complaint and a drawing."""
    proto = _proto(net)
    text = format_net(proto)
    assert parse_net(text) == proto, f"text round trip of {proto.name!r} is lossy"
    assert format_net(parse_net(text)) == text
    assert verify_problems(proto, known) == []
    assert to_dot(proto).startswith("digraph")


def _id(config: dict[str, bool]) -> str:
    return "-".join(key for key, value in config.items() if value) or "gpu"


@pytest.mark.parametrize("config", CONFIGS, ids=_id)
def test_parallelized_nets_round_trip_verify_and_train(config: dict[str, bool]) -> None:
    options = dict(config)
    cpu, bn = options.pop("cpu"), options.pop("bn")
    model = parallelize([0, 1, 2, 3], cpu=cpu, bn=bn, **options)
    for net in (model.param_init_net, model.net):
        assert_round_trip_and_valid(net)
    train(model, 2, bn=bn)
    assert_round_trip_and_valid(model.net)      # unchanged by running it

    prefix = "cpu" if cpu else "gpu"
    by_device = ops_by_device(model.net)
    assert {f"{prefix}_{d}" for d in range(4)} <= set(by_device)
    params = len(model._grad_names)     # _param_names also holds computed params
    if options["use_nccl"]:
        assert count_ops(model.net, type="NCCLAllreduce") == params
        assert all(op.type.startswith("NCCL") for op in collectives(model.net))
    elif not cpu:
        assert count_ops(model.net, type="NCCLAllreduce") == 0
        assert {op.type for op in collectives(model.net)} == {"Sum"}
    if cpu:
        # CPU all-reduce: one Sum per gradient on cpu_0, a Copy back to each other device
        # unless the model is shared; computed params (BN statistics) are always broadcast.
        copies = (0 if options["shared_model"] else 3 * params)
        copies += 3 * len(model._computed_param_names)
        assert count_ops(model.net, type="Sum", device="cpu_0") >= params
        if not options["combine_spatial_bn"]:      # which also copies the combined stats
            assert count_ops(model.net, type="Copy") == copies
    if options["combine_spatial_bn"]:
        assert count_ops(model.net, type="ChannelStats") == 4


def test_cpu_all_reduce_structure_counts() -> None:
    model = parallelize([0, 1, 2, 3], cpu=True)
    types = op_types(model.net)
    assert types["Sum"] == 4 and types["Copy"] == 12 and types["MomentumSGDUpdate"] == 16
    assert count_ops(model.net, device="cpu_0") == len(ops_by_device(model.net)["cpu_0"])
    assert count_ops(model.net) == sum(map(len, ops_by_device(model.net).values()))
    assert collectives(model.net) == []      # CPU Sums are not named "dpm"


def test_assert_nets_equal_ignore_options() -> None:
    # Net names are unique per process ("a", "a_1", ...), as in Caffe2: ignore_names.
    gpus_01 = parallelize([0, 1], cpu=False, name="a").net.Proto()
    same = parallelize([0, 1], cpu=False, name="a").net.Proto()
    assert same.name != gpus_01.name
    with pytest.raises(AssertionError, match="nets differ"):
        assert_nets_equal(gpus_01, same)
    assert_nets_equal(gpus_01, same, ignore_names=True)
    gpus_23 = parallelize([2, 3], cpu=False, name="a").net.Proto()
    with pytest.raises(AssertionError, match=r"(?s)nets differ.*gpu_2/"):
        assert_nets_equal(gpus_01, gpus_23, ignore_names=True)
    assert_nets_equal(gpus_01, gpus_23, ignore_names=True, ignore_device_ids=True)

    renamed = caffe2_pb2.NetDef()
    renamed.CopyFrom(gpus_01)
    renamed.name = "b"
    renamed.op[0].name = "first"
    with pytest.raises(AssertionError, match=r'(?s)net "b".*"name": "first"'):
        assert_nets_equal(gpus_01, renamed)
    assert_nets_equal(gpus_01, renamed, ignore_names=True)

    reordered = caffe2_pb2.NetDef()
    reordered.CopyFrom(gpus_01)
    op = next(op for op in reordered.op if len(op.arg) > 1)
    arguments = list(op.arg)[::-1]
    del op.arg[:]
    op.arg.extend(arguments)
    with pytest.raises(AssertionError):
        assert_nets_equal(gpus_01, reordered)
    assert_nets_equal(gpus_01, reordered, ignore_arg_order=True)


def test_snapshots_written_compared_and_updated(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UPDATE_ENV, raising=False)
    snapshot = tmp_path / "snapshots" / "mlp_4dev.txt"
    model = parallelize([0, 1, 2, 3], cpu=True)
    assert_matches_snapshot(model.net, snapshot)                # first run writes it
    assert snapshot.read_text() == format_net(model.net)
    assert_matches_snapshot(model.net, snapshot)

    two = parallelize([0, 1], cpu=True)
    with pytest.raises(AssertionError, match=r"(?s)nets differ.*cpu_3/"):
        assert_matches_snapshot(two.net, snapshot)
    monkeypatch.setenv(UPDATE_ENV, "0")
    with pytest.raises(AssertionError):
        assert_matches_snapshot(two.net, snapshot)
    monkeypatch.setenv(UPDATE_ENV, "1")
    assert_matches_snapshot(two.net, snapshot)                  # rewritten
    monkeypatch.delenv(UPDATE_ENV)
    assert_matches_snapshot(two.net, snapshot)
    assert parse_net(snapshot.read_text()) == two.net.Proto()


def test_multihost_nets_round_trip_and_verify() -> None:
    model = parallelize([0, 1], cpu=True, rendezvous=RENDEZVOUS)
    nets = model._data_parallel_model_init_nets + model._data_parallel_model_nets
    names = [net.Proto().name for net in nets]      # unique per process: "..._3"
    assert names[0].startswith("barrier_init_net") and names[1] == model.param_init_net.Name()
    assert names[2].startswith("pre_training_barrier_net") and names[3] == model.net.Name()
    for net in nets:
        assert_round_trip_and_valid(net)
    assert {op.type for op in collectives(model.net)} == {"Allreduce"}


def test_memory_optimised_nets_round_trip_and_verify() -> None:
    for options in (dict(optimize_gradient_memory=True),
                    dict(dynamic_memory_management=True)):
        model = parallelize([0, 1], cpu=True, **options)
        assert_round_trip_and_valid(model.net)
        train(model, 1)
    model = parallelize([0, 1], cpu=True)
    grads = [str(model.param_to_grad[p]) for p in model.GetParams("cpu_0/")]
    losses = [str(loss) for loss in model._losses_by_gpu[0]]
    shared = memonger.share_grad_blobs(model.net, losses, grads, "cpu_0/",
                                       share_activations=True)
    assert any("__m" in blob for op in shared.op for blob in op.output)
    assert_round_trip_and_valid(shared)
    inputs = list(model.net.Proto().external_input)
    assert_round_trip_and_valid(memonger.optimize_inference_fast(model.net.Proto(), inputs))
    assert_round_trip_and_valid(memonger.release_blobs_when_used(model.net.Proto(), inputs))


@pytest.mark.parametrize("cpu", [True, False])
def test_bmuf_nets_round_trip_and_verify(cpu: bool) -> None:
    workspace.ResetWorkspace()
    if not cpu:
        workspace.SetVirtualGpus(2)
    model = model_helper.ModelHelper(name="bmuf")

    def update(m: Any) -> None:
        lr = m.net.LearningRate([m.Iter("ITER")], "LR", base_lr=-0.1, policy="fixed")
        one = m.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        for param in m.GetParams():
            m.WeightedSum([param, one, m.param_to_grad[param], lr], param)

    data_parallel_model.Parallelize_BMUF(model, lambda m: None, forward(False), update,
                                         devices=[0, 1], cpu_device=cpu)
    for net in (model.param_init_net, model.net, model._global_model_init_net,
                model._global_model_param_updates_net):
        assert_round_trip_and_valid(net)


def test_predictor_nets_round_trip_and_verify() -> None:
    model = parallelize([0, 1], cpu=True)
    train(model, 1)
    predict_net, params = data_parallel_model.ExtractPredictorNet(
        model, ["data"], ["softmax"], caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU))
    assert_round_trip_and_valid(predict_net)
    verify(predict_net, [str(p) for p in params])


def test_drawing_has_one_cluster_per_device(tmp_path: Path) -> None:
    model = parallelize([0, 1, 2], cpu=False, use_nccl=True)
    dot = to_dot(model.net)
    for device in ("gpu_0", "gpu_1", "gpu_2"):
        assert f'label="{device}"' in dot
    assert "NCCLAllreduce" in dot
    path = render(model.net, tmp_path / "net.dot")
    assert path.read_text() == dot
    assert "subgraph" not in to_dot(model.net, cluster_by_device=False)
    lines = dot.splitlines()
    nccl = next(line for line in lines if 'label="NCCLAllreduce"' in line)
    grad = next(line for line in lines if 'label="FCGradient"' in line)
    forward_fc = next(line for line in lines if 'label="FC"' in line)
    assert len({_fill(nccl), _fill(grad), _fill(forward_fc)}) == 3   # highlighted, grey, plain
    if shutil.which("dot") is None:
        with pytest.raises(MissingDependencyError, match="Graphviz"):
            render(model.net, tmp_path / "net.svg")


def _fill(line: str) -> str:
    return line.split("fillcolor=")[1].split(",")[0].split("]")[0]


@pytest.mark.parametrize("blob", ["->", '{"x', 'q"', "a b", ""])
def test_text_format_quotes_odd_blob_names_losslessly(blob: str) -> None:
    proto = caffe2_pb2.NetDef(external_input=[blob], external_output=[blob])
    proto.op.add(type="Relu", input=[blob], output=[blob])
    proto.op.add(type="Copy", input=[blob, "x"], output=["->", blob])
    assert parse_net(format_net(proto)) == proto


def test_snapshot_options_reach_the_comparison(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UPDATE_ENV, raising=False)
    snapshot = tmp_path / "gpu.txt"
    assert_matches_snapshot(parallelize([0, 1], cpu=False, name="s").net, snapshot)
    other = parallelize([2, 3], cpu=False, name="s").net    # net "s_1", gpu_2/gpu_3
    with pytest.raises(AssertionError):
        assert_matches_snapshot(other, snapshot, ignore_names=True)
    assert_matches_snapshot(other, snapshot, ignore_names=True, ignore_device_ids=True)
