"""Exporting a predictor (predict net + parameters) to an ONNX model.

``to_onnx(predict_net, init_net_or_params, inputs={"data": ((1, 3, 8, 8), "float32")})``
returns an ``onnx.ModelProto``.  The mapping of each Caffe2 op is in
:mod:`dpgraph.export.onnx_ops` and documented in ``docs/export.md``.

How it works:

1. every op type is checked first; unsupported ones raise one :class:`ExportError` listing
   *all* of them with their op indices;
2. the net is run once, op by op, with dpgraph's executor on zero inputs of the declared
   shapes (symbolic dims such as ``"N"`` get a stand-in size) to learn each op's input and
   output shapes and dtypes (needed for NHWC wrapping, legacy broadcast, pads, ...);
3. blobs written more than once (in-place ops) are renamed into SSA form; the last version
   of each blob keeps its Caffe2 name, so graph outputs are named like the net's outputs;
4. parameters become initializers.

Shapes that involve the batch dimension are built from ``Shape`` nodes at run time, so a
model exported with a symbolic batch dimension runs for any batch size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpgraph.errors import DpgraphError, ExportError, MissingDependencyError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.proto_io import netdef_of
from dpgraph.proto import caffe2_pb2

MIN_OPSET = 13
_SYMBOLIC_STAND_IN = 3


def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError as error:  # pragma: no cover - onnx is installed in development
        raise MissingDependencyError("ONNX export needs the 'onnx' package "
                                     "(`pip install onnx`)") from error
    return onnx


@dataclass
class OpShapes:
    """Shapes and dtypes of one op's inputs and outputs, observed by running it."""

    inputs: list[tuple[int, ...]] = field(default_factory=list)
    input_dtypes: list[np.dtype] = field(default_factory=list)
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    output_dtypes: list[np.dtype] = field(default_factory=list)
    output_values: list[Any] = field(default_factory=list)


class OnnxBuilder:
    """What an op converter sees: the op, its observed shapes and a node/constant factory."""

    def __init__(self, onnx: Any, opset: int) -> None:
        self.onnx = onnx
        self.opset = opset
        self.nodes: list[Any] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.params: dict[str, np.ndarray] = {}
        self.current: dict[str, str] = {}  # Caffe2 blob -> ONNX value name now
        self.graph_inputs: set[str] = set()
        self._taken: set[str] = set()
        self._counter = 0
        # set per op
        self.op: caffe2_pb2.OperatorDef = caffe2_pb2.OperatorDef()
        self.index = 0
        self.shapes = OpShapes()
        self.args: dict[str, Any] = {}
        self.needed_outputs: list[bool] = []
        self.output_names: list[str] = []

    # --- names -----------------------------------------------------------------------
    def reserve(self, name: str) -> str:
        self._taken.add(name)
        return name

    def fresh(self, hint: str) -> str:
        while True:
            self._counter += 1
            name = f"{hint}__{self._counter}"
            if name not in self._taken:
                return self.reserve(name)

    # --- op inputs/outputs -------------------------------------------------------------
    def input(self, index: int) -> str:
        """ONNX name of the op's input ``index`` (an initializer for parameters)."""
        blob = self.op.input[index]
        if blob not in self.current and blob in self.params:
            self.initializers[blob] = self.params[blob]
            self.current[blob] = self.reserve(blob)
        if blob not in self.current:
            raise ExportError(self.where(f"input {blob!r} is neither a graph input, a "
                                         "parameter nor an earlier op's output"))
        return self.current[blob]

    def param(self, index: int) -> np.ndarray | None:
        """The value of input ``index`` when it is an (unmodified) parameter."""
        blob = self.op.input[index]
        if blob in self.params and self.current.get(blob, blob) == blob:
            return self.params[blob]
        return None

    def output(self, index: int) -> str:
        return self.output_names[index]

    def rank(self, index: int = 0) -> int:
        return len(self.shapes.inputs[index])

    def in_shape(self, index: int = 0) -> tuple[int, ...]:
        return self.shapes.inputs[index]

    def in_dtype(self, index: int = 0) -> np.dtype:
        return self.shapes.input_dtypes[index]

    def where(self, message: str) -> str:
        return f"op {self.index} ({self.op.type}): {message}"

    # --- node factory ------------------------------------------------------------------
    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | int = 1,
             **attrs: Any) -> list[str]:
        """Append an ONNX node; ``outputs`` is names or a count of fresh temporaries."""
        if isinstance(outputs, int):
            outputs = [self.fresh(f"{self.op.type}_{self.index}_{op_type}")
                       for _ in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        name = self.fresh(f"{self.op.type}_{self.index}")
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), list(outputs),
                                                     name=name, **attrs))
        return list(outputs)

    def const(self, value: Any, hint: str = "const", dtype: Any = None) -> str:
        """A new initializer holding ``value``."""
        array = np.asarray(value, dtype=dtype)
        name = self.fresh(f"{hint}_{self.index}")
        self.initializers[name] = array
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), "ints")

    def shape_of(self, value: str, start: int = 0, end: int | None = None) -> str:
        """Run-time ``Shape(value)[start:end]`` as an int64 vector."""
        if self.opset >= 15:
            return self.node("Shape", [value], start=start, end=end)[0]
        full = self.node("Shape", [value])[0]
        if start == 0 and end is None:
            return full
        stop = np.iinfo(np.int64).max if end is None else end
        return self.node("Slice", [full, self.ints([start]), self.ints([stop])])[0]

    def reshape(self, value: str, shape: Sequence[int] | str, out: str | None = None) -> str:
        target = shape if isinstance(shape, str) else self.ints(shape)
        return self.node("Reshape", [value, target], [out] if out else 1)[0]

    def transpose(self, value: str, perm: Sequence[int], out: str | None = None) -> str:
        return self.node("Transpose", [value], [out] if out else 1, perm=list(perm))[0]


