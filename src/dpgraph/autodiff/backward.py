"""The backward pass: Caffe2's ``core.IR`` and ``GetBackwardPass``.

Forward ops are visited in reverse.  An op's gradient maker runs only when one of its outputs
has a gradient (or it is a ``ZeroGradient``); the gradient ops it makes may only read blobs
at the versions the forward op saw.  When a blob version is read by several ops, its
gradient pieces are added up right after the gradient ops of its first reader::

    FC(x, w, b) -> fc; AveragedLoss(fc) -> loss        GetBackwardPass(ops, ["loss"]):
                                                       ConstantFill(loss) -> loss_autogen_grad
                                                       AveragedLossGradient(fc, ...) -> fc_grad
                                                       FCGradient(x, w, fc_grad)
                                                           -> w_grad, b_grad, x_grad
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from dpgraph.autodiff.accumulate import (
    IS_AUTO_GEN_SUM_OPS_TAG,
    ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG,
    Generator,
    GradGenMeta,
    SparseGradGenMeta,
    grad_op_generators,
    make_sum_ops,
    pass_through_generators,
    verify_generators,
)
from dpgraph.autodiff.ssa import SSA, GradValue
from dpgraph.errors import BlobNameError
from dpgraph.ir.blob import BlobReference, GradientSlice, blob_name
from dpgraph.ir.operator import CreateOperator
from dpgraph.proto import caffe2_pb2

if TYPE_CHECKING:
    from dpgraph.autodiff.registry import GradientRegistry

GradMap = dict[str, GradValue]


def normalize_ys(ys: Any) -> dict[Any, Any]:
    """``{y: given gradient or None}`` from a list of blobs or a dict; keys are checked to
    be blob names and kept as given (a plain string y gets the name scope for its fill)."""
    if isinstance(ys, (list, tuple)):
        ys = dict.fromkeys(ys)
    if not isinstance(ys, dict):
        raise BlobNameError(
            f"ys should either be a list of blobs or a dict {{blob: gradient or None}}, got "
            f"{type(ys).__name__} {ys!r}.")
    for y in ys:
        blob_name(y, "a y of the backward pass")
    return ys


def to_blob_references(grads: GradMap) -> dict[BlobReference, Any]:
    """The public gradient map: BlobReference keys and values, ``None`` entries dropped."""
    result: dict[BlobReference, Any] = {}
    for name, grad in grads.items():
        if isinstance(grad, GradientSlice):
            result[BlobReference(name)] = GradientSlice(BlobReference(grad.indices),
                                                        BlobReference(grad.values))
        elif grad is not None:
            result[BlobReference(name)] = BlobReference(grad)
    return result


class IR(SSA):
    """A forward pass in SSA form that can build its own backward pass.

    ``IS_AUTO_GEN_SUM_OPS_TAG`` marks (``"is_auto_gen_sum_ops:1"`` in extra_info) the Sum /
    Concat ops accumulation adds; a generator whose device option carries
    ``"only_keep_is_auto_gen_sum_ops_tag:1"`` makes them keep a default device option.
    """

    IS_AUTO_GEN_SUM_OPS_TAG = IS_AUTO_GEN_SUM_OPS_TAG
    ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG = ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG

    def __init__(self, operators: Iterable[caffe2_pb2.OperatorDef],
                 registry: GradientRegistry | None = None) -> None:
        from dpgraph.autodiff.registry import GRADIENT_REGISTRY

        self.registry = registry if registry is not None else GRADIENT_REGISTRY
        self.gradient_generators: defaultdict[str, defaultdict[int, list[Generator]]] = (
            defaultdict(lambda: defaultdict(list)))
        super().__init__(operators)

    def GetBackwardPass(self, ys: Any) -> tuple[list[caffe2_pb2.OperatorDef],
                                                dict[BlobReference, Any]]:
        """The gradient ops for ``ys`` and ``{blob: gradient}`` for every blob reached.

        Args:
            ys: a list of blobs (each gets an all-ones gradient from a ``ConstantFill``,
                which comes first) or a dict ``{blob: gradient blob or None}``.
        """
        ys = normalize_ys(ys)
        for y in map(blob_name, ys):
            version = self.frontier.setdefault(y, 0)
            self.gradient_frontier[y] = version
            self.input_usages[y][version].append(len(self.ssa))
        all_ops, grads = self._init_gradients(ys)
        for fwd_op_idx in reversed(range(len(self.ssa))):
            new_grads, grad_ops = self._gradients_for_op(fwd_op_idx, grads)
            grads.update(new_grads)
            all_ops.extend(grad_ops)
            sum_ops, summed = self.DoGradientAccumulation(fwd_op_idx)
            grads.update(summed)
            all_ops.extend(sum_ops)
        return all_ops, to_blob_references(grads)

    # --- steps -------------------------------------------------------------------------
    def _init_gradients(self, ys: dict[Any, Any]) -> tuple[list[caffe2_pb2.OperatorDef],
                                                           GradMap]:
        from dpgraph.autodiff.registry import normalize_gradient

        ops: list[caffe2_pb2.OperatorDef] = []
        grads: GradMap = {}
        for y_blob, given in ys.items():
            y = blob_name(y_blob)
            version = self.frontier[y]
            if given is None:
                fill = CreateOperator("ConstantFill", [y_blob], [y + "_autogen_grad"],
                                      value=1.0)
                ops.append(fill)
                grads[y] = fill.output[0]
                generator: Generator = GradGenMeta(fill, 0, fill.output[0], fill.device_option)
            else:
                grad = grads[y] = normalize_gradient(given)
                # A given gradient is one more piece if y is also read by other ops.
                generator = (SparseGradGenMeta(None, 0, None, 0, grad)
                             if isinstance(grad, GradientSlice)
                             else GradGenMeta(None, 0, str(grad)))
            self.gradient_generators[y][version].append(generator)
        return ops, grads

    def _gradients_for_op(self, fwd_op_idx: int, grads: GradMap
                          ) -> tuple[GradMap, list[caffe2_pb2.OperatorDef]]:
        op = self.ssa[fwd_op_idx].op
        inputs, outputs = self.blob_names[fwd_op_idx]
        g_output = [grads.get(name) for name in outputs]
        if g_output.count(None) == len(g_output) and op.type != "ZeroGradient":
            return {}, []
        grad_ops, g_input = self.registry.GetGradientForOp(op, g_output)
        self.BuildGradientGenerators(fwd_op_idx, grad_ops, g_output, g_input)
        new_grads: GradMap = {}
        for name, grad in zip(inputs, g_input):
            # Keep a known gradient unless this op (in place) wrote the blob.
            if grad is not None or name not in grads or name in outputs:
                new_grads[name] = grad
        return new_grads, grad_ops

    def BuildGradientGenerators(self, fwd_op_idx: int,
                                gradient_ops: Sequence[caffe2_pb2.OperatorDef],
                                g_output: Sequence[GradValue],
                                g_input: Sequence[GradValue]) -> None:
        """Check the gradient ops' inputs and record where each input gradient comes from."""
        entry = self.ssa[fwd_op_idx]
        inputs = self.blob_names[fwd_op_idx][0]
        grad_names = [(grad_op.input[:], grad_op.output[:]) for grad_op in gradient_ops]
        locally_generated: set[str] = set()
        check = self.CheckGradientOperatorInput
        for grad_inputs, grad_outputs in grad_names:
            for name in grad_inputs:
                check(name, g_output, fwd_op_idx, locally_generated)
            locally_generated.update(grad_outputs)
        found = grad_op_generators(entry.op, gradient_ops, g_input, inputs, grad_names)
        found += pass_through_generators(entry.op, g_input, locally_generated, inputs)
        generators, in_versions = self.gradient_generators, entry.in_versions
        for input_name, generator in found:
            generators[input_name][in_versions[input_name]].append(generator)
        for input_name, grad in zip(inputs, g_input):
            if grad is not None:
                self.gradient_frontier[input_name] = in_versions[input_name]

    def DoGradientAccumulation(self, fwd_op_idx: int
                               ) -> tuple[list[caffe2_pb2.OperatorDef], GradMap]:
        """Sum the gradient pieces of every input version whose first reader is this op."""
        entry = self.ssa[fwd_op_idx]
        sum_ops: list[caffe2_pb2.OperatorDef] = []
        summed: GradMap = {}
        for name in dict.fromkeys(self.blob_names[fwd_op_idx][0]):
            version = entry.in_versions[name]
            usages = self.input_usages[name][version]
            if len(usages) <= 1 or usages[0] != fwd_op_idx:
                continue
            generators = self.gradient_generators[name][version]
            if not verify_generators(name, generators):
                continue
            ops, summed[name] = make_sum_ops(name, generators)
            sum_ops.extend(ops)
        return sum_ops, summed


def GetBackwardPass(operators: Iterable[caffe2_pb2.OperatorDef], ys: Any
                    ) -> tuple[list[caffe2_pb2.OperatorDef], dict[BlobReference, Any]]:
    """The gradient ops of ``operators`` for ``ys`` and the gradient map.

    ``ys`` is a list of blobs (all-ones gradients are made for them) or a dict
    ``{blob: gradient or None}``.  The map has a BlobReference key for every blob that got
    a gradient; values are BlobReferences or GradientSlices of them.
    """
    return IR(operators).GetBackwardPass(ys)
