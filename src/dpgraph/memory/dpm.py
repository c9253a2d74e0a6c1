"""``OptimizeGradientMemory`` for data-parallel models: gradient (and activation) buffer
sharing per device.  (Parallelize's own memory passes are in :mod:`dpgraph.parallel.memory`.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.memory.sharing import share_grad_blobs
from dpgraph.proto import caffe2_pb2

log = logging.getLogger("dpgraph.memonger")


def _replace_net(model: Any, proto: caffe2_pb2.NetDef) -> None:
    """Swap the main net's ops for ``proto``'s, keeping the live NetDef object (callers
    hold ``model.net.Proto()``)."""
    live = model.net.Proto()
    live.CopyFrom(proto)


def _param_grads(model: Any) -> set[Any]:
    return set(model.param_to_grad.values())


def _require(model: Any) -> None:
    for attr in ("_devices", "_device_prefix", "_losses_by_gpu"):
        if not hasattr(model, attr):
            raise ParallelizeError(
                "OptimizeGradientMemory needs a model built with "
                "data_parallel_model.Parallelize; call Parallelize(model, ...) first."
            )


def _namescope(model: Any, device: int) -> str:
    return f"{model._device_prefix}_{device}/"


def _shapes(model: Any, input_shapes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not input_shapes:
        return None
    from dpgraph.runtime import api

    dims = {f"{_namescope(model, d)}{name}": list(shape)
            for name, shape in input_shapes.items() for d in model._devices}
    shapes, _ = api.InferShapesAndTypes([model.param_init_net, model.net], dims)
    return shapes


def OptimizeGradientMemory(model: Any, input_shapes: Mapping[str, Any] | None,
                           excluded_blobs: Iterable[str], recycle_activations: bool) -> None:
    """Recycle the buffers of gradient blobs (and, with ``recycle_activations``, of forward
    activations) per device of a Parallelize'd model.

    Args:
        input_shapes: ``{unprefixed input blob: shape}`` used to size blobs (best-fit
            sharing); empty or ``None`` when unknown.
        excluded_blobs: unprefixed blobs you fetch externally; never shared on any device.
        recycle_activations: also share forward-pass activations.
    """
    _require(model)
    shapes = _shapes(model, input_shapes)
    excluded = list(excluded_blobs or [])
    for device in model._devices:
        ns = _namescope(model, device)
        proto = share_grad_blobs(
            model.net, model._losses_by_gpu[device], _param_grads(model), ns,
            share_activations=recycle_activations,
            dont_share_blobs={ns + str(b) for b in excluded}, blob_shapes=shapes,
        )
        _replace_net(model, proto)
