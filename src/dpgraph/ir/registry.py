"""Operator schemas and the registries the op families fill.

Each op family module (``dpgraph/ops/*.py``) registers, side by side, an op's schema, its
numpy kernel and its gradient maker::

    @register_op("Relu", inputs=1, outputs=1, inplace=[(0, 0)])
    def relu(ctx: OpContext) -> Outputs:
        (x,) = ctx.inputs
        return (ctx.xp.maximum(x, 0),)

    @register_gradient("Relu")
    def relu_gradient(g: GradientBuilder) -> None:
        g.add("ReluGradient", [g.O(0), g.GO(0)], [g.GI(0)])

Registries are objects (not class state); they refuse duplicates and answer a miss with
"did you mean".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dpgraph.errors import OperatorSchemaError, UnknownOperatorError, did_you_mean

Kernel = Callable[..., Any]
GradientMaker = Callable[..., Any]
ShapeFn = Callable[..., Any]
Arity = int | tuple[int, int | None]


def _arity_range(arity: Arity) -> tuple[int, int | None]:
    return (arity, arity) if isinstance(arity, int) else arity


@dataclass
class OpSchema:
    """What dpgraph knows about one operator type.

    Attributes:
        type: the operator type (``"FC"``).
        min_inputs/max_inputs, min_outputs/max_outputs: arity (``None`` = unbounded).
        inplace: allowed ``(input, output)`` in-place pairs, or ``"any"``.
        side_effects: the op must never be dropped by a pass (collectives, Iter, Print).
        kernel: ``fn(ctx) -> outputs`` run by the executors.
        gradient: gradient maker (see :mod:`dpgraph.autodiff`); ``None`` = no gradient.
        shape_fn: ``fn(op, input_shapes, input_types) -> [(shape, dtype) | None, ...]``.
        cross_device: the op may read blobs living on other devices (copies, collectives);
            the runtime skips its placement check.
        collective: a communication op (NCCL*, Gloo collectives, common worlds, Barrier):
            drawn highlighted, counted by ``testing.collectives``, kept in order by passes.
        peer_inputs: the op may name blobs of another GPU, read through peer access
            (Parallelize gathers sparse gradients with Concat); the verifier and
            Parallelize's operator analysis allow it, the runtime still checks peer access.
        inputs_from_outputs: outputs whose previous value the kernel reads (``Iter``).
        empty_inputs: input indices that may be an empty blob (created, never written): the
            kernel gets None and initialises it (``LastNWindowCollector``'s buffer).
        mutex_input: index of an input holding a ``CreateMutex`` blob that the runtime holds
            while it reads the inputs, runs the kernel and stores the outputs (``AtomicAppend``).
    """

    type: str
    min_inputs: int = 0
    max_inputs: int | None = None
    min_outputs: int = 0
    max_outputs: int | None = None
    inplace: frozenset[tuple[int, int]] | str = frozenset()
    side_effects: bool = False
    kernel: Kernel | None = None
    gradient: GradientMaker | None = None
    gradient_copies_arguments: bool = True
    shape_fn: ShapeFn | None = None
    cross_device: bool = False
    collective: bool = False
    peer_inputs: bool = False
    empty_inputs: frozenset[int] = frozenset()
    mutex_input: int | None = None
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def allows_inplace(self, input_index: int, output_index: int) -> bool:
        """True if input ``input_index`` may share its blob with ``output_index``."""
        return self.inplace == "any" or (input_index, output_index) in self.inplace

    def check_arity(self, num_inputs: int, num_outputs: int) -> str | None:
        """A description of an arity violation, or ``None`` if the counts fit."""
        for what, count, low, high in (
            ("inputs", num_inputs, self.min_inputs, self.max_inputs),
            ("outputs", num_outputs, self.min_outputs, self.max_outputs),
        ):
            if count < low or (high is not None and count > high):
                expected = str(low) if low == high else f"{low}..{'' if high is None else high}"
                return f"{self.type} takes {expected} {what}, got {count}"
        return None


class OperatorRegistry:
    """Operator schemas by type."""

    def __init__(self) -> None:
        self._schemas: dict[str, OpSchema] = {}

    def add(self, schema: OpSchema) -> OpSchema:
        if schema.type in self._schemas:
            raise OperatorSchemaError(
                f"Operator {schema.type!r} is already registered; each op type is registered "
                "by exactly one family module, so give the new op another name.")
        self._schemas[schema.type] = schema
        return schema

    def __contains__(self, op_type: object) -> bool:
        return op_type in self._schemas

    def get(self, op_type: str) -> OpSchema | None:
        return self._schemas.get(op_type)

    def lookup(self, op_type: str) -> OpSchema:
        """The schema of ``op_type``; an unknown type raises with "did you mean"."""
        schema = self._schemas.get(op_type)
        if schema is None:
            raise UnknownOperatorError(
                f"Operator type {op_type!r} is not registered in dpgraph."
                + did_you_mean(op_type, self._schemas)
            )
        return schema

    def require_method(self, op_type: str) -> None:
        """Raise Caffe2's error for ``net.<op_type>(...)`` when ``op_type`` is not registered."""
        if op_type not in self._schemas:
            raise UnknownOperatorError(
                f"Method {op_type} is not a registered operator."
                + did_you_mean(op_type, self._schemas)
            )

    def types(self) -> list[str]:
        return sorted(self._schemas)

    def __len__(self) -> int:
        return len(self._schemas)


OPERATORS = OperatorRegistry()


class ExtensionRegistry:
    """Functions that IR methods delegate to but that live in a higher layer, by name.

    Caffe2 kept the backward pass on ``core.Net``; in dpgraph the logic lives in
    :mod:`dpgraph.autodiff`, which registers ``"backward_pass"`` here when it is imported
    (``import dpgraph`` imports it), so ``Net.AddGradientOperators`` needs no upward import.
    """

    def __init__(self) -> None:
        self._functions: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, function: Callable[..., Any]) -> None:
        if name in self._functions:
            raise OperatorSchemaError(f"IR extension {name!r} is already registered; "
                                      "each extension is provided by exactly one module.")
        self._functions[name] = function

    def lookup(self, name: str) -> Callable[..., Any]:
        function = self._functions.get(name)
        if function is None:
            raise UnknownOperatorError(
                f"IR extension {name!r} is not registered; import dpgraph (the package "
                "registers every extension) rather than dpgraph.ir alone."
                + did_you_mean(name, self._functions))
        return function


