"""Compare dpgraph's gradient ops with the ones Caffe2 recorded (``grad_N.pb``).

For each case with recorded gradient ops whose op dpgraph implements, the gradient ops built
for ``op.pb`` must equal the recorded ones in type, inputs, outputs and arguments.  Prints
``golden grads: N passed, M failed, K skipped of 80``.
"""

from __future__ import annotations

import pytest
from _golden import GRADIENTS, case_names, load_case

from dpgraph.ir.arguments import raw_argument_value
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.proto import caffe2_pb2


def output_gradients(op: caffe2_pb2.OperatorDef,
                     recorded: list[caffe2_pb2.OperatorDef]) -> list[str | None]:
    """The output gradients Caffe2 was given: ``<output>_grad`` where a grad op reads it."""
    read = {blob for grad_op in recorded for blob in grad_op.input}
    return [out + "_grad" if out + "_grad" in read else None for out in op.output]


def summary(op: caffe2_pb2.OperatorDef) -> tuple[object, ...]:
    arguments = tuple(sorted((a.name, repr(raw_argument_value(a))) for a in op.arg))
    return (op.type, list(op.input), list(op.output), arguments)


def grad_case_names() -> list[str]:
    return [name for name in case_names() if load_case(name).grad_files]


@pytest.mark.parametrize("case_name", grad_case_names() or ["<golden data absent>"])
def test_golden_gradient_ops(case_name: str) -> None:
    GRADIENTS.run(check_case, case_name)


def check_case(case_name: str) -> None:
    case = load_case(case_name)
    op = case.op()
    schema = OPERATORS.get(op.type)
    if schema is None or schema.kernel is None:
        pytest.skip(f"op {op.type} not implemented")
    recorded = case.grad_ops()
    grad_ops, _ = build_gradient(op, output_gradients(op, recorded))
    assert [summary(g) for g in grad_ops] == [summary(r) for r in recorded]
    assert all(g.is_gradient_op for g in grad_ops)
