"""Model zoo: Caffe2's blob names, shapes and return values for resnet and shufflenet
(caffe2-jobs-facts §2), and a forward run of the small models."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.cnn import CNNModelHelper
from dpgraph.model_helper import ModelHelper
from dpgraph.models import resnet, shufflenet


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _outputs(model):
    return [o for op in model.net.Proto().op for o in op.output]


def _resnet50_under_gpu0(**kwargs):
    model = CNNModelHelper(order="NCHW", name="test", cudnn_exhaustive_search=True)
    with core.NameScope("gpu_0"):
        data = model.net.AddExternalInput("gpu_0/data")
        label = model.net.AddExternalInput("gpu_0/label")
        result = resnet.create_resnet50(model, data, num_input_channels=3, num_labels=1000,
                                        label=label, **kwargs)
    return model, result


def test_resnet50_blob_names_and_components():
    model, (softmax, loss) = _resnet50_under_gpu0()
    assert (str(softmax), str(loss)) == ("gpu_0/softmax", "gpu_0/loss")
    params = [str(p) for p in model.params]
    assert params[:4] == ["gpu_0/conv1_w", "gpu_0/conv1_b", "gpu_0/conv1_spatbn_relu_s",
                          "gpu_0/conv1_spatbn_relu_b"]
    assert params[-2:] == ["gpu_0/last_out_L1000_w", "gpu_0/last_out_L1000_b"]
    outputs = set(_outputs(model))
    assert {f"gpu_0/comp_{n}_sum_3" for n in range(16)} <= outputs
    assert "gpu_0/comp_16_sum_3" not in outputs
    projections = sorted(int(o.split("_")[3]) for o in outputs
                         if o.startswith("gpu_0/shortcut_projection_") and o.count("_") == 3)
    assert projections == [0, 3, 7, 13]
    assert {"gpu_0/comp_0_spatbn_1_rm", "gpu_0/comp_0_spatbn_1_sm"} <= outputs
    strided = sorted({op.output[0] for op in model.net.Proto().op if op.type == "Conv"
                      and any(a.name == "stride" and a.i == 2 for a in op.arg)})
    assert strided == ["gpu_0/comp_13_conv_2", "gpu_0/comp_3_conv_2", "gpu_0/comp_7_conv_2",
                       "gpu_0/conv1", "gpu_0/shortcut_projection_13",
                       "gpu_0/shortcut_projection_3", "gpu_0/shortcut_projection_7"]
    (final_avg,) = [op for op in model.net.Proto().op if op.output[0] == "gpu_0/final_avg"]
    assert {a.name: a.i for a in final_avg.arg}["global_pooling"] == 1


def test_create_resnext_default_no_bias_and_returns():
    model = ModelHelper(name="rx")
    last = resnet.create_resnext(model, "data", 3, 10, num_layers=18, num_groups=1,
                                 num_width_per_group=64, no_loss=True)
    assert str(last) == "last_out_L10"
    assert "conv1_b" not in [str(p) for p in model.params]
    model = ModelHelper(name="rx2")
    assert str(resnet.create_resnext(model, "data", 3, 10, num_layers=18, num_groups=1,
                                     num_width_per_group=8)) == "softmax"
    with pytest.raises(AttributeError):  # Caffe2's log=None shadows the module logger
        resnet.create_resnext(ModelHelper(name="bad"), "data", 3, 10, num_layers=19,
                              num_groups=1, num_width_per_group=8)


def test_resnet_32x32_names_and_forward():
    model = ModelHelper(name="r32")
    softmax = resnet.create_resnet_32x32(model, "data", num_input_channels=3, num_groups=1,
                                         num_labels=10)
    assert str(softmax) == "softmax"
    params = [str(p) for p in model.params]
    assert params[:4] == ["conv1_w", "conv1_b", "conv1_spatbn_s", "conv1_spatbn_b"]
    assert "comp_0_conv_1_b" in params  # no_bias=0 in the builder
    assert params[-2:] == ["last_out_w", "last_out_b"]
    outputs = _outputs(model)
    assert "relu1" in outputs and "comp_5_sum_2" in outputs and "comp_6_sum_2" not in outputs
    assert "shortcut_projection_2_spatbn" in outputs and "shortcut_projection_0" not in outputs
    (proj_bn,) = [op for op in model.net.Proto().op
                  if op.output[0] == "shortcut_projection_2_spatbn"]
    assert {a.name: a.f for a in proj_bn.arg}["epsilon"] == pytest.approx(1e-3)
    workspace.FeedBlob("data", np.random.RandomState(0).rand(2, 3, 32, 32).astype(np.float32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    out = workspace.FetchBlob("softmax")
    assert out.shape == (2, 10)
    np.testing.assert_allclose(out.sum(axis=1), [1.0, 1.0], rtol=1e-5)


def test_shufflenet_names_returns_and_forward():
    model = ModelHelper(name="shuffle")
    assert shufflenet.create_shufflenet(model, "data", 3, 10) is None
    outputs = _outputs(model)
    for name in ("stage1_conv", "stage1_pool", "stage2_stride2left_dwconv",
                 "stage2_stride2left_dwconv_bn", "stage2_stride2_left_conv1_bn",
                 "stage2_stride2_right_dwconv_bn", "stage2_stride2_concat",
                 "_stage2_stride2_concat_concat_dims", "stage2_stride2_ch_shuffle",
                 "stage3_stride1_repeat7_right_conv2", "stage4_stride1_repeat3_ch_shuffle",
                 "conv5", "avg_pool", "last_out_L10"):
        assert name in outputs, name
    assert "softmax" not in outputs
    splits = [op for op in model.net.Proto().op if op.type == "Split"]
    assert len(splits) == 3 + 7 + 3 and not splits[0].arg
    shuffles = [op for op in model.net.Proto().op if op.type == "ChannelShuffle"]
    assert {a.name: a.i for a in shuffles[0].arg} == {"group": 2, "kernel": 1}
    model = ModelHelper(name="shuffle_loss")
    softmax, loss = shufflenet.create_shufflenet(model, "data", 3, 10, label="label")
    assert (str(softmax), str(loss)) == ("softmax", "loss")
    workspace.FeedBlob("data", np.random.RandomState(0).rand(1, 3, 224, 224)
                       .astype(np.float32))
    workspace.FeedBlob("label", np.array([3], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert np.isfinite(workspace.FetchBlob("loss")).all()
    assert workspace.FetchBlob("last_out_L10").shape == (1, 10)


def test_shufflenet_no_loss_and_widths():
    model = ModelHelper(name="s")
    assert str(shufflenet.create_shufflenet(model, "data", 3, 5, no_loss=True)) == \
        "last_out_L5"
    assert shufflenet.OUTPUT_CHANNELS["0.5x"] == [24, 48, 96, 192, 1024]
    builder = shufflenet.ShuffleNetV2Builder(ModelHelper(name="w"), "data", 3, 5,
                                             width="2.0x")
    assert builder.output_channels[-1] == 2048 and builder.stage_repeats == [3, 7, 3]
