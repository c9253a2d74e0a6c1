"""convnet_benchmarks (modeling/zoo/convnet_benchmarks.py): Caffe2's blob and parameter
names and shapes of the benchmark models, and the Benchmark driver on CPU."""

from __future__ import annotations

import numpy as np
import pytest
from _workspace import clean_runtime  # noqa: F401

from dpgraph import convnet_benchmarks as cb
from dpgraph import workspace


def _args(extra: str = ""):
    return cb.GetArgumentParser().parse_args(
        ("--batch_size 2 --iterations 1 --warmup_iterations 0 --cpu " + extra).split())


def _param_shapes(model) -> dict[str, list[int]]:
    shapes = {}
    for op in model.param_init_net.Proto().op:
        for arg in op.arg:
            if arg.name == "shape":
                shapes[op.output[0]] = list(arg.ints)
    return shapes


@pytest.mark.parametrize("builder,size,expected", [
    (cb.AlexNet, 224, {"conv1_w": [64, 3, 11, 11], "conv5_b": [256],
                       "fc6_w": [4096, 9216], "fc8_w": [1000, 4096]}),
    (cb.OverFeat, 231, {"conv1_w": [96, 3, 11, 11], "fc6_w": [3072, 36864]}),
    (cb.VGGA, 231, {"conv8_w": [512, 512, 3, 3], "fcix_w": [4096, 25088],
                    "fcxi_b": [1000]}),
    (cb.Inception, 224, {"inc3:conv1_w": [64, 192, 1, 1], "inc11:pool_proj_w": [128, 832, 1, 1],
                         "inc5:conv5_w": [48, 16, 5, 5], "fc_w": [1000, 1024]}),
])
def test_model_names_and_parameter_shapes(builder, size, expected) -> None:
    model, input_size = builder("NCHW", None)
    assert input_size == size
    shapes = _param_shapes(model)
    for name, shape in expected.items():
        assert shapes[name] == shape, name
    outputs = [list(op.output) for op in model.net.Proto().op]
    assert outputs[-3:] == [["pred"], ["xent"], ["loss"]]
    relus = [op for op in model.net.Proto().op if op.type == "Relu"]
    assert all(op.input[0] == op.output[0] for op in relus)  # in place, as Caffe2
    assert model.arg_scope["cudnn_exhaustive_search"] is True


def test_cudnn_ws_goes_into_the_arg_scope() -> None:
    model, _ = cb.AlexNet("NHWC", 1 << 20)
    assert model.arg_scope["ws_nbytes_limit"] == 1 << 20
    assert model.arg_scope["order"] == "NHWC"


def test_mlp_benchmark_forward_backward_updates_params() -> None:
    args = _args("--model MLP")
    assert (args.net_type, args.num_workers, args.forward_only) == ("dag", 2, False)
    timings = cb.Benchmark(cb.MLP, args)
    assert len(timings) >= 1 and timings[0] > 0
    assert workspace.FetchBlob("data").shape == (2, 256)
    assert np.isfinite(workspace.FetchBlob("loss"))
    assert workspace.FetchBlob("iter")[0] == 1
    assert workspace.HasBlob("fc_1_0_w_grad") and workspace.HasBlob("LR")


def test_inception_forward_only_runs_to_a_distribution() -> None:
    args = _args("--forward_only")
    args.batch_size = 1
    cb.Benchmark(cb.Inception, args)
    pred = workspace.FetchBlob("pred")
    assert pred.shape == (1, 1000)
    np.testing.assert_allclose(pred.sum(), 1.0, rtol=1e-4)
    assert not workspace.HasBlob("conv1_w_grad")


def test_dump_model_writes_pbtxt(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cb.Benchmark(cb.MLP, _args("--model MLP --forward_only --dump_model"))
    assert (tmp_path / "MLP_init_batch_2.pbtxt").read_text().count("op {") > 0
    assert "LabelCrossEntropy" in (tmp_path / "MLP.pbtxt").read_text()
