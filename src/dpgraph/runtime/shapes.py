"""InferShapesAndTypes: static shape and type propagation through nets.

Known descriptions start from ``blob_dimensions``/``blob_types`` or, without them, from the
workspace's blobs (a blob that is not a tensor is present with an unknown shape).  Each op is
then handled in order, following Caffe2's ``InferBlobShapesAndTypes``:

* ops whose type contains ``Enqueue`` or ``Dequeue`` are skipped;
* an input no earlier step described counts as unknown (Caffe2 skipped such an op; dpgraph
  lets its shape function answer from the other inputs, e.g. ``FC``'s output from X and W);
* ``Sum`` first gives its undescribed (or unknown) inputs the shape of its first input with a
  known non-scalar shape; an input still unmatched takes the output's shape at the end of the
  net (autodiff's auto-split gradient blobs);
* a gradient ``Reshape`` (``is_gradient_op``) gets the shapes its forward ``Reshape`` saw, and
  a gradient ``Split`` with two inputs the input shapes of the ``Concat`` that produced its
  split sizes;
* otherwise the schema's ``shape_fn(op, in_shapes, in_types)`` answers (unknown inputs are
  ``None``).  An op without one has its kernel run on a scratch copy when every input is
  known and the op has no side effects: on workspace values where the workspace holds the
  input with the described shape, on zero arrays otherwise (the workspace is never
  modified).  For a gradient op every output named ``<param>_grad`` that is still unknown
  takes ``<param>``'s description; when that describes every output, the kernel is not run.

An op whose shape function raises leaves its outputs unknown (Caffe2 dropped the whole
result; a warning is logged either way); a kernel failing on placeholder values is only
logged at debug level.  Only blobs with a known shape appear in the result.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
UNDEFINED = caffe2_pb2.TensorProto.UNDEFINED
INT64 = caffe2_pb2.TensorProto.INT64

Shape = tuple[int, ...]
#: A blob's description: (shape, TensorProto.DataType), or None for a blob whose shape is
#: unknown (present, unlike a blob no step described).
Desc = tuple[Shape, int] | None

_GRAD_SUFFIX = "_grad"


@dataclass
class _NetCaches:
    """Per-net memory of Caffe2's gradient special cases."""

    reshape: dict[str, Desc] = field(default_factory=dict)  # old_shape blob -> input desc
    split: dict[str, list[Desc]] = field(default_factory=dict)  # split_info -> input descs
    unmatched_sum: dict[str, str] = field(default_factory=dict)  # Sum input -> Sum output


class _ScratchWorkspace:
    """Read-only view of the workspace for kernels run during inference."""

    def __init__(self, workspace: Any) -> None:
        self.workspace = workspace
        self.rng = np.random.default_rng(0)

    def get_blob_or_none(self, name: str, device: Any = None) -> Any:
        return None if self.workspace is None else self.workspace.get_blob_or_none(name)


# --- starting descriptions -------------------------------------------------------------------
def _initial(workspace: Any, blob_dimensions: Mapping[str, Any] | None,
             blob_types: Mapping[str, int] | None) -> dict[str, Desc]:
    """From the given dimensions (type FLOAT without ``blob_types``, UNDEFINED for a blob
    missing from it, as Caffe2) or else from the workspace's blobs."""
    descs: dict[str, Desc] = {}
    if blob_dimensions is not None:
        for name, dims in blob_dimensions.items():
            data_type = FLOAT if blob_types is None else blob_types.get(name, UNDEFINED)
            descs[str(name)] = (tuple(int(d) for d in dims), int(data_type))
        return descs
    if workspace is not None:
        for name in workspace.blobs():
            value = workspace.get_blob_or_none(name)
            kind = value_data_type(value)
            descs[name] = (None if kind is None or not hasattr(value, "shape")
                           else (tuple(value.shape), kind))
    return descs


# --- one op ----------------------------------------------------------------------------------
def _run_kernel(op: caffe2_pb2.OperatorDef, inputs: list[tuple[Shape, int]],
                workspace: Any) -> list[Desc]:
    schema = OPERATORS.lookup(op.type)
    if schema.kernel is None or schema.side_effects:
        return [None] * len(op.output)
    values = []
    for name, (shape, data_type) in zip(op.input, inputs):
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
    result: list[Desc] = []
    for value in outs:
        out_type = value_data_type(value)
        out_shape = getattr(value, "shape", None)
        result.append(None if out_type is None or out_shape is None
                      else (tuple(out_shape), out_type))
    return result


def _normalized(results: Iterable[Any], count: int) -> list[Desc]:
    """``count`` descriptions from a shape function's answer (missing ones unknown)."""
    out: list[Desc] = []
    for item in list(results)[:count]:
        if item is None or item[0] is None:
            out.append(None)
        else:
            out.append((tuple(int(d) for d in item[0]),
                        int(item[1]) if item[1] is not None else FLOAT))
    return out + [None] * (count - len(out))


def _from_param_names(op: caffe2_pb2.OperatorDef, results: list[Desc],
                      descs: dict[str, Desc]) -> list[Desc]:
    """Caffe2's gradient-op rule: an unknown output ``<param>_grad`` takes ``<param>``'s
    description."""
    if not op.is_gradient_op:
        return results
    filled = list(results)
    for index, name in enumerate(op.output):
        if filled[index] is None and len(name) > len(_GRAD_SUFFIX) and \
                name.endswith(_GRAD_SUFFIX):
            filled[index] = descs.get(name[:-len(_GRAD_SUFFIX)])
    return filled


