"""Ops that fail on purpose, for testing executors and error paths: ``ThrowException``,
``ThrowChildThreadException`` (both raise) and ``Fail`` (reports failure without raising, so
``RunNet(..., allow_fail=True)`` returns False)."""

from __future__ import annotations

import threading

from dpgraph.errors import OperatorError, OperatorFailedError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient


@register_op("ThrowException", inputs=0, outputs=0, side_effects=True)
def throw_exception(ctx: OpContext) -> Outputs:
    """Raise an error carrying ``message``."""
    raise OperatorError(ctx.describe(ctx.str_arg("message", "Exception from ThrowExceptionOp")))


@register_op("ThrowChildThreadException", inputs=0, outputs=0, side_effects=True)
def throw_child_thread_exception(ctx: OpContext) -> Outputs:
    """Raise ``message`` in a child thread and re-raise it in the op's thread after joining."""
    message = ctx.str_arg("message", "Exception from ThrowChildThreadExceptionOp")
    caught: list[BaseException] = []

    def child() -> None:
        try:
            raise OperatorError(ctx.describe(message))
        except OperatorError as error:
            caught.append(error)

    thread = threading.Thread(target=child, name="ThrowChildThreadException")
    thread.start()
    thread.join()
    raise caught[0]


@register_op("Fail", inputs=0, outputs=0, side_effects=True)
def fail(ctx: OpContext) -> Outputs:
    """Report failure (Caffe2's op returning false)."""
    raise OperatorFailedError(ctx.describe("the Fail op reports failure"))


for _type in ("ThrowException", "ThrowChildThreadException", "Fail"):
    register_gradient(_type)(no_gradient)
