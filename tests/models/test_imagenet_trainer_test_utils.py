"""models.imagenet_trainer_test_utils (the helpers of Caffe2's resnet/shufflenet tests):
memonger shrinks the nets and keeps outputs and the kept gradient.  A small ResNeXt on
32x32 inputs keeps the test fast (the helpers use 227x227 by default, as in Caffe2)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from dpgraph import workspace
from dpgraph.memory import model_checks
from dpgraph.models import imagenet_trainer_test_utils as utils
from dpgraph.models import resnet

small_resnext = functools.partial(resnet.create_resnext, num_layers=18, num_groups=2,
                                  num_width_per_group=4, no_bias=0)


@pytest.fixture(autouse=True)
def _small_inputs(monkeypatch):
    monkeypatch.setattr(model_checks, "_BATCH_SHAPE", [4, 3, 32, 32])
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


@pytest.mark.parametrize("fast", [False, True], ids=["dag", "fast"])
def test_forward_only(fast):
    check = utils.test_forward_only_fast_simplenet if fast else utils.test_forward_only
    (after, before), shared, (out1, out2) = check(small_resnext, "gpu_0/last_out_L1000")
    assert after < before and 0 < shared
    np.testing.assert_allclose(out1, out2)


@pytest.mark.parametrize("with_shapes", [False, True])
def test_shared_grads(with_shapes):
    (after, before), (loss1, loss2), (grad1, grad2) = utils.test_shared_grads(
        with_shapes, small_resnext, "gpu_0/conv1_w", "gpu_0/last_out_L1000")
    assert after < before
    np.testing.assert_almost_equal(loss1, loss2, decimal=7)
    np.testing.assert_almost_equal(grad1, grad2, decimal=7)


def test_blob_counting_helpers():
    from dpgraph.proto import caffe2_pb2

    net = caffe2_pb2.NetDef()
    net.op.add(input=["a", "x_shared"], output=["b"])
    net.op.add(input=["b"], output=["x_shared", "__m0_shared"])
    assert utils.count_blobs(net) == 4 and utils.count_shared_blobs(net) == 2
    assert utils.has_blob(net, "b") and not utils.has_blob(net, "c")