def _op_results(op: caffe2_pb2.OperatorDef, inputs: list[Desc], descs: dict[str, Desc],
                workspace: Any) -> list[Desc]:
    """The schema's shape function, else (gradient names first) the kernel on scratch."""
    schema = OPERATORS.lookup(op.type)
    count = len(op.output)
    if schema.shape_fn is not None:
        shapes = [None if d is None else d[0] for d in inputs]
        types = [None if d is None else d[1] for d in inputs]
        return _from_param_names(op, _normalized(schema.shape_fn(op, shapes, types), count),
                                 descs)
    by_name = _from_param_names(op, [None] * count, descs)
    if all(d is not None for d in by_name) or any(d is None for d in inputs):
        return by_name
    try:
        ran = _run_kernel(op, inputs, workspace)  # type: ignore[arg-type]
    except Exception as error:  # noqa: BLE001 - placeholder inputs may be invalid values
        logger.debug("shape inference could not run %s on placeholders: %s", op.type, error)
        return by_name
    return _from_param_names(op, _normalized(ran, count), descs)


def _gradient_cache_results(op: caffe2_pb2.OperatorDef, caches: _NetCaches
                            ) -> list[Desc] | None:
    """Outputs of a gradient Reshape / two-input Split from what their forward op saw."""
    if not op.is_gradient_op or len(op.input) < 2:
        return None
    if op.type == "Reshape" and op.input[1] in caches.reshape:
        old = caches.reshape[op.input[1]]
        rank = None if old is None else ((len(old[0]),), INT64)
        return ([old, rank] + [None] * len(op.output))[:len(op.output)]
    if op.type == "Split" and len(op.input) == 2 and op.input[1] in caches.split:
        cached = caches.split[op.input[1]]
        if len(cached) == len(op.output):
            return list(cached)
    return None


def _fill_sum_inputs(op: caffe2_pb2.OperatorDef, descs: dict[str, Desc],
                     caches: _NetCaches) -> None:
    """Caffe2's auto-split rule: Sum's inputs share one shape."""
    known = [descs[name] for name in op.input if descs.get(name) is not None]
    shape = next((d for d in known if d is not None and len(d[0]) > 0), None)
    for name in op.input:
        if descs.get(name) is None:
            descs[name] = shape
            if shape is None and op.output:
                caches.unmatched_sum[name] = op.output[0]


def _remember_forward(op: caffe2_pb2.OperatorDef, inputs: list[Desc],
                      caches: _NetCaches) -> None:
    if op.type == "Reshape" and len(op.output) > 1 and inputs:
        caches.reshape[op.output[1]] = inputs[0]
    elif op.type == "Concat" and len(op.output) > 1:
        caches.split[op.output[1]] = list(inputs)


def _infer_op(op: caffe2_pb2.OperatorDef, descs: dict[str, Desc], caches: _NetCaches,
              workspace: Any) -> None:
    if "Enqueue" in op.type or "Dequeue" in op.type or op.type not in OPERATORS:
        return
    if op.type == "Sum":
        _fill_sum_inputs(op, descs, caches)
    inputs = [descs.get(name) for name in op.input]
    results = _gradient_cache_results(op, caches)
    if results is None:
        try:
            results = _op_results(op, inputs, descs, workspace)
        except Exception as error:  # noqa: BLE001 - inference is best effort, per op
            logger.warning("shape inference of %s (inputs %s) failed: %s", op.type,
                           list(op.input), error)
            results = [None] * len(op.output)
        _remember_forward(op, inputs, caches)
    for name, desc in zip(op.output, results):
        descs[name] = desc


# --- nets ------------------------------------------------------------------------------------
def _with_net_device(op: caffe2_pb2.OperatorDef, default: Any) -> caffe2_pb2.OperatorDef:
    if default is None or op.HasField("device_option"):
        return op
    op_copy = caffe2_pb2.OperatorDef()
    op_copy.CopyFrom(op)
    op_copy.device_option.CopyFrom(default)
    return op_copy


def _infer_net(net: Any, descs: dict[str, Desc], workspace: Any) -> None:
    proto = proto_of(net)
    if not isinstance(proto, caffe2_pb2.NetDef):
        raise WorkspaceError(
            f"InferShapesAndTypes: expected a list of Nets or NetDefs, got an item of type "
            f"{type(net).__name__}; pass [net] or [net.Proto()].")
    default = proto.device_option if proto.HasField("device_option") else None
    caches = _NetCaches()
    for op in proto.op:
        _infer_op(_with_net_device(op, default), descs, caches, workspace)
    for name, output in caches.unmatched_sum.items():
        if descs.get(output) is not None:
            descs[name] = descs[output]


def infer_shapes_and_types(nets: Iterable[Any], workspace: Any = None,
                           blob_dimensions: Mapping[str, Any] | None = None,
                           blob_types: Mapping[str, int] | None = None
                           ) -> tuple[dict[str, list[int]], dict[str, int]]:
    """``({blob: dims}, {blob: TensorProto.DataType})`` for every blob whose shape is known."""
    descs = _initial(workspace, blob_dimensions, blob_types)
    for net in nets:
        _infer_net(net, descs, workspace)
    known = {name: desc for name, desc in descs.items() if desc is not None}
    return ({name: list(desc[0]) for name, desc in known.items()},
            {name: desc[1] for name, desc in known.items()})
