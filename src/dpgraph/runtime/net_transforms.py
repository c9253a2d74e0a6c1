"""Caffe2's registered net transforms (``workspace.ApplyTransform`` /
``ApplyTransformIfFaster``).

A transform rewrites a NetDef.  Caffe2's Python-reachable one is ``ConvToNNPack`` (CPU
``Conv`` ops get the ``NNPACK`` engine); dpgraph runs every engine with its own kernels, so
the rewrite changes the NetDef but not the results.  ``ApplyTransformIfFaster`` times both
nets in a scratch workspace and keeps the transformed one only if it is faster by the
threshold, as Caffe2 does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dpgraph.errors import WorkspaceError
from dpgraph.proto import caffe2_pb2

Transform = Callable[[caffe2_pb2.NetDef], caffe2_pb2.NetDef]


def _conv_to_nnpack(net: caffe2_pb2.NetDef) -> caffe2_pb2.NetDef:
    """Every CPU ``Conv`` op runs with the ``NNPACK`` engine."""
    result = caffe2_pb2.NetDef()
    result.CopyFrom(net)
    for op in result.op:
        if op.type == "Conv" and op.device_option.device_type == caffe2_pb2.PROTO_CPU:
            op.engine = "NNPACK"
    return result


TRANSFORMS: dict[str, Transform] = {"ConvToNNPack": _conv_to_nnpack}


def _as_net(net: Any) -> caffe2_pb2.NetDef:
    if isinstance(net, caffe2_pb2.NetDef):
        return net
    if hasattr(net, "Proto"):
        return net.Proto()
    proto = caffe2_pb2.NetDef()
    proto.ParseFromString(net)
    return proto


def apply_transform(transform_key: Any, net: Any) -> caffe2_pb2.NetDef:
    """``transform_key``'s rewrite of ``net`` (a new NetDef)."""
    key = transform_key.decode() if isinstance(transform_key, bytes) else str(transform_key)
    if key not in TRANSFORMS:
        raise WorkspaceError(f"Transform {key!r} is not registered; registered transforms: "
                             f"{sorted(TRANSFORMS)}.")
    return TRANSFORMS[key](_as_net(net))


def _seconds_per_run(ws: Any, net: caffe2_pb2.NetDef, warmup_runs: int, main_runs: int
                     ) -> float:
    instance = ws.create_net(net, overwrite=True)
    for _ in range(warmup_runs):
        instance.run()
    start = time.perf_counter()
    for _ in range(main_runs):
        instance.run()
    return (time.perf_counter() - start) / max(main_runs, 1)


def apply_transform_if_faster(transform_key: Any, net: Any, init_net: Any,
                              warmup_runs: int = 5, main_runs: int = 10,
                              improvement_threshold: float = 1.01) -> caffe2_pb2.NetDef:
    """The transformed net if ``old time / new time > improvement_threshold`` when both run
    after ``init_net`` in a scratch workspace; otherwise (a copy of) ``net``."""
    from dpgraph.runtime.workspace import Workspace

    original = caffe2_pb2.NetDef()
    original.CopyFrom(_as_net(net))
    transformed = apply_transform(transform_key, original)
    ws = Workspace("transform_benchmark")
    ws.run_net_once(_as_net(init_net))
    old = _seconds_per_run(ws, original, warmup_runs, main_runs)
    new = _seconds_per_run(ws, transformed, warmup_runs, main_runs)
    return transformed if new > 0 and old / new > improvement_threshold else original


def ApplyTransform(transform_key: Any, net: Any) -> caffe2_pb2.NetDef:
    """Caffe2's ``workspace.ApplyTransform``."""
    return apply_transform(transform_key, net)


def ApplyTransformIfFaster(transform_key: Any, net: Any, init_net: Any,
                           **kwargs: Any) -> caffe2_pb2.NetDef:
    """Caffe2's ``workspace.ApplyTransformIfFaster`` (``warmup_runs=5``, ``main_runs=10``,
    ``improvement_threshold=1.01``)."""
    return apply_transform_if_faster(transform_key, net, init_net, **kwargs)
