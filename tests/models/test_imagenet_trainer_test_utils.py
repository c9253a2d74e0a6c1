"""models.imagenet_trainer_test_utils on ShuffleNet (Caffe2's shufflenet_test bounds):
memonger shrinks the nets and keeps outputs and the kept gradient."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import workspace
from dpgraph.models import imagenet_trainer_test_utils as utils
from dpgraph.models import shufflenet


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def test_shufflenet_forward_only():
    (after, before), shared, (out1, out2) = utils.test_forward_only(
        shufflenet.create_shufflenet, "gpu_0/last_out_L1000")
    assert after < before and 0 < shared < 10
    np.testing.assert_allclose(out1, out2)


def test_shufflenet_shared_grads():
    (after, before), (loss1, loss2), (grad1, grad2) = utils.test_shared_grads(
        False, shufflenet.create_shufflenet, "gpu_0/stage1_conv_w", "gpu_0/last_out_L1000")
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
