"""Caffe2's ``utils`` module: argument encoding and small helpers."""

from typing import Any

from dpgraph.ir.arguments import MakeArgument, argument_value

OPTIMIZER_ITERATION_NAME = "optimizer_iteration"
ITERATION_MUTEX_NAME = "iteration_mutex"


def ArgsToDict(args: Any) -> dict[str, Any]:
    """``{name: value}`` for a list of Argument protos."""
    return {a.name: argument_value(a) for a in args}


__all__ = ["ArgsToDict", "ITERATION_MUTEX_NAME", "MakeArgument", "OPTIMIZER_ITERATION_NAME"]
