"""Caffe2's ``functional``: ``Functional.<OpType>(*inputs, **args)`` runs one operator
eagerly on numpy inputs in a temporary workspace and returns its outputs as a named
tuple (indexable by position or by name, ``out["output_0"]``)."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from dpgraph.errors import ArgumentError
from dpgraph.ir.device import DeviceOption
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.scope import DeviceScope
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime.c_api import OpSchema, TriggerLazyImport
from dpgraph.runtime.workspace import Workspace


def namedtupledict(typename: str, field_names: list[str], *args: Any, **kwargs: Any) -> Any:
    """A namedtuple type whose instances are also indexable by field name."""
    index = {name: i for i, name in enumerate(field_names)}
    kwargs.setdefault("rename", True)
    data = namedtuple(typename, field_names, *args, **kwargs)  # type: ignore[misc]

    def getitem(self: Any, key: Any) -> Any:
        if isinstance(key, str):
            key = index[key]
        return tuple.__getitem__(self, key)

    setattr(data, "__getitem__", getitem)  # noqa: B010  (mypy refuses method assignment)
    return data


def _names(prefix: str, num: int, max_num: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(min(num, max_num))]


def _output_names(op_type: str, schema: OpSchema, num_input: int,
                  args: dict[str, Any]) -> list[str]:
    if "num_output" in args:
        num_output = args.pop("num_output")
        if not (schema.min_output <= num_output <= schema.max_output
                and schema.num_outputs_allowed(num_output)
                and schema.num_inputs_outputs_allowed(num_input, num_output)):
            raise ArgumentError(f"Functional C2: Number of output not in range: "
                                f"{schema.min_output} - {schema.max_output} or not allowed "
                                f"(op {op_type}, num_output={num_output})")
        return _names("output_", num_output, schema.max_output)
    calculated = schema.CalculateOutput(num_input)
    if calculated != -1:
        return _names("output_", calculated, schema.max_output)
    if schema.max_output == schema.inf:
        raise ArgumentError(f"For operators with max_output == inf, user should pass "
                            f"num_output explicitly (op {op_type}).")
    return _names("output_", schema.max_output, schema.max_output)


def run_functional(op_type: str, inputs: tuple[Any, ...], args: dict[str, Any]) -> Any:
    """Run ``op_type`` once on ``inputs``; the outputs as a namedtupledict."""
    schema = OpSchema.get(op_type)
    if schema is None:
        raise AttributeError(f"Functional: {op_type} is not a registered operator.")
    input_names = _names("input_", len(inputs), schema.max_input)
    num_input = len(input_names)
    if not (schema.min_input <= num_input <= schema.max_input
            and schema.num_inputs_allowed(num_input)):
        raise ArgumentError(f"Functional C2: Number of inputs not in range: "
                            f"{schema.min_input} - {schema.max_input} or not allowed (op "
                            f"{op_type}, {len(inputs)} inputs)")
    args = dict(args)
    output_names = _output_names(op_type, schema, num_input, args)
    for i in range(len(input_names)):
        for j in range(len(output_names)):
            if schema.inplace_enforced(i, j):
                output_names[j] = input_names[i]
    op = CreateOperator(op_type, input_names, output_names, **args)
    device_option = args.get("device_option", DeviceOption(caffe2_pb2.PROTO_CPU))
    ws = Workspace("functional")
    with DeviceScope(device_option):
        for name, value in zip(input_names, inputs):
            ws.feed_blob(name, value)
        ws.run_operators_once([op])
        values = [ws.fetch_blob(name) for name in output_names]
    return namedtupledict("output", output_names)(*values)


class _Functional:
    """``Functional.<OpType>(*inputs, **args)``."""

    def __getattribute__(self, op_type: str) -> Any:
        if op_type.startswith("__"):
            return object.__getattribute__(self, op_type)

        def op_func(*inputs: Any, **args: Any) -> Any:
            return run_functional(op_type, inputs, args)

        return op_func

    def __dir__(self) -> list[str]:
        from dpgraph.ir.registry import OPERATORS

        TriggerLazyImport()
        return sorted(set(OPERATORS.types()))


Functional = _Functional()

__all__ = ["Functional", "namedtupledict"]
