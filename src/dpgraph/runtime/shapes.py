"""InferShapesAndTypes: static shape and type propagation through nets.

Known shapes start from ``blob_dimensions``/``blob_types`` or, without them, from the
workspace's blobs.  Each op is then handled in order:

1. its schema's ``shape_fn(op, in_shapes, in_types)`` when it has one;
2. otherwise, when every input's shape and type is known and the op has no side effects,
   its kernel runs on a scratch copy: workspace values where the workspace holds the
   input with the known shape, zero arrays otherwise (the workspace is never modified);
3. otherwise (or when either raises) its outputs stay unknown and are skipped.

Only blobs with a known shape appear in the result, as in Caffe2.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from dpgraph.errors import WorkspaceError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.device import effective_device
from dpgraph.ir.proto_io import proto_of
from dpgraph.ir.registry import OPERATORS
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import devices
from dpgraph.runtime.operator import RuntimeOpContext
from dpgraph.runtime.serialization import DATA_TYPE_TO_NUMPY, value_data_type

logger = logging.getLogger("dpgraph.runtime.shapes")
FLOAT = caffe2_pb2.TensorProto.FLOAT

Shape = tuple[int, ...]


class _ScratchWorkspace:
    """Read-only view of the workspace for kernels run during inference."""

    def __init__(self, workspace: Any) -> None:
        self.workspace = workspace
        self.rng = np.random.default_rng(0)

    def get_blob_or_none(self, name: str, device: Any = None) -> Any:
        return None if self.workspace is None else self.workspace.get_blob_or_none(name)


def _initial(workspace: Any, blob_dimensions: Mapping[str, Any] | None,
             blob_types: Mapping[str, int] | None) -> tuple[dict[str, Shape], dict[str, int]]:
    shapes: dict[str, Shape] = {}
    types: dict[str, int] = {}
    if blob_dimensions is not None:
        for name, dims in blob_dimensions.items():
            shapes[str(name)] = tuple(int(d) for d in dims)
            types[str(name)] = int((blob_types or {}).get(name, FLOAT))
        return shapes, types
    if workspace is not None:
        for name in workspace.blobs():
            value = workspace.get_blob_or_none(name)
            data_type = value_data_type(value)
            if data_type is not None and hasattr(value, "shape"):
                shapes[name], types[name] = tuple(value.shape), data_type
    return shapes, types


def _run_kernel(op: caffe2_pb2.OperatorDef, in_shapes: list[Shape], in_types: list[int],
                workspace: Any) -> list[tuple[Shape, int] | None]:
    schema = OPERATORS.lookup(op.type)
    if schema.kernel is None or schema.side_effects:
        return [None] * len(op.output)
    values = []
    for name, shape, data_type in zip(op.input, in_shapes, in_types):
        actual = None if workspace is None else workspace.get_blob_or_none(name)
        if actual is not None and devices.is_array(actual) and tuple(actual.shape) == shape:
            values.append(np.array(devices.to_host(actual), copy=True))
        else:
            values.append(np.zeros(shape, dtype=DATA_TYPE_TO_NUMPY.get(data_type, np.float32)))
    ctx = RuntimeOpContext(op, arguments_dict(op.arg), np, effective_device(op),
                           _ScratchWorkspace(workspace), entropy=[0])
    ctx.inputs = values
    with np.errstate(all="ignore"):
        outs = schema.kernel(ctx)
    result: list[tuple[Shape, int] | None] = []
    for value in outs:
        out_type = value_data_type(value)
        out_shape = getattr(value, "shape", None)
        result.append(None if out_type is None or out_shape is None
                      else (tuple(out_shape), out_type))
    return result


def _infer_op(op: caffe2_pb2.OperatorDef, shapes: dict[str, Shape], types: dict[str, int],
              workspace: Any) -> None:
    schema = OPERATORS.get(op.type)
    if schema is None:
        return
    in_shapes = [shapes.get(b) for b in op.input]
    in_types = [types.get(b) for b in op.input]
    results: list[Any] | None = None
    try:
        if schema.shape_fn is not None:
            results = list(schema.shape_fn(op, in_shapes, in_types))
        elif all(s is not None for s in in_shapes) and all(t is not None for t in in_types):
            results = _run_kernel(op, in_shapes, in_types, workspace)  # type: ignore[arg-type]
    except Exception as error:  # inference is best effort
        logger.debug("shape inference skipped %s: %s", op.type, error)
        results = None
    for index, name in enumerate(op.output):
        item = results[index] if results is not None and index < len(results) else None
        if item is None or item[0] is None:
            shapes.pop(name, None)
            types.pop(name, None)
            continue
        shapes[name] = tuple(int(d) for d in item[0])
        types[name] = int(item[1]) if item[1] is not None else FLOAT


def infer_shapes_and_types(nets: Iterable[Any], workspace: Any = None,
                           blob_dimensions: Mapping[str, Any] | None = None,
                           blob_types: Mapping[str, int] | None = None
                           ) -> tuple[dict[str, list[int]], dict[str, int]]:
    """``({blob: dims}, {blob: TensorProto.DataType})`` for every blob whose shape is known."""
    shapes, types = _initial(workspace, blob_dimensions, blob_types)
    for net in nets:
        proto = proto_of(net)
        if not isinstance(proto, caffe2_pb2.NetDef):
            raise WorkspaceError(
                f"InferShapesAndTypes: expected a list of Nets or NetDefs, got an item of type "
                f"{type(net).__name__}; pass [net] or [net.Proto()].")
        default = proto.device_option if proto.HasField("device_option") else None
        for op in proto.op:
            if default is not None and not op.HasField("device_option"):
                op_copy = caffe2_pb2.OperatorDef()
                op_copy.CopyFrom(op)
                op_copy.device_option.CopyFrom(default)
                op = op_copy
            _infer_op(op, shapes, types, workspace)
    return {k: list(v) for k, v in shapes.items()}, dict(types)
