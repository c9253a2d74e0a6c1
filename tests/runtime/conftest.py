"""Runtime test fixtures: a clean current workspace and no virtual GPUs around each test,
plus a few test-only operators (registered once, under names no family uses)."""

from __future__ import annotations

import numpy as np
from _workspace import clean_runtime  # noqa: F401  (autouse)

from dpgraph.errors import ShapeError
from dpgraph.ir.registry import OPERATORS, register_op
from dpgraph.ops.context import OpContext, Outputs


def _register_test_ops() -> None:
    if "RtTestFail" in OPERATORS:
        return

    @register_op("RtTestFail", inputs=(0, None), outputs=(0, None))
    def fail(ctx: OpContext) -> Outputs:
        raise ShapeError(ctx.describe("test failure"))

    @register_op("RtTestRandom", inputs=0, outputs=1)
    def random(ctx: OpContext) -> Outputs:
        return (ctx.rng.standard_normal(ctx.ints_arg("shape", [3])).astype(np.float32),)

    @register_op("RtTestWrongArity", inputs=1, outputs=1)
    def wrong_arity(ctx: OpContext) -> Outputs:
        return (ctx.inputs[0], ctx.inputs[0])

    @register_op("RtTestIntArg", inputs=1, outputs=1)
    def int_arg(ctx: OpContext) -> Outputs:
        return (ctx.inputs[0] * ctx.int_arg("k"),)


_register_test_ops()


