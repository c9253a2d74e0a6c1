"""combine_spatial_bn: full-batch SpatialBN statistics on every device."""

from __future__ import annotations

import numpy as np
import pytest
from _parallel_helpers import BATCH, bn_forward, build, ops_of, train

from dpgraph import workspace


def _blobs(model, devices, names):
    prefix = model._device_prefix
    return {(d, n): workspace.FetchBlob(f"{prefix}_{d}/{n}") for d in devices for n in names}


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("ndev", [2, 4])
def test_forward_output_and_gradients_match_full_batch(ndev: int, gpu: bool) -> None:
    names = ["bn", "bn_s_grad", "bn_b_grad", "image_grad", "bn_sm", "bn_siv"]
    ref_model, _ = train([0], forward=bn_forward, iters=1)
    ref = _blobs(ref_model, [0], names)
    model, _ = train(range(ndev), gpu=gpu, forward=bn_forward, iters=1,
                     combine_spatial_bn=True)
    got = _blobs(model, range(ndev), names)
    per = BATCH // ndev
    for d in range(ndev):
        rows = slice(d * per, (d + 1) * per)
        np.testing.assert_allclose(got[d, "bn"], ref[0, "bn"][rows], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[d, "image_grad"], ref[0, "image_grad"][rows],
                                   rtol=1e-4, atol=1e-6)
        for name in ("bn_s_grad", "bn_b_grad", "bn_sm", "bn_siv"):
            np.testing.assert_allclose(got[d, name], ref[0, name], rtol=1e-4, atol=1e-6,
                                       err_msg=name)


def test_cpu_structure() -> None:
    model = build(range(2), forward=bn_forward, combine_spatial_bn=True)
    ops = model.net.Proto().op
    types = [op.type for op in ops]
    start = types.index("ChannelStats")
    assert types[start:start + 6] == ["ChannelStats", "ChannelStats", "Sum", "Sum",
                                      "SpatialBN", "SpatialBN"]
    assert list(ops[start].output) == ["cpu_0/image_sums", "cpu_0/image_sumsq"]
    assert list(ops[start + 2].input) == ["cpu_0/image_sums", "cpu_1/image_sums"]
    assert list(ops[start + 2].output) == ["cpu_0/image_sums_combined"]
    for bn in ops[start + 4:start + 6]:
        assert list(bn.input[5:]) == ["cpu_0/image_sums_combined",
                                      "cpu_0/image_sumsq_combined"]
        assert [(a.name, a.i) for a in bn.arg if a.name == "num_batches"] == [("num_batches", 2)]
    back = types.index("ChannelBackpropStats")
    assert types[back:back + 8] == ["ChannelBackpropStats"] * 2 + [
        "Sum", "Copy", "Copy", "Sum", "Copy", "Copy"]
    assert list(ops[back + 2].output) == ["cpu_0/bn_s_grad_combined"]
    grads = [op for op in ops if op.type == "SpatialBNGradient"]
    assert [list(op.input[5:]) for op in grads] == [
        [f"cpu_{d}/bn_s_grad", f"cpu_{d}/bn_b_grad"] for d in range(2)]
    # ops are interleaved: device 0 and device 1 alternate in the forward pass
    fcs = [op.device_option.device_id for op in ops if op.type == "FC"]
    assert fcs == [0, 1]


def test_gpu_structure_goes_through_cpu() -> None:
    model = build(range(2), gpu=True, forward=bn_forward, combine_spatial_bn=True)
    to_cpu = [(op.input[0], op.output[0]) for op in ops_of(model.net, "CopyGPUToCPU")]
    assert to_cpu[:2] == [("gpu_0/image_sums", "cpu_0/image_sums_gpu_0_copy"),
                          ("gpu_1/image_sums", "cpu_0/image_sums_gpu_1_copy")]
    to_gpu = [(op.input[0], op.output[0]) for op in ops_of(model.net, "CopyCPUToGPU")]
    assert to_gpu[:2] == [("cpu_0/image_sums_combined", "gpu_0/image_sums_combined"),
                          ("cpu_0/image_sums_combined", "gpu_1/image_sums_combined")]
    bns = ops_of(model.net, "SpatialBN")
    assert [bn.input[5] for bn in bns] == ["gpu_0/image_sums_combined",
                                           "gpu_1/image_sums_combined"]


def test_non_uniform_devices_refused() -> None:
    with pytest.raises(AssertionError, match="combine_spatial_bn"):
        build([0, 2], forward=bn_forward, combine_spatial_bn=True)
