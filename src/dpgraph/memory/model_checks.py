"""Caffe2's ``models.imagenet_trainer_test_utils``: memonger checks on a zoo model (blob
counts before and after, and the outputs / a kept gradient of the original and the
optimised net on the same random input).  The resnet and shufflenet tests call these."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir import scope
from dpgraph.memory.sharing import (
    optimize_inference_fast,
    optimize_inference_for_dag,
    share_grad_blobs,
)
from dpgraph.modeling.cnn import CNNModelHelper
from dpgraph.runtime import api

_BATCH_SHAPE = [4, 3, 227, 227]


def has_blob(proto: Any, needle: str) -> bool:
    return any(needle in op.input or needle in op.output for op in proto.op)


def count_blobs(proto: Any) -> int:
    """Distinct blob names over every op's inputs and outputs."""
    return len({b for op in proto.op for b in list(op.input) + list(op.output)})


def count_shared_blobs(proto: Any) -> int:
    """Distinct blob names containing ``_shared``."""
    return len({b for op in proto.op for b in list(op.input) + list(op.output)
                if "_shared" in b})


def _random_input(data_blob: str) -> None:
    api.FeedBlob(data_blob, np.random.rand(*_BATCH_SHAPE).astype(np.float32))


def test_shared_grads(with_shapes: bool, create_model: Any, conv_blob: str,
                      last_out_blob: str, data_blob: str = "gpu_0/data",
                      label_blob: str = "gpu_0/label", num_labels: int = 1000) -> list[Any]:
    """``[(blobs after, before), (output, optimised output), (conv grad, optimised)]`` of
    ``share_grad_blobs`` with activation sharing on a training model."""
    model = CNNModelHelper(order="NCHW", name="test", cudnn_exhaustive_search=True)
    with scope.NameScope("gpu_0"):
        data = model.net.AddExternalInput(data_blob)
        label = model.net.AddExternalInput(label_blob)
        _, loss = create_model(model, data, num_input_channels=3, num_labels=num_labels,
                               label=label, is_test=False)
    param_to_grad = model.AddGradientOperators([loss])
    shapes, _ = api.InferShapesAndTypes([model.param_init_net, model.net],
                                        {data_blob: _BATCH_SHAPE, label_blob: [4]})
    count_before = count_blobs(model.net.Proto())
    conv_grad = str(param_to_grad[conv_blob])
    optim_proto = share_grad_blobs(
        model.net, ["gpu_0/loss"], set(model.param_to_grad.values()), "gpu_0/",
        share_activations=True, dont_share_blobs={conv_grad},
        blob_shapes=shapes if with_shapes else None)
    count_after = count_blobs(optim_proto)
    api.RunNetOnce(model.param_init_net)
    _random_input(data_blob)
    api.FeedBlob(label_blob, (np.random.rand(4) * num_labels).astype(np.int32))
    api.RunNetOnce(model.net)
    model.net.Proto().type = "dag"
    model.net.Proto().num_workers = 4
    loss1, grad1 = api.FetchBlob(last_out_blob), api.FetchBlob(conv_grad)
    api.FeedBlob(conv_grad, np.array([0.0]))
    api.RunNetOnce(optim_proto)
    loss2, grad2 = api.FetchBlob(last_out_blob), api.FetchBlob(conv_grad)
    return [(count_after, count_before), (loss1, loss2), (grad1, grad2)]


def _forward_model(create_model: Any, data_blob: str, num_labels: int) -> CNNModelHelper:
    model = CNNModelHelper(order="NCHW", name="test", use_cudnn=True,
                           cudnn_exhaustive_search=True)
    with scope.NameScope("gpu_0"):
        data = model.net.AddExternalInput(data_blob)
        create_model(model, data, num_input_channels=3, num_labels=num_labels, is_test=True)
    return model


def _compare_forward(model: CNNModelHelper, optim_proto: Any, data_blob: str,
                     last_out_blob: str, net_type: str) -> tuple[Any, Any]:
    api.RunNetOnce(model.param_init_net)
    _random_input(data_blob)
    api.RunNetOnce(model.net)
    model.net.Proto().type = net_type
    model.net.Proto().num_workers = 4
    loss1 = api.FetchBlob(last_out_blob)
    api.RunNetOnce(optim_proto)
    return loss1, api.FetchBlob(last_out_blob)


def test_forward_only(create_model: Any, last_out_blob: str, data_blob: str = "gpu_0/data",
                      num_labels: int = 1000) -> list[Any]:
    """``[(after, before), shared blob count, (output, optimised)]`` of
    ``optimize_inference_for_dag`` on an inference model."""
    model = _forward_model(create_model, data_blob, num_labels)
    count_before = count_blobs(model.net.Proto())
    optim_proto = optimize_inference_for_dag(model.net, [data_blob], "gpu_0/")
    count_after = count_blobs(optim_proto)
    shared = count_shared_blobs(optim_proto)
    return [(count_after, count_before), shared,
            _compare_forward(model, optim_proto, data_blob, last_out_blob, "dag")]


def test_forward_only_fast_simplenet(create_model: Any, last_out_blob: str,
                                     data_blob: str = "gpu_0/data",
                                     num_labels: int = 1000) -> list[Any]:
    """The same with ``optimize_inference_fast`` (a ``simple`` net)."""
    model = _forward_model(create_model, data_blob, num_labels)
    count_before = count_blobs(model.net.Proto())
    static = {data_blob, last_out_blob} | set(model.net.Proto().external_input)
    optim_proto = optimize_inference_fast(model.net.Proto(), static)
    count_after = count_blobs(optim_proto)
    shared = count_shared_blobs(optim_proto)
    return [(count_after, count_before), shared,
            _compare_forward(model, optim_proto, data_blob, last_out_blob, "simple")]
