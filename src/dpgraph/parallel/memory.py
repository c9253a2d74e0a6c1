"""The memory passes of Parallelize (``optimize_gradient_memory``,
``dynamic_memory_management``), on :mod:`dpgraph.memory`'s blob sharing and release.

``optimize_gradient_memory`` shares gradient buffers per device (activations are left
alone); ``dynamic_memory_management`` frees every blob after its last use except
``blobs_to_keep`` (unprefixed, kept on every device) and, multi-host, the parameter
gradients the cross-host collectives expect to persist.
"""

from __future__ import annotations

from collections.abc import Iterable

from dpgraph.memory.sharing import release_blobs_when_used, share_grad_blobs
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2


def _replace_net(state: ParallelState, proto: caffe2_pb2.NetDef) -> None:
    """Swap the main net's ops for ``proto``'s, keeping the live NetDef object (callers
    hold ``model.net.Proto()``)."""
    state.model.net.Proto().CopyFrom(proto)


def _param_grads(state: ParallelState) -> set[object]:
    return set(state.model.param_to_grad.values())


def optimize_gradient_memory(state: ParallelState) -> None:
    """Share gradient buffers per device, device by device."""
    model = state.model
    for device in state.devices:
        proto = share_grad_blobs(model.net, state.losses_by_device[device],
                                 _param_grads(state), f"{state.namescope(device)}/",
                                 share_activations=False)
        _replace_net(state, proto)


def _blobs_to_keep(state: ParallelState, blobs_to_keep: Iterable[str] | None) -> set[str]:
    keep = {f"{state.namescope(d)}/{b}" for d in state.devices for b in blobs_to_keep or ()}
    if state.config.rendezvous_legacy is not None:
        # cross-host collectives expect the gradient buffers to persist across iterations
        keep.update(str(g) for g in _param_grads(state))
    return keep


def dynamic_memory_management(state: ParallelState) -> None:
    """Free every blob after its last use, except the blobs to keep."""
    keep = _blobs_to_keep(state, state.config.blobs_to_keep)
    _replace_net(state, release_blobs_when_used(state.model.net.Proto(), keep))