def _params(init_net_or_params: Any) -> dict[str, np.ndarray]:
    if isinstance(init_net_or_params, Mapping):
        return {str(k): np.asarray(v) for k, v in init_net_or_params.items()}
    from dpgraph.export.predictor import evaluate_init_net

    return evaluate_init_net(init_net_or_params)


def check_supported(proto: caffe2_pb2.NetDef) -> None:
    """Raise :class:`ExportError` naming every op of ``proto`` that has no ONNX mapping
    (also as ``error.unsupported``: a list of ``(op index, op type, reason)``)."""
    from dpgraph.export.onnx_ops import unsupported_reason

    problems = []
    for index, op in enumerate(proto.op):
        reason = unsupported_reason(op)
        if reason is not None:
            problems.append((index, op.type, reason))
    if problems:
        types = sorted({t for _, t, _ in problems})
        listing = "; ".join(f"op {i} ({t}): {r}" for i, t, r in problems)
        error = ExportError(
            f"cannot export net {proto.name!r} to ONNX: {len(problems)} unsupported op(s) of "
            f"type(s) {', '.join(types)} — {listing}. See docs/export.md for the supported "
            "op set.")
        error.unsupported = problems  # type: ignore[attr-defined]
        raise error


def _input_specs(inputs: Mapping[str, Any]) -> dict[str, tuple[list[int | str], np.dtype]]:
    specs: dict[str, tuple[list[int | str], np.dtype]] = {}
    for name, spec in inputs.items():
        if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], int):
            shape, dtype = spec
        else:
            shape, dtype = spec, np.float32
        specs[str(name)] = (_spec_dims(name, shape), _spec_dtype(name, dtype))
    return specs


