"""Test-only operators of Caffe2's ``core_gradients_test.py`` and helpers to compare op lists.

``Direct`` passes every output gradient straight to ``DirectGradient``; ``UseInput`` and
``UseOutput`` make gradient ops that read the forward input/output; ``Nogradient`` has a
maker that makes nothing; ``TestSparseHash`` makes both parts of a sparse gradient with one
op (like Caffe2's SparseFunHash).  Registration is guarded so re-imports do not register
twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpgraph.errors import GradientError
from dpgraph.ir.registry import OPERATORS, register_gradient, register_op
from dpgraph.ops.context import OpContext
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2

TEST_OPS = ("Direct", "UseInput", "UseOutput", "Nogradient", "TestSparseHash", "Directt",
            "TestTwoOutputs")
GRADIENT_OPS = ("DirectGradient", "UseInputGradient", "UseOutputGradient",
                "TestSparseHashGradient", "TestTwoOutputsGradient")


def _unused_kernel(ctx: OpContext) -> tuple[object, ...]:
    raise NotImplementedError(f"{ctx.op.type} is a structure-only test op")


def _direct_gradient(g: GradientBuilder) -> None:
    if not all(g.has_go(i) for i in range(len(g.op.output))):
        raise GradientError("Direct needs the gradients of all its outputs")
    g.add("DirectGradient", [g.GO(i) for i in range(len(g.op.output))],
          [g.GI(i) for i in range(len(g.op.input))])


def _use_input_gradient(g: GradientBuilder) -> None:
    g.add("UseInputGradient", [g.I(0), g.GO(0)], [g.GI(0)])


def _use_output_gradient(g: GradientBuilder) -> None:
    g.add("UseOutputGradient", [g.O(0), g.GO(0)], [g.GI(0)])


def _nogradient_gradient(g: GradientBuilder) -> None:
    """Makes nothing: the inputs get no gradient."""


def _sparse_hash_gradient(g: GradientBuilder) -> None:
    g.add("TestSparseHashGradient", [g.GO(0), g.I(0)], [g.GI_I(1), g.GI_V(1)])


def _two_outputs_gradient(g: GradientBuilder) -> None:
    # Like LSTMUnit: the gradient of the second output (the cell) must be known.
    g.add("TestTwoOutputsGradient", [g.GO(0), g.GO(1)], [g.GI(0)])


def register_test_ops() -> None:
    """Register the test ops once per process."""
    if "Direct" in OPERATORS:
        return
    for op_type in TEST_OPS + GRADIENT_OPS:
        register_op(op_type)(_unused_kernel)
    register_gradient("Direct")(_direct_gradient)
    register_gradient("UseInput")(_use_input_gradient)
    register_gradient("UseOutput")(_use_output_gradient)
    register_gradient("Nogradient")(_nogradient_gradient)
    register_gradient("TestSparseHash")(_sparse_hash_gradient)
    register_gradient("TestTwoOutputs")(_two_outputs_gradient)


register_test_ops()


def op(op_type: str, inputs: str | Sequence[str], outputs: str | Sequence[str],
       device: caffe2_pb2.DeviceOption | None = None, **kwargs: object
       ) -> caffe2_pb2.OperatorDef:
    """An OperatorDef with exactly these (unscoped) names."""
    result = caffe2_pb2.OperatorDef(type=op_type)
    result.input.extend([inputs] if isinstance(inputs, str) else inputs)
    result.output.extend([outputs] if isinstance(outputs, str) else outputs)
    if device is not None:
        result.device_option.CopyFrom(device)
    from dpgraph.ir.arguments import MakeArgument

    result.arg.extend(MakeArgument(k, v) for k, v in kwargs.items())
    return result


Expected = tuple[str, Sequence[str], Sequence[str]]


def summarize(ops: Sequence[caffe2_pb2.OperatorDef]) -> list[tuple[str, list[str], list[str]]]:
    return [(o.type, list(o.input), list(o.output)) for o in ops]


def assert_ops(actual: Sequence[caffe2_pb2.OperatorDef], expected: Sequence[Expected]) -> None:
    """Compare type, inputs and outputs of every op, in order."""
    want = [(t, [i] if isinstance(i, str) else list(i), [o] if isinstance(o, str) else list(o))
            for t, i, o in expected]
    assert summarize(actual) == want
