"""Caffe2's ``core.GradientRegistry``: per-op gradient lookup with a Python fallback.

Gradient makers normally live with their op family (``@register_gradient`` stores them on
the op schema; :func:`~dpgraph.ops.gradient_builder.build_gradient` runs and stamps them).
As in Caffe2, Python code may also register makers of the form
``fn(op, g_output) -> (grad_ops, g_input)``; those are consulted only when the schema has
no maker (Caffe2 tries its C++ registry first), and their ops are used as returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dpgraph.errors import GradientError, NoGradientError, OperatorSchemaError, did_you_mean
from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.proto import caffe2_pb2

GradValue = str | GradientSlice | None

#: Ops Caffe2 registers with ``NO_GRADIENT``: a gradient reaching them silently stops (their
#: inputs get none).  Used only when neither the schema nor Python registers a maker.
CAFFE2_NO_GRADIENT_OPS = frozenset({
    "StopGradient", "Iter", "AtomicIter", "LearningRate",
    "ConstantFill", "UniformFill", "UniformIntFill", "UniqueUniformFill", "GaussianFill",
    "XavierFill", "MSRAFill", "RangeFill", "LengthsRangeFill", "DiagonalFill",
    "GivenTensorFill", "GivenTensorDoubleFill", "GivenTensorBoolFill", "GivenTensorIntFill",
    "GivenTensorInt64Fill", "GivenTensorStringFill",
})

PythonMaker = Callable[[caffe2_pb2.OperatorDef, list[GradValue]], tuple[Any, Any]]


def normalize_gradient(value: Any) -> GradValue:
    """A gradient as plain strings: None, ``"x_grad"`` or GradientSlice of two strings."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, GradientSlice) or (isinstance(value, tuple) and len(value) == 2):
        return GradientSlice(str(value[0]), str(value[1]))
    if isinstance(value, (str, BlobReference)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise GradientError(
        f"A gradient must be a blob name or a GradientSlice(indices, values), got "
        f"{type(value).__name__} {value!r}.")


def _as_op_list(ops: Any) -> list[caffe2_pb2.OperatorDef]:
    if ops is None:
        return []
    if isinstance(ops, caffe2_pb2.OperatorDef):
        return [ops]
    return list(ops)


class GradientRegistry:
    """Gradient lookup for single ops, plus the Python-registered makers.

    Use the shared instance ``dpgraph.core.GradientRegistry`` the way Caffe2's class is
    used::

        @core.GradientRegistry.RegisterGradient("MyOp")
        def my_op_gradient(op, g_output):
            return [CreateOperator("MyOpGradient", [g_output[0]], [op.input[0] + "_grad"])], \
                [op.input[0] + "_grad"]
    """

    def __init__(self) -> None:
        self.gradient_registry_: dict[str, PythonMaker] = {}
        self.no_gradient_: set[str] = set(CAFFE2_NO_GRADIENT_OPS)

    def RegisterGradient(self, op_type: str) -> Callable[[PythonMaker], PythonMaker]:
        """Decorator registering a Python gradient maker for ``op_type``."""

        def decorate(maker: PythonMaker) -> PythonMaker:
            if op_type in self.gradient_registry_:
                raise OperatorSchemaError(
                    f"A Python gradient for {op_type!r} is already registered.")
            self.gradient_registry_[op_type] = maker
            return maker

        return decorate

    def NoGradient(self, op_type: str) -> None:
        """Declare that gradients stop at ``op_type`` (Caffe2's ``NO_GRADIENT``)."""
        self.no_gradient_.add(op_type)

    def has_gradient(self, op_type: str) -> bool:
        """True if ``op_type`` has a schema or Python gradient maker."""
        schema = OPERATORS.get(op_type)
        return (schema is not None and schema.gradient is not None) or (
            op_type in self.gradient_registry_)

    def GetGradientForOp(self, op: caffe2_pb2.OperatorDef, g_output: Sequence[Any]
                         ) -> tuple[list[caffe2_pb2.OperatorDef], list[GradValue]]:
        """The gradient ops of ``op`` and its input gradients, given output gradients.

        The schema's maker is tried first (after checking the op against its schema);
        Python-registered makers only when that fails.  Ops declared ``NO_GRADIENT``
        without a maker give no gradient ops and no input gradients.
        """
        g_output = [normalize_gradient(g) for g in g_output]
        schema = OPERATORS.get(op.type)
        problem = None
        if schema is not None and schema.gradient is not None:
            problem = schema.check_arity(len(op.input), len(op.output))
            if problem is None:
                grad_ops, g_input = build_gradient(op, g_output)
                for grad_op in grad_ops:  # C++ makers always set the (empty) name
                    grad_op.name = grad_op.name
                return grad_ops, [normalize_gradient(g) for g in g_input]
        maker = self.gradient_registry_.get(op.type)
        if maker is not None:
            grad_ops, g_input = maker(op, list(g_output))
            return _as_op_list(grad_ops), [normalize_gradient(g) for g in g_input]
        if op.type in self.no_gradient_:
            return [], [None] * len(op.input)
        if problem is not None:
            raise GradientError(
                f"Operator def did not pass schema checking while creating its gradient: "
                f"{problem} (op {op.type}, inputs {list(op.input)}, outputs "
                f"{list(op.output)}). Fix the op's inputs/outputs to match its schema.")
        raise self._no_gradient(op, g_output)

    def _no_gradient(self, op: caffe2_pb2.OperatorDef,
                     g_output: Sequence[GradValue]) -> NoGradientError:
        needed = [name for name, g in zip(op.output, g_output) if g is not None]
        known = "" if op.type in OPERATORS else " (it is not even a registered operator)"
        with_gradients = [t for t in self._types_with_gradients() if t != op.type]
        return NoGradientError(
            f"Operator {op.type}{known} has no gradient, but its output(s) {needed} need one "
            f"(inputs {list(op.input)}). Stop the gradient before it (StopGradient) or "
            f"register a gradient maker for {op.type}."
            + did_you_mean(op.type, with_gradients))

    def _types_with_gradients(self) -> Iterable[str]:
        for op_type in OPERATORS.types():
            schema = OPERATORS.get(op_type)
            if schema is not None and schema.gradient is not None:
                yield op_type
        yield from self.gradient_registry_

    def GetBackwardPass(self, operators: Iterable[caffe2_pb2.OperatorDef], ys: Any,
                        ys_generate_gradient: bool = False
                        ) -> tuple[list[caffe2_pb2.OperatorDef], dict[BlobReference, Any]]:
        """The backward pass of ``operators`` for ``ys`` (see :meth:`IR.GetBackwardPass`).

        ``ys_generate_gradient`` is accepted for Caffe2 compatibility; the ys' gradients
        are always in the returned map.
        """
        from dpgraph.autodiff.backward import IR

        return IR(operators, registry=self).GetBackwardPass(ys)


#: The process-wide registry (``dpgraph.core.GradientRegistry``).
GRADIENT_REGISTRY = GradientRegistry()