def _spec_dims(name: Any, shape: Any) -> list[int | str]:
    """The dims of input ``name``: ints >= 0, or str/None for symbolic dims."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)):
        raise ExportError(f"input {name!r}: shape {shape!r} is not a tuple of dims; give e.g. "
                          "inputs={'data': (1, 3, 224, 224)} or ((\"N\", 3), 'float32').")
    dims: list[int | str] = []
    for dim in shape:
        if isinstance(dim, str) or dim is None:
            dims.append(dim if isinstance(dim, str) else "N")
        elif isinstance(dim, bool) or not hasattr(type(dim), "__index__") or int(dim) < 0:
            raise ExportError(f"input {name!r}: dim {dim!r} of shape {list(shape)} must be an "
                              "int >= 0, or a name (str) or None for a symbolic dim.")
        else:
            dims.append(int(dim))
    return dims


def _spec_dtype(name: Any, dtype: Any) -> np.dtype:
    try:
        result = np.dtype(dtype)
    except TypeError:
        result = None
    if result is None or result.kind not in "fiub":
        raise ExportError(f"input {name!r}: dtype {dtype!r} cannot be exported; use a numeric "
                          "dtype such as 'float32', 'int64' or 'bool'.")
    return result


def _stand_in(dims: Sequence[int | str]) -> tuple[int, ...]:
    return tuple(_SYMBOLIC_STAND_IN if isinstance(d, str) else int(d) for d in dims)


def observe_shapes(proto: caffe2_pb2.NetDef, params: Mapping[str, np.ndarray],
                   feeds: Mapping[str, np.ndarray]) -> list[OpShapes]:
    """Run ``proto`` op by op in a scratch workspace, recording shapes and dtypes."""
    from dpgraph.runtime import Workspace

    ws = Workspace("dpgraph-onnx-shapes", seed=0)
    for name, value in {**params, **feeds}.items():
        ws.set_blob(name, np.array(value, copy=True))
    observed = []
    for index, op in enumerate(proto.op):
        record = OpShapes()
        for blob in op.input:
            raw = ws.get_blob(blob) if ws.has_blob(blob) else None
            if raw is None:
                raise ExportError(f"op {index} ({op.type}): input {blob!r} is not available; "
                                  "declare it in `inputs` or provide it as a parameter")
            value = np.asarray(raw)
            record.inputs.append(tuple(value.shape))
            record.input_dtypes.append(value.dtype)
        plain = caffe2_pb2.OperatorDef()
        plain.CopyFrom(op)
        plain.ClearField("device_option")
        try:
            with np.errstate(all="ignore"):
                ws.run_operators_once([plain])
        except DpgraphError as error:
            raise ExportError(f"op {index} ({op.type}) failed while inferring shapes for "
                              f"export: {error}") from error
        for blob in op.output:
            value = np.asarray(ws.get_blob(blob))
            record.outputs.append(tuple(value.shape))
            record.output_dtypes.append(value.dtype)
            record.output_values.append(value)
        observed.append(record)
    return observed


def _needed(proto: caffe2_pb2.NetDef, outputs: Sequence[str]) -> list[list[bool]]:
    """needed[i][k]: is output k of op i read later (before being rewritten) or a result?"""
    result = [[False] * len(op.output) for op in proto.op]
    live = {b: True for b in outputs}
    for index in range(len(proto.op) - 1, -1, -1):
        op = proto.op[index]
        for k, blob in enumerate(op.output):
            result[index][k] = live.pop(blob, False)
        for blob in op.input:
            live[blob] = True
    return result


def _last_writer(proto: caffe2_pb2.NetDef) -> dict[str, int]:
    return {blob: index for index, op in enumerate(proto.op) for blob in op.output}


def _ssa_name(builder: OnnxBuilder, blob: str, final: bool, results: Sequence[str]) -> str:
    """ONNX name of a write of ``blob``: its own name for the last write (when free),
    a fresh ``blob__<n>`` otherwise."""
    taken_elsewhere = blob in builder.params or blob in builder.graph_inputs
    if final and blob in results and not taken_elsewhere:
        return blob
    if final and blob not in builder._taken:
        return builder.reserve(blob)
    return builder.fresh(blob)


def to_onnx(predict_net: Any, init_net_or_params: Any, inputs: Mapping[str, Any],
            opset: int = 17, outputs: Sequence[str] | None = None,
            name: str | None = None) -> Any:
    """Export a predictor to an ``onnx.ModelProto``.

    Args:
        predict_net: Net or NetDef of the inference graph.
        init_net_or_params: an init NetDef (``GivenTensor*Fill``/``ConstantFill`` ops, run with
            dpgraph's executor) or a ``{name: ndarray}`` dict.
        inputs: ``{name: (shape, dtype)}`` (or ``{name: shape}`` for float32); a dim may be
            a string (or ``None``) to make it symbolic, e.g. ``("N", 3, 8, 8)``.
        opset: ONNX opset version (13 or newer).
        outputs: graph outputs (default: the net's external outputs).
    Raises:
        ExportError: unsupported ops (all listed), missing inputs or parameters.
    """
    onnx = _import_onnx()
    from dpgraph.export.onnx_ops import CONVERTERS

    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ExportError(f"opset {opset} is not supported: use {MIN_OPSET} to "
                          f"{onnx.defs.onnx_opset_version()}")
    proto = netdef_of(predict_net, ExportError)
    check_supported(proto)
    params = _params(init_net_or_params)
    specs = _input_specs(inputs)
    result_names = [str(b) for b in (outputs if outputs is not None else proto.external_output)]
    data_inputs = [b for b in proto.external_input if b not in params]
    missing = [b for b in data_inputs if b not in specs]
    if missing:
        raise ExportError(f"net {proto.name!r} needs input(s) {missing}: give their shapes "
                          "in `inputs` or their values as parameters")
    if not result_names:
        raise ExportError(f"net {proto.name!r} declares no external outputs; pass `outputs`")
    feeds = {n: (np.ones if dt.kind == "f" else np.zeros)(_stand_in(dims), dtype=dt)
             for n, (dims, dt) in specs.items()}
    observed = observe_shapes(proto, params, feeds)
    builder = OnnxBuilder(onnx, opset)
    builder.params = {k: v for k, v in params.items() if k not in specs}
    for blob in specs:
        builder.current[blob] = builder.reserve(blob)
        builder.graph_inputs.add(blob)
    for blob in params:
        builder.reserve(blob)
    for blob in result_names:
        builder.reserve(blob)
    last = _last_writer(proto)
    needed = _needed(proto, result_names)
    for index, op in enumerate(proto.op):
        builder.op, builder.index, builder.shapes = op, index, observed[index]
        builder.args = arguments_dict(op.arg)
        builder.needed_outputs = needed[index]
        builder.output_names = [_ssa_name(builder, blob, last[blob] == index, result_names)
                                for blob in op.output]
        CONVERTERS[op.type](builder)
        for blob, onnx_name in zip(op.output, builder.output_names):
            builder.current[blob] = onnx_name
    return _assemble(builder, proto, specs, result_names, observed, name)


def _assemble(builder: OnnxBuilder, proto: caffe2_pb2.NetDef,
              specs: Mapping[str, tuple[list[int | str], np.dtype]], result_names: list[str],
              observed: list[OpShapes], name: str | None) -> Any:
    onnx = builder.onnx
    helper = onnx.helper
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(dt), dims)
                    for n, (dims, dt) in specs.items()]
    dtypes = {b: (dt, len(shape)) for op, rec in zip(proto.op, observed)
              for b, dt, shape in zip(op.output, rec.output_dtypes, rec.outputs)}
    graph_outputs = []
    for blob in result_names:
        current = builder.current.get(blob)
        if current is None:
            raise ExportError(f"output {blob!r} is not produced by net {proto.name!r}; name "
                              "blobs that an op of the net writes in `outputs`")
        if current != blob:
            if blob in specs or blob in builder.params:
                raise ExportError(f"output {blob!r} is also a graph input or parameter; "
                                  "ONNX needs distinct names")
            builder.node("Identity", [current], [blob])
        dtype, rank = dtypes.get(blob) or (specs[blob][1], len(specs[blob][0]))
        graph_outputs.append(helper.make_tensor_value_info(
            blob, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [None] * rank))
    initializers = [onnx.numpy_helper.from_array(np.asarray(v), n)
                    for n, v in builder.initializers.items()]
    graph = helper.make_graph(builder.nodes, name or proto.name or "dpgraph", graph_inputs,
                              graph_outputs, initializers)
    opset_ids = [helper.make_opsetid("", builder.opset)]
    model = helper.make_model(graph, opset_imports=opset_ids, producer_name="dpgraph",
                              ir_version=helper.find_min_ir_version_for(opset_ids))
    return model
