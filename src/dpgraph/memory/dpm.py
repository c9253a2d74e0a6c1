"""Memory passes for data-parallel models: ``OptimizeGradientMemory`` and the hooks the
``Parallelize`` pipeline calls for ``optimize_gradient_memory`` and
``dynamic_memory_management``.

Call :func:`install_memory_hooks` once (``data_parallel_model`` does) so that
``Parallelize(..., optimize_gradient_memory=True)`` can run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.memory.sharing import release_blobs_when_used, share_grad_blobs
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


def _keep_all_devices(state: Any, blobs_to_keep: Iterable[str] | None) -> set[str]:
    keep = {f"{state.namescope(d)}/{b}" for d in state.devices for b in blobs_to_keep or ()}
    if state.config.rendezvous_legacy is not None:
        # cross-host collectives expect the gradient buffers to persist across iterations
        keep.update(str(g) for g in _param_grads(state.model))
    return keep


class MemoryPasses:
    """The memory passes of the Parallelize pipeline (see parallel.memory.MemoryHooks)."""

    def optimize_gradient_memory(self, state: Any) -> None:
        """Share gradient buffers per device (activations are left alone)."""
        model = state.model
        for device in state.devices:
            proto = share_grad_blobs(model.net, state.losses_by_device[device],
                                     _param_grads(model), f"{state.namescope(device)}/",
                                     share_activations=False)
            _replace_net(model, proto)

    def dynamic_memory_management(self, state: Any, blobs_to_keep: Any) -> None:
        """Free every blob after its last use, except ``blobs_to_keep`` (unprefixed)."""
        model = state.model
        keep = _keep_all_devices(state, blobs_to_keep)
        _replace_net(model, release_blobs_when_used(model.net.Proto(), keep))


_INSTALLED: list[MemoryPasses] = []


def install_memory_hooks() -> None:
    """Register :class:`MemoryPasses` with the Parallelize pipeline (idempotent)."""
    from dpgraph.parallel.memory import get_memory_hooks, register_memory_hooks

    current = get_memory_hooks()
    if current is None or not isinstance(current, MemoryPasses):
        hooks = MemoryPasses()
        _INSTALLED.append(hooks)
        register_memory_hooks(hooks)
