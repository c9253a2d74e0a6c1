"""The one op-property table: collective / cross_device / side_effects / peer_inputs flags on
OpSchema, read through dpgraph.ir.analysis (and re-exported by dpgraph.testing)."""

from __future__ import annotations

import pytest

import dpgraph  # noqa: F401  (registers every operator)
from dpgraph import testing
from dpgraph.ir import analysis
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.registry import OPERATORS, register_op

COLLECTIVES = [
    "Allreduce", "Broadcast", "Reduce", "Allgather", "ReduceScatter", "Barrier",
    "NCCLAllreduce", "NCCLBroadcast", "NCCLReduce", "NCCLAllGather",
    "CreateCommonWorld", "CloneCommonWorld", "DestroyCommonWorld",
]


def test_collective_flag_is_set_on_exactly_the_communication_ops() -> None:
    flagged = sorted(t for t in OPERATORS.types() if OPERATORS.lookup(t).collective)
    assert flagged == sorted(COLLECTIVES)
    for op_type in COLLECTIVES:
        assert OPERATORS.lookup(op_type).side_effects, op_type


@pytest.mark.parametrize("op_type", ["Allreduce", "NCCLAllreduce", "Barrier"])
def test_is_collective_takes_a_type_or_an_op(op_type: str) -> None:
    assert analysis.is_collective(op_type)
    assert analysis.is_collective(CreateOperator(op_type, ["a", "b"], ["b"]))


def test_dpm_sum_is_a_collective_only_as_an_op() -> None:
    assert analysis.is_collective(CreateOperator("Sum", ["a", "b"], ["a"], name="dpm"))
    assert not analysis.is_collective(CreateOperator("Sum", ["a", "b"], ["a"]))
    assert not analysis.is_collective("Sum")
    assert not analysis.is_collective("NoSuchOp")


def test_cross_device_side_effects_and_peer_reads() -> None:
    assert analysis.is_cross_device("CopyGPUToCPU") and not analysis.is_cross_device("FC")
    assert analysis.has_side_effects("Iter") and not analysis.has_side_effects("Relu")
    assert not analysis.is_cross_device("Concat")  # the runtime still checks peer access
    for op_type in ("Concat", "Copy", "NCCLReduce"):
        assert analysis.may_name_other_devices(op_type), op_type
    assert not analysis.may_name_other_devices("FC")


def test_a_new_op_declares_its_flags_at_registration() -> None:
    @register_op("_TestOnlyRingAllreduce", inputs=1, outputs=1, side_effects=True,
                 cross_device=True, collective=True)
    def _kernel(ctx):  # pragma: no cover - never run
        return (ctx.inputs[0],)

    try:
        assert analysis.is_collective("_TestOnlyRingAllreduce")
        assert analysis.may_name_other_devices("_TestOnlyRingAllreduce")
    finally:
        del OPERATORS._schemas["_TestOnlyRingAllreduce"]


def test_testing_reexports_the_analysis_helpers() -> None:
    for name in ("is_collective", "collectives", "ops_by_device", "count_ops", "op_types"):
        assert getattr(testing, name) is getattr(analysis, name), name