NET_EXTENSIONS = ExtensionRegistry()


def register_op(
    op_type: str,
    inputs: Arity = (0, None),
    outputs: Arity = (0, None),
    inplace: Iterable[tuple[int, int]] | str = (),
    side_effects: bool = False,
    shape: ShapeFn | None = None,
    cross_device: bool = False,
    doc: str = "",
    collective: bool = False,
    peer_inputs: bool = False,
    empty_inputs: Iterable[int] = (),
    mutex_input: int | None = None,
) -> Callable[[Kernel], Kernel]:
    """Decorator registering a kernel together with its op schema (see :class:`OpSchema`
    for the flags)."""
    min_in, max_in = _arity_range(inputs)
    min_out, max_out = _arity_range(outputs)

    def decorate(kernel: Kernel) -> Kernel:
        OPERATORS.add(OpSchema(
            type=op_type, min_inputs=min_in, max_inputs=max_in, min_outputs=min_out,
            max_outputs=max_out,
            inplace=inplace if isinstance(inplace, str) else frozenset(inplace),
            side_effects=side_effects, kernel=kernel, shape_fn=shape,
            cross_device=cross_device, collective=collective, peer_inputs=peer_inputs,
            empty_inputs=frozenset(empty_inputs), mutex_input=mutex_input,
            doc=doc or (kernel.__doc__ or "").strip(),
        ))
        return kernel

    return decorate


def register_gradient(
    op_type: str, copy_arguments: bool = True
) -> Callable[[GradientMaker], GradientMaker]:
    """Decorator attaching a gradient maker to a registered op.

    ``copy_arguments=False`` opts out of appending the forward op's arguments to the
    gradient ops (Caffe2's ``CopyArguments() == false``).
    """

    def decorate(maker: GradientMaker) -> GradientMaker:
        schema = OPERATORS.lookup(op_type)
        if schema.gradient is not None:
            raise OperatorSchemaError(f"Operator {op_type!r} already has a gradient maker; "
                                      "register one gradient maker per op type.")
        schema.gradient = maker
        schema.gradient_copies_arguments = copy_arguments
        return maker

    return decorate
