"""Spec conformance: caffe2-api-facts §7 (brew and helpers), behaviour-facts §5 (brew_test)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dpgraph import brew, cnn, core, model_helper, workspace
from dpgraph.ir.arguments import arguments_dict
from dpgraph.modeling.parameter_info import ParameterTags
from dpgraph.proto import caffe2_pb2

ModelHelper = model_helper.ModelHelper


@pytest.fixture(autouse=True)
def _fresh_workspace() -> Iterator[None]:
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _ops(net: Any, op_type: str | None = None) -> list[caffe2_pb2.OperatorDef]:
    return [op for op in net.Proto().op if op_type is None or op.type == op_type]


def _init_op(model: ModelHelper, blob: str) -> caffe2_pb2.OperatorDef:
    found = [op for op in model.param_init_net.Proto().op if blob in op.output]
    assert len(found) == 1, f"{blob} initialised {len(found)} times"
    return found[0]


def _args(op: caffe2_pb2.OperatorDef) -> dict[str, Any]:
    return arguments_dict(op.arg)


# --- dispatch ----------------------------------------------------------------------------
def test_unknown_helper_is_attribute_error() -> None:
    with pytest.raises(AttributeError):
        brew.no_such_helper_xyz  # noqa: B018


def test_model_required_runtime_error() -> None:
    with pytest.raises(RuntimeError):
        brew.fc("x", "y", 2, 3)
    model = ModelHelper(name="m")
    out = brew.fc(model=model, blob_in="x", blob_out="y", dim_in=2, dim_out=3)
    assert str(out) == "y"


def test_registry_has_late_helpers() -> None:
    names = ["arg_scope", "fc", "packed_fc", "fc_decomp", "dropout", "max_pool",
             "average_pool", "max_pool_with_index", "lrn", "softmax", "instance_norm",
             "spatial_bn", "spatial_gn", "relu", "prelu", "tanh", "concat", "depth_concat",
             "sum", "reduce_sum", "sub", "arg_min", "transpose", "iter", "accuracy", "conv",
             "conv_nd", "conv_transpose", "group_conv", "group_conv_deprecated",
             "image_input", "video_input", "add_weight_decay", "elementwise_linear",
             "layer_norm", "mat_mul", "batch_mat_mul", "cond", "loop", "db_input",
             "fc_sparse", "fc_prune", "moments_with_running_stats"]
    missing = [n for n in names if not brew.has_helper(n)]
    assert missing == []


def test_model_helper_default_arg_scope() -> None:
    model = ModelHelper(name="m")
    assert model.arg_scope == {"order": "NCHW", "use_cudnn": True,
                               "cudnn_exhaustive_search": False}
    assert ModelHelper(arg_scope={"order": "NHWC"}).arg_scope["order"] == "NHWC"


def test_unconsumed_arg_scope_keys_become_op_arguments() -> None:
    model = ModelHelper(name="m")
    brew.fc(model, "x", "y", 2, 3)
    fc_args = _args(_ops(model.net, "FC")[0])
    assert fc_args["use_cudnn"] == 1
    assert fc_args["cudnn_exhaustive_search"] == 0
    assert fc_args["order"] == "NCHW"
    brew.relu(model, "y", "z")
    relu = _ops(model.net, "Relu")[0]
    assert relu.engine == "CUDNN"
    relu_args = _args(relu)
    assert relu_args["order"] == "NCHW"
    assert relu_args["cudnn_exhaustive_search"] == 0
    assert "use_cudnn" not in relu_args


def test_helper_without_kwargs_keeps_only_named_arg_scope_keys() -> None:
    def spec_helper_no_kwargs(model: Any, val: int = -1) -> int:
        return val

    if not brew.has_helper(spec_helper_no_kwargs):
        brew.Register(spec_helper_no_kwargs)
    model = ModelHelper(name="m", arg_scope={"val": 7, "order": "NHWC"})
    assert brew.spec_helper_no_kwargs(model) == 7
    with brew.arg_scope([spec_helper_no_kwargs], val=9):
        assert brew.spec_helper_no_kwargs(model) == 9
        assert brew.spec_helper_no_kwargs(model, val=11) == 11


def test_register_twice_attribute_error_and_has_helper() -> None:
    def spec_helper_twice(model: Any) -> None:
        return None

    if not brew.has_helper(spec_helper_twice):
        brew.Register(spec_helper_twice)
    with pytest.raises(AttributeError):
        brew.Register(spec_helper_twice)
    assert brew.has_helper(brew.conv)
    assert brew.has_helper("conv")

    def spec_helper_absent() -> None:
        return None

    assert not brew.has_helper(spec_helper_absent)


def test_arg_scope_nested_innermost_wins_and_kwarg_beats_scope() -> None:
    def spec_myhelper(model: Any, val: int = -1) -> int:
        return val

    def spec_myhelper2(model: Any, val: int = -1) -> int:
        return val

    for helper in (spec_myhelper, spec_myhelper2):
        if not brew.has_helper(helper):
            brew.Register(helper)
    model = ModelHelper(name="test_model")
    with brew.arg_scope([spec_myhelper, spec_myhelper2], val=15):
        assert [brew.spec_myhelper(model), brew.spec_myhelper2(model)] == [15, 15]
    with brew.arg_scope([spec_myhelper], val=-3), brew.arg_scope([spec_myhelper], val=-2):
        with brew.arg_scope([spec_myhelper], val=16):
            assert brew.spec_myhelper(model) == 16
        assert brew.spec_myhelper(model) == -2
    assert brew.spec_myhelper(model, val=15) == 15
    assert brew.spec_myhelper(model) == -1


# --- param naming ------------------------------------------------------------------------
def test_param_names_follow_name_scope() -> None:
    model = ModelHelper(name="m")
    with core.NameScope("gpu_0"):
        out = brew.fc(model, "data", "fc6", 4, 3)
    assert str(out) == "gpu_0/fc6"
    assert [str(p) for p in model.params] == ["gpu_0/fc6_w", "gpu_0/fc6_b"]
    assert list(_ops(model.net, "FC")[0].input) == ["gpu_0/data", "gpu_0/fc6_w", "gpu_0/fc6_b"]


def test_blob_out_none_uses_next_name() -> None:
    model = ModelHelper(name="netx")
    out = brew.fc(model, "data", None, 4, 3)
    assert str(out).startswith("netx_blob_")
    assert str(model.params[0]) == str(out) + "_w"


# --- fc ----------------------------------------------------------------------------------
def test_fc_params_shapes_tags_inits() -> None:
    model = ModelHelper(name="m")
    out = brew.fc(model, "x", "fc1", dim_in=5, dim_out=3)
    w, b = model.params
    assert (str(w), str(b)) == ("fc1_w", "fc1_b")
    assert model.weights == [w] and model.biases == [b]
    w_init, b_init = _init_op(model, "fc1_w"), _init_op(model, "fc1_b")
    assert w_init.type == "XavierFill" and list(_args(w_init)["shape"]) == [3, 5]
    assert b_init.type == "ConstantFill" and list(_args(b_init)["shape"]) == [3]
    fc = _ops(model.net, "FC")[0]
    assert list(fc.input) == ["x", "fc1_w", "fc1_b"] and list(fc.output) == [str(out)]
    info = model.get_param_info(w)
    assert info is not None and info.shape == [3, 5]


def test_fc_freeze_bias_tensor_core_fp16_and_external_init() -> None:
    model = ModelHelper(name="m")
    brew.fc(model, "x", "fc1", 2, 3, freeze_bias=True, enable_tensor_core=True,
            float16_compute=True)
    assert [str(p) for p in model.GetComputedParams()] == ["fc1_b"]
    assert [str(b) for b in model.biases] == ["fc1_b"]
    fc = _ops(model.net, "FC")[0]
    assert fc.engine == "TENSORCORE"
    args = _args(fc)
    assert args["float16_compute"] == 1 and args["freeze_bias"] == 1
    ext = ModelHelper(name="e", init_params=False)
    brew.fc(ext, "x", "fc1", 2, 3)
    assert len(ext.param_init_net.Proto().op) == 0
    assert [str(p) for p in ext.params] == ["fc1_w", "fc1_b"]


def test_fc_initializer_overrides() -> None:
    model = ModelHelper(name="m")
    brew.fc(model, "x", "fc1", 2, 3, weight_init=("GaussianFill", {"std": 0.1}),
            bias_init=("ConstantFill", {"value": 0.5}))
    w_init, b_init = _init_op(model, "fc1_w"), _init_op(model, "fc1_b")
    assert w_init.type == "GaussianFill" and _args(w_init)["std"] == pytest.approx(0.1)
    assert _args(b_init)["value"] == pytest.approx(0.5)


def test_packed_fc_and_fc_decomp() -> None:
    model = ModelHelper(name="m")
    brew.packed_fc(model, "x", "p", 4, 2)
    assert list(_ops(model.net, "PackedFC")[0].input) == ["x", "p_w", "p_b"]
    # FC_Decomp lives in Caffe2's experiments (not a registered op in standard builds): the
    # params are created, then the op call raises AttributeError as Caffe2's Net does.
    if core.IsOperator("FC_Decomp"):
        brew.fc_decomp(model, "x", "d", 4, 2)
        assert list(_ops(model.net, "FC_Decomp")[0].input) == ["x", "d_u", "d_v", "d_b"]
    else:
        with pytest.raises(AttributeError):
            brew.fc_decomp(model, "x", "d", 4, 2)
    assert list(_args(_init_op(model, "d_u"))["shape"]) == [2, 5]
    assert list(_args(_init_op(model, "d_v"))["shape"]) == [4, 5]
    assert list(_args(_init_op(model, "d_b"))["shape"]) == [2]


def test_fc_prune_and_fc_sparse_params() -> None:
    model = ModelHelper(name="m")
    try:
        brew.fc_prune(model, "x", "fp", 4, 2, threshold=0.5, comp_lb=0.1)
    except AttributeError:
        assert not core.IsOperator("FC_Prune")
    assert [str(p) for p in model.params] == ["fp_w", "fp_b"]
    assert list(_args(_init_op(model, "fp_m"))["shape"]) == [2, 4]
    assert _args(_init_op(model, "fp_m"))["value"] == pytest.approx(1.0)
    assert _args(_init_op(model, "fp_thres"))["value"] == pytest.approx(0.5)
    assert _args(_init_op(model, "fp_lb"))["value"] == pytest.approx(0.1)
    assert {"fp_ag_dw", "fp_mask_seq"} <= {
        o for op in model.param_init_net.Proto().op for o in op.output}
    sparse = ModelHelper(name="s")
    refs = [core.BlobReference(n) for n in ("w_csr", "iw", "jw", "bias")]
    try:
        brew.fc_sparse(sparse, "x", "fs", *refs)
    except AttributeError:
        assert not core.IsOperator("FC_Sparse")
    assert [str(p) for p in sparse.params] == ["w_csr", "iw", "jw", "bias"]


def test_moments_with_running_stats() -> None:
    model = ModelHelper(name="m")
    sm, sv = brew.moments_with_running_stats(model, "x", "mo", 3)
    assert (str(sm), str(sv)) == ("mo_sm", "mo_sv")
    assert [str(p) for p in model.GetComputedParams()] == ["mo_rm", "mo_riv"]
    assert _args(_init_op(model, "mo_riv"))["value"] == pytest.approx(1.0)
    op = _ops(model.net, "Moments")[0]
    assert list(_args(op)["axes"]) == [0, 2, 3] and _args(op)["keepdims"] == 0
    x = np.random.rand(2, 3, 4, 4).astype(np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    np.testing.assert_allclose(workspace.FetchBlob("mo_sm"), x.mean(axis=(0, 2, 3)),
                               rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("mo_sv"), x.var(axis=(0, 2, 3)),
                               rtol=1e-4)


# --- conv --------------------------------------------------------------------------------
def test_conv_weight_shapes_tags_and_op() -> None:
    model = ModelHelper(name="m", arg_scope={"use_cudnn": False})
    brew.conv(model, "x", "c1", dim_in=4, dim_out=6, kernel=3)
    brew.conv(model, "x", "c2", dim_in=4, dim_out=6, kernel=3, order="NHWC", group=2)
    assert list(_args(_init_op(model, "c1_w"))["shape"]) == [6, 4, 3, 3]
    assert _init_op(model, "c1_w").type == "XavierFill"
    assert _init_op(model, "c1_b").type == "ConstantFill"
    assert list(_args(_init_op(model, "c2_w"))["shape"]) == [6, 3, 3, 2]
    assert [str(w) for w in model.weights] == ["c1_w", "c2_w"]
    assert [str(b) for b in model.biases] == ["c1_b", "c2_b"]
    c1, c2 = _ops(model.net, "Conv")
    assert _args(c1)["kernel"] == 3 and _args(c1)["order"] == "NCHW"
    assert "group" not in _args(c1) and c1.engine == ""
    assert _args(c2)["group"] == 2 and _args(c2)["order"] == "NHWC"


def test_conv_cudnn_engine_and_no_bias() -> None:
    model = ModelHelper(name="m")
    brew.conv(model, "x", "c", 3, 4, kernel=3, ws_nbytes_limit=1024, no_bias=True)
    conv = _ops(model.net, "Conv")[0]
    assert conv.engine == "CUDNN"
    args = _args(conv)
    assert args["exhaustive_search"] == 0 and args["ws_nbytes_limit"] == 1024
    assert "no_bias" not in args and "use_cudnn" not in args
    assert list(conv.input) == ["x", "c_w"]
    assert [str(p) for p in model.params] == ["c_w"]
    with pytest.raises(ValueError):
        brew.conv(model, "x", "c3", 3, 4, kernel=3, engine="NNPACK")


def test_conv_list_kernel_and_conv_nd() -> None:
    model = ModelHelper(name="m", arg_scope={"use_cudnn": False})
    brew.conv(model, "x", "c", 3, 4, kernel=[5, 3])
    args = _args(_ops(model.net, "Conv")[0])
    assert (args["kernel_h"], args["kernel_w"]) == (5, 3) and "kernel" not in args
    brew.conv_nd(model, "x3", "c3", 3, 4, kernel=[2, 3, 4])
    args = _args(_ops(model.net, "Conv")[1])
    assert list(args["kernels"]) == [2, 3, 4]
    assert list(_args(_init_op(model, "c3_w"))["shape"]) == [4, 3, 2, 3, 4]


def test_conv_transpose_params() -> None:
    model = ModelHelper(name="m")
    brew.conv_transpose(model, "x", "t", 3, 5, 2)
    brew.conv_transpose(model, "x", "u", 3, 5, 2, order="NHWC")
    assert list(_args(_init_op(model, "t_w"))["shape"]) == [3, 5, 2, 2]
    assert list(_args(_init_op(model, "u_w"))["shape"]) == [3, 2, 2, 5]
    assert list(_args(_init_op(model, "t_b"))["shape"]) == [5]
    assert "t_w" in [str(w) for w in model.weights]
    assert "t_b" in [str(b) for b in model.biases]
    op = _ops(model.net, "ConvTranspose")[0]
    assert list(op.input) == ["x", "t_w", "t_b"] and _args(op)["kernel"] == 2


def test_group_conv_and_deprecated() -> None:
    model = ModelHelper(name="m", arg_scope={"use_cudnn": False})
    brew.group_conv(model, "x", "g", 4, 6, 3, group=2)
    assert _args(_ops(model.net, "Conv")[0])["group"] == 2
    brew.group_conv_deprecated(model, "x", "gd", 4, 6, 3, group=2)
    names = {str(p) for p in model.params}
    assert {"gd_gconv_0_w", "gd_gconv_0_b", "gd_gconv_1_w", "gd_gconv_1_b"} <= names
    assert _ops(model.net, "DepthSplit") and _ops(model.net, "Concat")


def test_conv_arg_scope_stride_pad_shape() -> None:
    workspace.FeedBlob("x", np.random.rand(64, 3, 32, 32).astype(np.float32) - 0.5)
    model = ModelHelper(name="test_model")
    with brew.arg_scope(brew.conv, stride=2, pad=2, weight_init=("XavierFill", {}),
                        bias_init=("ConstantFill", {})):
        brew.conv(model=model, blob_in="x", blob_out="out", dim_in=3, dim_out=64, kernel=3)
    model.Validate()
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("out").shape == (64, 64, 17, 17)


def test_model_arg_scope_nhwc_rect_kernel_shape() -> None:
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


def test_cnn_model_helper_order() -> None:
    model = cnn.CNNModelHelper(name="test_model", order="NHWC")
    assert model.arg_scope["order"] == "NHWC"


# --- normalization -----------------------------------------------------------------------
def test_spatial_bn_params_and_outputs() -> None:
    model = ModelHelper(name="m")
    out = brew.spatial_bn(model, "x", "bn", 4, init_scale=2.0, init_bias=0.5, epsilon=1e-3)
    assert str(out) == "bn"
    assert [str(p) for p in model.params] == ["bn_s", "bn_b"]
    assert [str(p) for p in model.GetComputedParams()] == ["bn_rm", "bn_riv"]
    assert [str(w) for w in model.weights] == ["bn_s"]
    assert [str(b) for b in model.biases] == ["bn_b"]
    for name, value in [("bn_s", 2.0), ("bn_b", 0.5), ("bn_rm", 0.0), ("bn_riv", 1.0)]:
        op = _init_op(model, name)
        assert op.type == "ConstantFill"
        assert _args(op).get("value", 0.0) == pytest.approx(value)
        assert list(_args(op)["shape"]) == [4]
    bn = _ops(model.net, "SpatialBN")[0]
    assert list(bn.input) == ["x", "bn_s", "bn_b", "bn_rm", "bn_riv"]
    assert list(bn.output) == ["bn", "bn_rm", "bn_riv", "bn_sm", "bn_siv"]
    assert _args(bn)["order"] == "NCHW"
    assert _args(bn)["epsilon"] == pytest.approx(1e-3)


def test_spatial_bn_is_test_single_output() -> None:
    model = ModelHelper(name="m")
    out = brew.spatial_bn(model, "x", "bn", 4, is_test=True)
    bn = _ops(model.net, "SpatialBN")[0]
    assert list(bn.output) == ["bn"] and str(out) == "bn"
    assert _args(bn)["is_test"] == 1


def test_spatial_gn_op_without_order() -> None:
    model = ModelHelper(name="m")
    out = brew.spatial_gn(model, "x", "gn", 4, group=2)
    assert str(out) == "gn"
    assert [str(p) for p in model.params] == ["gn_s", "gn_b"]
    op = _ops(model.net, "GroupNorm")[0]
    assert list(op.input) == ["x", "gn_s", "gn_b"]
    assert list(op.output) == ["gn", "gn_mean", "gn_std"]
    assert "order" not in _args(op)
    assert _args(op)["group"] == 2


def test_instance_norm_and_layer_norm_names() -> None:
    model = ModelHelper(name="m")
    brew.instance_norm(model, "x", "inorm", 4)
    assert {"inorm_s", "inorm_b"} <= {str(p) for p in model.params}
    outs = brew.layer_norm(model, "x", "ln", 4)
    assert [str(o) for o in outs] == ["ln", "ln_mean", "ln_std"]
    assert {"ln_scale", "ln_bias"} <= {str(p) for p in model.params}
    assert _init_op(model, "ln_scale").type == "ConstantFill"
    op = _ops(model.net, "LayerNorm")[0]
    assert list(op.input) == ["x", "ln_scale", "ln_bias"]
    assert list(op.output) == ["ln", "ln_mean", "ln_std"]
    assert _args(op)["elementwise_affine"] == 1
    assert _args(op)["epsilon"] == pytest.approx(1e-4)


# --- nonlinearity ------------------------------------------------------------------------
def test_relu_tanh_engine_and_order() -> None:
    model = ModelHelper(name="m", arg_scope={"use_cudnn": False})
    brew.relu(model, "x", "r")
    brew.tanh(model, "x", "t", use_cudnn=True, order="NHWC")
    relu, tanh = _ops(model.net, "Relu")[0], _ops(model.net, "Tanh")[0]
    assert relu.engine == "" and _args(relu)["order"] == "NCHW"
    assert tanh.engine == "CUDNN" and _args(tanh)["order"] == "NHWC"


def test_prelu_slope() -> None:
    model = ModelHelper(name="m")
    brew.prelu(model, "x", "p", num_channels=3)
    slope = _init_op(model, "p_slope")
    assert slope.type == "ConstantFill"
    assert _args(slope)["value"] == pytest.approx(0.25)
    assert list(_args(slope)["shape"]) == [3]
    assert [str(p) for p in model.params] == ["p_slope"]
    assert model.weights == [] and model.biases == []
    assert list(_ops(model.net, "PRelu")[0].input) == ["x", "p_slope"]


# --- train helpers -----------------------------------------------------------------------
def test_add_weight_decay_helper() -> None:
    model = ModelHelper(name="m")
    brew.fc(model, "x", "fc", 2, 1)
    model.net.SquaredL2Distance(["fc", "y"], "d")
    loss = model.net.AveragedLoss("d", "loss")
    model.AddGradientOperators([loss])
    n_ops = len(model.net.Proto().op)
    brew.add_weight_decay(model, 0.0)
    assert len(model.net.Proto().op) == n_ops
    brew.add_weight_decay(model, 0.01)
    assert _args(_init_op(model, "wd"))["value"] == pytest.approx(0.01)
    assert _args(_init_op(model, "ONE"))["value"] == pytest.approx(1.0)
    ws = _ops(model.net, "WeightedSum")
    assert len(ws) == 1
    assert list(ws[0].input) == ["fc_w_grad", "ONE", "fc_w", "wd"]
    assert list(ws[0].output) == ["fc_w_grad"]


def test_iter_helper() -> None:
    model = ModelHelper(name="m")
    brew.iter(model, "ITER")
    init = _init_op(model, "ITER")
    assert init.type == "ConstantFill"
    assert _args(init)["dtype"] == caffe2_pb2.TensorProto.INT64
    it = _ops(model.net, "Iter")[0]
    assert list(it.input) == ["ITER"] and list(it.output) == ["ITER"]
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net.Proto().name, 3)
    assert workspace.FetchBlob("ITER").tolist() == [3]


# --- brew_test numerics ------------------------------------------------------------------
def test_dropout_keeps_mean() -> None:
    p = 0.2
    workspace.FeedBlob("x", np.ones((100, 100), np.float32) - p)
    model = ModelHelper(name="test_model")
    brew.dropout(model, "x", "out", is_test=False)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert abs(workspace.FetchBlob("out").mean() - (1 - p)) < 0.05


def test_fc_relu_tanh_run() -> None:
    workspace.FeedBlob("x", np.random.rand(15, 15).astype(np.float32) - 0.5)
    workspace.FeedBlob("xpos", np.ones((5, 5), np.float32) - 0.5)
    workspace.FeedBlob("xneg", np.ones((5, 5), np.float32) - 1.5)
    model = ModelHelper(name="test_model")
    brew.fc(model, "x", "out_1", 15, 15)
    brew.relu(model, "xpos", "out_xpos")
    brew.relu(model, "xneg", "out_xneg")
    brew.tanh(model, "xpos", "out_tanh")
    model.Validate()
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("out_1").shape == (15, 15)
    assert workspace.FetchBlob("out_xpos").mean() == pytest.approx(0.5)
    assert workspace.FetchBlob("out_xneg").mean() == pytest.approx(0.0)
    assert workspace.FetchBlob("out_tanh").mean() == pytest.approx(np.tanh(0.5), abs=1e-5)


def test_validate_returns_duplicates() -> None:
    model = ModelHelper(name="test_model")
    model.params.append("aaa")
    model.params.append("bbb")
    assert model._Validate() == []
    model.params.append("xxx")
    model.params.append("bbb")
    assert model._Validate() == ["bbb"]


def test_get_params_semantics() -> None:
    model = ModelHelper(name="m")
    model.AddParameter(core.BlobReference("a"))
    model.AddParameter(core.BlobReference("b"), tags=ParameterTags.COMPUTED_PARAM)
    with core.NameScope("c"):
        model.AddParameter(core.ScopedBlobReference("a"))
        model.AddParameter(core.ScopedBlobReference("d"), tags=ParameterTags.COMPUTED_PARAM)
        assert [str(p) for p in model.GetParams()] == ["c/a"]
        assert [str(p) for p in model.GetComputedParams()] == ["c/d"]
        assert [str(p) for p in model.GetAllParams()] == ["c/a", "c/d"]
        assert sorted(str(p) for p in model.GetAllParams("")) == ["a", "b", "c/a", "c/d"]
    assert [str(p) for p in model.GetParams()] == ["a", "c/a"]
    assert [str(p) for p in model.GetComputedParams()] == ["b", "c/d"]
    assert [str(p) for p in model.GetAllParams("c")] == ["c/a", "c/d"]
    assert [str(p) for p in model.GetAllParams("c/")] == ["c/a", "c/d"]


def test_step_model_shares_param_info() -> None:
    model = ModelHelper(name="m")
    brew.fc(model, "x", "fc", 2, 3)
    step = ModelHelper(name="step", param_model=model)
    assert step._parameters_info is model._parameters_info


def test_cond_helper() -> None:
    workspace.FeedBlob("cond", np.array(True))
    workspace.FeedBlob("then_value", np.array(1))
    workspace.FeedBlob("else_value", np.array(2))
    then_model = ModelHelper(name="then_test_model")
    then_model.net.Copy("then_value", "output_blob")
    else_model = ModelHelper(name="else_test_model")
    else_model.net.Copy("else_value", "output_blob")
    model = ModelHelper(name="test_model")
    brew.cond(model=model, cond_blob="cond",
              external_blobs=["then_value", "else_value", "output_blob"],
              then_model=then_model, else_model=else_model)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("output_blob") == 1


def test_loop_helper() -> None:
    for name, value in [("cond", True), ("ONE", 1), ("TWO", 2), ("TEN", 10), ("counter", 0),
                        ("output_blob", 0)]:
        workspace.FeedBlob(name, np.array(value))
    loop_model = ModelHelper(name="loop_test_model")
    loop_model.net.Add(["output_blob", "TWO"], "output_blob")
    cond_model = ModelHelper(name="cond_test_model")
    cond_model.net.Add(["counter", "ONE"], "counter")
    comp_res = cond_model.net.LT(["counter", "TEN"])
    cond_model.net.Copy(comp_res, "cond")
    model = ModelHelper(name="test_model")
    brew.loop(model=model, cond_blob="cond",
              external_blobs=["cond", "ONE", "TWO", "TEN", "counter", "output_blob"],
              loop_model=loop_model, cond_model=cond_model)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("output_blob") == 18


def test_cond_structure_and_else_branch() -> None:
    then_model, else_model = ModelHelper(name="t"), ModelHelper(name="e")
    then_model.net.Copy("a", "out")
    else_model.net.Copy("b", "out")
    model = ModelHelper(name="m")
    brew.cond(model, "c", ["a", "b", "out"], then_model, else_model)
    op = _ops(model.net, "If")[0]
    assert list(op.input)[:3] == ["c", "a", "b"] and list(op.output)[0] == "out"
    assert [str(b).rsplit("/", 1)[-1] for b in op.input[3:]] == ["workspace_if_then",
                                                                 "workspace_if_else"]
    args = {a.name: a for a in op.arg}
    assert args["then_net"].n.op[0].type == "Do" and args["else_net"].n.op[0].type == "Do"
    workspace.FeedBlob("c", np.array(False))
    workspace.FeedBlob("a", np.array([1.0], np.float32))
    workspace.FeedBlob("b", np.array([2.0], np.float32))
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("out").tolist() == [2.0]


def test_loop_that_never_runs() -> None:
    body = ModelHelper(name="body")
    body.net.Add(["acc", "one"], "acc")
    model = ModelHelper(name="m")
    brew.loop(model, "c", ["acc", "one"], body)
    op = _ops(model.net, "While")[0]
    assert list(op.input)[:3] == ["c", "acc", "one"] and list(op.output)[0] == "acc"
    assert op.input[-1].endswith("/workspace_loop_body")
    workspace.FeedBlob("c", np.array(False))
    workspace.FeedBlob("acc", np.array([5.0], np.float32))
    workspace.FeedBlob("one", np.array([1.0], np.float32))
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("acc").tolist() == [5.0]


def test_layer_norm_trains() -> None:
    model = ModelHelper(name="m")
    normed, _, _ = brew.layer_norm(model, "x", "ln", 4, initial_scale=2.0, initial_bias=0.5)
    loss = model.net.SumElements(model.net.Sqr(normed, "sq"), "loss")
    model.AddGradientOperators([loss])
    x = np.random.rand(3, 4).astype(np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    z = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("ln"), 2.0 * z + 0.5, rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("ln_bias_grad"),
                               (2 * (2.0 * z + 0.5)).sum(axis=0), rtol=1e-4, atol=1e-4)


def test_add_weight_decay_follows_name_scope() -> None:
    model = ModelHelper(name="m")
    with core.NameScope("gpu_0"):
        brew.fc(model, "data", "fc", 2, 1)
    brew.fc(model, "data", "top", 2, 1)
    model.AddGradientOperators([model.net.SumElements("gpu_0/fc", "s0"),
                                model.net.SumElements("top", "s1")])
    with core.NameScope("gpu_0"):
        brew.add_weight_decay(model, 0.1)
    ws = _ops(model.net, "WeightedSum")
    assert [list(op.input) for op in ws] == [
        ["gpu_0/fc_w_grad", "gpu_0/ONE", "gpu_0/fc_w", "gpu_0/wd"]]


def test_spatial_bn_external_params_without_init() -> None:
    model = ModelHelper(name="m", init_params=False)
    brew.spatial_bn(model, "x", "bn", 4)
    assert len(model.param_init_net.Proto().op) == 0
    assert [str(p) for p in model.GetAllParams()] == ["bn_s", "bn_b", "bn_rm", "bn_riv"]
