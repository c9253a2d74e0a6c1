"""The helper gradient makers use to build gradient ops, with Caffe2's GO/GI naming.

A maker is ``fn(g: GradientBuilder) -> None``.  It reads the forward op through ``g.op``,
``g.I(i)``, ``g.O(i)`` and the output gradients through ``g.GO(i)``; it adds gradient ops with
``g.add(...)`` and declares input gradients with ``g.GI(i)`` (dense, named ``X_grad``),
``g.GI_I(i)``/``g.GI_V(i)`` (sparse) or ``g.set_input_grad(i, value)`` (pass-through).
The autodiff layer then stamps every op with ``is_gradient_op``, the forward op's device
option and engine, and (unless the maker opted out) the forward op's arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpgraph.errors import GradientError
from dpgraph.ir.arguments import MakeArgument
from dpgraph.ir.blob import GradientSlice
from dpgraph.proto import caffe2_pb2

GradValue = str | GradientSlice | None


def make_op(op_type: str, inputs: Sequence[str], outputs: Sequence[str],
            **kwargs: Any) -> caffe2_pb2.OperatorDef:
    """An OperatorDef with plain (unscoped) blob names and encoded keyword arguments."""
    op = caffe2_pb2.OperatorDef(type=op_type)
    op.input.extend(str(b) for b in inputs)
    op.output.extend(str(b) for b in outputs)
    op.arg.extend(MakeArgument(k, v) for k, v in kwargs.items() if v is not None)
    return op


class GradientBuilder:
    """Collects the gradient ops and input gradients for one forward op."""

    def __init__(self, op: caffe2_pb2.OperatorDef, g_output: Sequence[GradValue]) -> None:
        self.op = op
        self.g_output = list(g_output)
        self.ops: list[caffe2_pb2.OperatorDef] = []
        self.g_input: list[GradValue] = [None] * len(op.input)

    # --- forward op --------------------------------------------------------------------
    def I(self, index: int) -> str:  # noqa: E743 - Caffe2's name
        return self.op.input[index]

    def O(self, index: int) -> str:  # noqa: E743 - Caffe2's name
        return self.op.output[index]

    def arg(self, name: str, default: Any = None) -> Any:
        from dpgraph.ir.arguments import argument_value

        for argument in reversed(self.op.arg):
            if argument.name == name:
                return argument_value(argument)
        return default

    # --- output gradients --------------------------------------------------------------
    def has_go(self, index: int) -> bool:
        return index < len(self.g_output) and self.g_output[index] is not None

    def go_is_sparse(self, index: int) -> bool:
        return isinstance(self.g_output[index], GradientSlice)

    def GO(self, index: int) -> str:
        value = self.g_output[index]
        if value is None or isinstance(value, GradientSlice):
            kind = "no" if value is None else "a sparse"
            raise GradientError(
                f"{self.op.type}: output {self.op.output[index]!r} has {kind} gradient but the "
                "gradient maker needs a dense one."
            )
        return str(value)

    def GO_I(self, index: int) -> str:
        return str(self._sparse_go(index).indices)

    def GO_V(self, index: int) -> str:
        return str(self._sparse_go(index).values)

    def _sparse_go(self, index: int) -> GradientSlice:
        value = self.g_output[index]
        if not isinstance(value, GradientSlice):
            raise GradientError(
                f"{self.op.type}: output {self.op.output[index]!r} needs a sparse gradient."
            )
        return value

    # --- input gradients ---------------------------------------------------------------
    def GI(self, index: int) -> str:
        """Declare and return the dense gradient name of input ``index`` (``X_grad``)."""
        name = self.op.input[index] + "_grad"
        self.g_input[index] = name
        return name

    def GI_I(self, index: int) -> str:
        """Declare a sparse input gradient; return its indices name (``X_grad_indices``)."""
        self._declare_sparse(index)
        return self.op.input[index] + "_grad_indices"

    def GI_V(self, index: int) -> str:
        """Declare a sparse input gradient; return its values name (``X_grad_values``)."""
        self._declare_sparse(index)
        return self.op.input[index] + "_grad_values"

    def _declare_sparse(self, index: int) -> None:
        base = self.op.input[index] + "_grad"
        self.g_input[index] = GradientSlice(base + "_indices", base + "_values")

    def set_input_grad(self, index: int, value: GradValue) -> None:
        """Pass an existing gradient through (e.g. ``Add``: the input grad *is* ``GO(0)``)."""
        self.g_input[index] = value

    def add(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str],
            **kwargs: Any) -> caffe2_pb2.OperatorDef:
        """Append a gradient op; keyword arguments become op arguments."""
        op = make_op(op_type, inputs, outputs, **kwargs)
        self.ops.append(op)
        return op


def build_gradient(
    op: caffe2_pb2.OperatorDef, g_output: Sequence[GradValue]
) -> tuple[list[caffe2_pb2.OperatorDef], list[GradValue]]:
    """Run ``op``'s gradient maker and stamp its ops the way Caffe2 does.

    Every gradient op gets ``is_gradient_op``, the forward op's device option and engine
    (when set) and, unless the maker opted out, the forward op's arguments after its own.
    Raises :class:`~dpgraph.errors.NoGradientError` if the op has no gradient maker.
    """
    from dpgraph.errors import NoGradientError, did_you_mean
    from dpgraph.ir.registry import OPERATORS

    schema = OPERATORS.lookup(op.type)
    if schema.gradient is None:
        with_gradients = [t for t in OPERATORS.types()
                          if (s := OPERATORS.get(t)) is not None and s.gradient is not None]
        needed = [o for o, g in zip(op.output, g_output) if g is not None]
        raise NoGradientError(
            f"Operator {op.type} has no gradient, but its output(s) {needed} need one "
            f"(inputs {list(op.input)})." + did_you_mean(op.type, with_gradients)
        )
    builder = GradientBuilder(op, g_output)
    schema.gradient(builder)
    for grad_op in builder.ops:
        grad_op.is_gradient_op = True
        if op.HasField("device_option"):
            grad_op.device_option.CopyFrom(op.device_option)
        if op.engine:
            grad_op.engine = op.engine
        if schema.gradient_copies_arguments:
            grad_op.arg.extend(op.arg)
    return builder.ops, builder.g_input
