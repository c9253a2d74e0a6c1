"""Caffe2's ``utils`` module: argument encoding and small helpers."""

from typing import Any

from dpgraph.ir.arguments import MakeArgument, argument_value

OPTIMIZER_ITERATION_NAME = "optimizer_iteration"
ITERATION_MUTEX_NAME = "iteration_mutex"


def ArgsToDict(args: Any) -> dict[str, Any]:
    """``{name: value}`` for a list of Argument protos."""
    return {a.name: argument_value(a) for a in args}


def BuildUniqueMutexIter(init_net: Any, net: Any, iter: Any = None, iter_mutex: Any = None,
                         iter_val: int = 0) -> Any:
    """The shared int64 iteration counter and its AtomicIter (see dpgraph.optimizer)."""
    from dpgraph.modeling.optimizer.base import BuildUniqueMutexIter as build

    return build(init_net, net, iter, iter_mutex, iter_val)


__all__ = ["ArgsToDict", "BuildUniqueMutexIter", "ITERATION_MUTEX_NAME", "MakeArgument",
           "OPTIMIZER_ITERATION_NAME"]
