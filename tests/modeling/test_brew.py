"""brew: dispatch, arg_scope, registration, helper params/ops and misuse errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpgraph import brew, core, workspace
from dpgraph.errors import HelperError, ModelConfigError, ModelStateError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.model_helper import ModelHelper
from dpgraph.modeling.parameter_info import ParameterTags
from dpgraph.proto import caffe2_pb2


def myhelper(model: Any, val: int = -1) -> int:
    return val


def myhelper2(model: Any, val: int = -1) -> int:
    return val


if not brew.has_helper(myhelper):
    brew.Register(myhelper)
if not brew.has_helper(myhelper2):
    brew.Register(myhelper2)


@pytest.fixture(autouse=True)
def _fresh_workspace() -> None:
    workspace.ResetWorkspace()


def _args(op: caffe2_pb2.OperatorDef) -> dict[str, Any]:
    return arguments_dict(op.arg)


def test_arg_scope_single_and_list() -> None:
    model = ModelHelper(name="scopes")
    with brew.arg_scope([myhelper], val=15):
        assert brew.myhelper(model) == 15
    with brew.arg_scope([myhelper, myhelper2], val=15):
        assert [brew.myhelper(model), brew.myhelper2(model)] == [15, 15]
    assert brew.myhelper(model) == -1


def test_arg_scope_nested_and_explicit_wins() -> None:
    model = ModelHelper(name="nested")
    with brew.arg_scope([myhelper], val=-3), brew.arg_scope([myhelper], val=-2):
        with brew.arg_scope([myhelper], val=16):
            assert brew.myhelper(model) == 16
            assert brew.myhelper(model, val=7) == 7
        assert brew.myhelper(model) == -2
    assert brew.myhelper(model, val=15) == 15
    with pytest.raises(RuntimeError), brew.arg_scope([myhelper], val=1):
        raise RuntimeError("scope must be restored")
    assert brew.myhelper(model) == -1


def test_register_twice_and_has_helper() -> None:
    with pytest.raises(AttributeError):
        brew.Register(myhelper)
    with pytest.raises(HelperError):
        brew.Register(myhelper)
    assert brew.has_helper(brew.conv) and brew.has_helper("conv")

    def myhelper3() -> None:
        pass

    assert not brew.has_helper(myhelper3)
    with pytest.raises(AttributeError, match="not registered"):
        brew.no_such_helper  # noqa: B018


def test_model_is_required() -> None:
    with pytest.raises(RuntimeError, match="ModelHelper"):
        brew.fc("data", "fc", 2, 3)
    with pytest.raises(ModelStateError):
        brew.myhelper(None)


def test_conv_output_shape_nchw() -> None:
    workspace.FeedBlob("x", np.random.rand(64, 3, 32, 32).astype(np.float32) - 0.5)
    model = ModelHelper(name="test_model")
    with brew.arg_scope(brew.conv, stride=2, pad=2, weight_init=("XavierFill", {}),
                        bias_init=("ConstantFill", {})):
        brew.conv(model=model, blob_in="x", blob_out="out", dim_in=3, dim_out=64, kernel=3)
    model.Validate()
    shapes, _ = workspace.InferShapesAndTypes([model.param_init_net, model.net],
                                              {"x": [64, 3, 32, 32]})
    assert list(shapes["out"]) == [64, 64, 17, 17]
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("out").shape == (64, 64, 17, 17)
    conv = model.net.Proto().op[0]
    assert conv.engine == "CUDNN"
    assert _args(conv) == {"kernel": 3, "order": "NCHW", "stride": 2, "pad": 2,
                           "exhaustive_search": 0}


def test_conv_output_shape_nhwc_rect_kernel() -> None:
    workspace.FeedBlob("x", np.random.rand(64, 32, 32, 3).astype(np.float32) - 0.5)
    model = ModelHelper(name="test_model", arg_scope={"order": "NHWC"})
    with brew.arg_scope(brew.conv, stride=2, pad=2, weight_init=("XavierFill", {}),
                        bias_init=("ConstantFill", {})):
        brew.conv(model=model, blob_in="x", blob_out="out", dim_in=3, dim_out=64,
                  kernel=[8, 3])
    model.Validate()
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("out").shape == (64, 15, 17, 64)
    assert workspace.FetchBlob("out_w").shape == (64, 8, 3, 3)
    args = _args(model.net.Proto().op[0])
    assert (args["kernel_h"], args["kernel_w"], args["order"]) == (8, 3, "NHWC")


def test_fc_params_in_name_scope() -> None:
    model = ModelHelper(name="fc_scope")
    with core.NameScope("gpu_0"):
        out = brew.fc(model, "data", "fc6", dim_in=5, dim_out=7)
    assert str(out) == "gpu_0/fc6"
    assert [str(p) for p in model.params] == ["gpu_0/fc6_w", "gpu_0/fc6_b"]
    assert model.weights == ["gpu_0/fc6_w"] and model.biases == ["gpu_0/fc6_b"]
    assert model.get_param_info(model.params[0]).shape == [7, 5]
    assert model.get_param_info(model.params[1]).shape == [7]
    init = model.param_init_net.Proto().op
    assert [(o.type, o.output[0]) for o in init] == [
        ("XavierFill", "gpu_0/fc6_w"), ("ConstantFill", "gpu_0/fc6_b")]
    fc = model.net.Proto().op[0]
    assert list(fc.input) == ["gpu_0/data", "gpu_0/fc6_w", "gpu_0/fc6_b"]
    # unconsumed arg_scope keys become op arguments, as in Caffe2
    assert _args(fc) == {"order": "NCHW", "use_cudnn": 1, "cudnn_exhaustive_search": 0}
    auto = brew.fc(model, "data", None, 2, 2)
    assert str(auto).startswith(model.net.Name() + "_blob_")


def test_fc_options_and_external_init() -> None:
    model = ModelHelper(name="fc_opts", init_params=False)
    brew.fc(model, "x", "f", 2, 3, enable_tensor_core=True, float16_compute=True,
            freeze_bias=1)
    assert len(model.param_init_net.Proto().op) == 0
    assert model.params == ["f_w"] and model._computed_params == ["f_b"]
    op = model.net.Proto().op[0]
    assert op.engine == "TENSORCORE" and _args(op)["float16_compute"] == 1
    packed = ModelHelper(name="packed")
    brew.packed_fc(packed, "x", "p", 2, 3)
    assert packed.net.Proto().op[0].type == "PackedFC"


def test_spatial_bn_params_and_outputs() -> None:
    model = ModelHelper(name="bn")
    out = brew.spatial_bn(model, "x", "bn", 4, epsilon=1e-3, is_test=False)
    assert str(out) == "bn"
    assert [str(p) for p in model.params] == ["bn_s", "bn_b"]
    assert [str(p) for p in model._computed_params] == ["bn_rm", "bn_riv"]
    values = [_args(op)["value"] for op in model.param_init_net.Proto().op]
    assert values == [1.0, 0.0, 0.0, 1.0]
    op = model.net.Proto().op[0]
    assert list(op.output) == ["bn", "bn_rm", "bn_riv", "bn_sm", "bn_siv"]
    test_model = ModelHelper(name="bn_test")
    brew.spatial_bn(test_model, "x", "bn", 4, is_test=True)
    assert list(test_model.net.Proto().op[0].output) == ["bn"]


def test_norm_helpers() -> None:
    model = ModelHelper(name="norms")
    brew.spatial_gn(model, "x", "gn", 8, group=2)
    gn = model.net.Proto().op[0]
    assert gn.type == "GroupNorm" and list(gn.output) == ["gn", "gn_mean", "gn_std"]
    assert "order" not in _args(gn) or _args(gn)["order"] == "NCHW"
    normed, mean, std = brew.layer_norm(model, "y", "ln", 6)
    assert (str(normed), str(mean), str(std)) == ("ln", "ln_mean", "ln_std")
    assert [str(p) for p in model.weights] == ["gn_s", "ln_scale"]
    brew.instance_norm(model, "z", "in", 3)
    assert list(model.net.Proto().op[-1].output) == ["in", "in_sm", "in_siv"]


def test_prelu_elementwise_linear_and_transpose() -> None:
    model = ModelHelper(name="misc")
    brew.prelu(model, "x", "pr", num_channels=3)
    assert model.params == ["pr_slope"]
    assert _args(model.param_init_net.Proto().op[0]) == {"shape": [3], "value": 0.25}
    brew.elementwise_linear(model, "x", "el", 4)
    assert model.weights == ["el_w"] and model.biases == ["el_b"]
    brew.conv_transpose(model, "x", "ct", 4, 2, 3)
    assert model.param_init_net.Proto().op[-2].output[0] == "ct_w"
    assert _args(model.param_init_net.Proto().op[-2])["shape"] == [4, 2, 3, 3]
    brew.group_conv(model, "x", "gc", 4, 8, 3, group=2)
    assert _args(model.net.Proto().op[-1])["group"] == 2
    assert model.get_param_info(core.BlobReference("gc_w")).shape == [8, 2, 3, 3]


def test_dropout_relu_tanh_numerics() -> None:
    model = ModelHelper(name="act")
    workspace.FeedBlob("x", np.full((200, 100), 0.8, np.float32))
    workspace.FeedBlob("y", (np.random.rand(200, 100) - 0.5).astype(np.float32))
    workspace.FeedBlob("h", np.full((10, 10), 0.5, np.float32))
    brew.dropout(model, "x", "xd", ratio=0.5, is_test=False)
    brew.relu(model, "y", "yr")
    brew.tanh(model, "h", "ht")
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert abs(workspace.FetchBlob("xd").mean() - 0.8) < 0.05
    yr = workspace.FetchBlob("yr")
    assert yr.min() == 0 and np.allclose(yr, np.maximum(workspace.FetchBlob("y"), 0))
    np.testing.assert_almost_equal(workspace.FetchBlob("ht").mean(), np.tanh(0.5), decimal=5)
    with pytest.raises(ModelConfigError, match="is_test"):
        brew.dropout(model, "x", "xd2")


def test_pool_concat_sum_iter_accuracy_weight_decay() -> None:
    model = ModelHelper(name="misc2")
    brew.max_pool(model, "x", "mp", kernel=2, stride=2)
    brew.average_pool(model, "x", "ap", kernel=2)
    brew.concat(model, ["mp", "ap"], "cat", axis=1)
    brew.sum(model, ["a", "b"], "s")
    brew.iter(model, "ITER")
    brew.accuracy(model, ["pred", "label"], "acc")
    types = [op.type for op in model.net.Proto().op]
    assert types == ["MaxPool", "AveragePool", "Concat", "Sum", "Iter", "Accuracy"]
    concat = model.net.Proto().op[2]
    assert list(concat.output) == ["cat", "_cat_concat_dims"] and "order" not in _args(concat)
    assert list(model.net.Proto().op[5].input) == ["pred", "label"]
    assert _args(model.net.Proto().op[5]) == {}
    wd_model = ModelHelper(name="wd")
    loss = wd_model.AveragedLoss(brew.fc(wd_model, "d", "f", 2, 1), "loss")
    wd_model.AddGradientOperators([loss])
    brew.add_weight_decay(wd_model, 0.0)
    assert len(wd_model.param_init_net.Proto().op) == 2
    brew.add_weight_decay(wd_model, 1e-4)
    assert [o.output[0] for o in wd_model.param_init_net.Proto().op[2:]] == ["wd", "ONE"]
    last = wd_model.net.Proto().op[-1]
    assert (last.type, list(last.input)) == ("WeightedSum", ["f_w_grad", "ONE", "f_w", "wd"])


def test_helper_misuse_raises_typed_errors() -> None:
    model = ModelHelper(name="misuse")
    with pytest.raises(ModelConfigError, match="dim_in"):
        brew.fc(model, "x", "f", 0, 3)
    with pytest.raises(ModelConfigError, match="dim_out"):
        brew.fc(model, "x", "f", 2, 2.5)
    with pytest.raises(ModelConfigError, match="order"):
        brew.conv(model, "x", "c", 3, 4, 3, order="NCWH")
    with pytest.raises(ModelConfigError, match="divisible"):
        brew.conv(model, "x", "c", 3, 4, 3, group=2)
    with pytest.raises(ModelConfigError, match="2D kernel"):
        brew.conv(model, "x", "c", 3, 4, [3, 3, 3])
    with pytest.raises(ValueError, match="engine"):
        brew.conv(model, "x", "c", 3, 4, 3, engine="NNPACK")
    brew.fc(model, "x", "dup", 2, 3)
    with pytest.raises(ModelConfigError, match="dup_w"):
        brew.fc(model, "x", "dup", 4, 3)
    assert model.params == ["dup_w", "dup_b"]


def test_tags_normalised() -> None:
    model = ModelHelper(name="tags")
    brew.fc(model, "x", "f", 2, 3)
    assert model.get_param_info(core.BlobReference("f_w")).name == "f_w"
    assert ParameterTags.WEIGHT == "WEIGHT"
