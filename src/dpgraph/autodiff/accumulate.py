"""Gradient accumulation: where a blob version's gradient pieces come from, and the ``Sum``
(dense) or ``Concat`` (sparse) ops that add them up.

A *generator* records who makes one piece of a blob's gradient: an output of a gradient op,
or a gradient passed straight through from an output (``Add``-like makers, given
gradients).  When a blob version is read by several ops, the pieces are renamed apart and
added::

    in -> h1 (Direct), in -> h2 (Direct)       backward:
                                               DirectGradient(h2_grad) -> in_grad
                                               DirectGradient(h1_grad) -> _in_grad_autosplit_0
                                               Sum(in_grad, _in_grad_autosplit_0) -> in_grad
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dpgraph.errors import GradientError
from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.device import device_name, device_option_equal
from dpgraph.ir.operator import CreateOperator
from dpgraph.proto import caffe2_pb2

IS_AUTO_GEN_SUM_OPS_TAG = "is_auto_gen_sum_ops"
ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG = "only_keep_is_auto_gen_sum_ops_tag"


def _empty_option() -> caffe2_pb2.DeviceOption:
    return caffe2_pb2.DeviceOption()


@dataclass
class GradGenMeta:
    """A dense gradient piece: output ``idx`` of ``grad_op``, or ``gradient`` passed through
    (``grad_op`` None)."""

    grad_op: caffe2_pb2.OperatorDef | None
    idx: int
    gradient: str
    device_option: caffe2_pb2.DeviceOption = field(default_factory=_empty_option)


@dataclass
class SparseGradGenMeta:
    """A sparse gradient piece; indices and values may come from different ops (or be
    passed through, op None)."""

    grad_op_indices: caffe2_pb2.OperatorDef | None
    idx_indices: int
    grad_op_values: caffe2_pb2.OperatorDef | None
    idx_values: int
    gradient: GradientSlice
    device_option: caffe2_pb2.DeviceOption = field(default_factory=_empty_option)


Generator = GradGenMeta | SparseGradGenMeta


# --- collecting generators -----------------------------------------------------------------
Names = Sequence[tuple[Sequence[str], Sequence[str]]]


def _names_of(ops: Sequence[caffe2_pb2.OperatorDef]) -> list[tuple[list[str], list[str]]]:
    return [(op.input[:], op.output[:]) for op in ops]


def _gradient_writes(grad_ops: Sequence[caffe2_pb2.OperatorDef],
                     names: Names | None = None) -> list[tuple[int, int, str]]:
    """``(op index, output position, name)`` of every output of the gradient ops
    (``names``: their input and output names, when already read).

    Two ops writing the same name are two pieces (``Mul(x, x)``), except that an op
    updating a name in place (reading and writing it) refines the earlier piece.
    """
    writes: list[tuple[int, int, str]] = []
    for k, (inputs, outputs) in enumerate(names if names is not None else _names_of(grad_ops)):
        for i, name in enumerate(outputs):
            if name in inputs:
                writes = [w for w in writes if w[2] != name]
            writes.append((k, i, name))
    return writes


def _input_of_gradient(g_input: Sequence[object], name: str) -> int | None:
    for index, grad in enumerate(g_input):
        if type(grad) is str:  # the common case first
            if grad == name:
                return index
        elif isinstance(grad, GradientSlice):
            if name in (grad.indices, grad.values):
                return index
        elif grad is not None and grad == name:
            return index
    return None


def grad_op_generators(
    forward_op: caffe2_pb2.OperatorDef, grad_ops: Sequence[caffe2_pb2.OperatorDef],
    g_input: Sequence[str | GradientSlice | None], forward_inputs: Sequence[str] | None = None,
    grad_names: Names | None = None,
) -> list[tuple[str, Generator]]:
    """``(input name, generator)`` for every input gradient a gradient op writes
    (``forward_inputs``, ``grad_names``: the ops' blob names, when already read).

    The indices and values of one sparse gradient merge into one generator.
    """
    if forward_inputs is None:
        forward_inputs = forward_op.input[:]
    found: list[tuple[str, Generator]] = []
    sparse: dict[str, SparseGradGenMeta] = {}
    for k, i, name in _gradient_writes(grad_ops, grad_names):
        index = _input_of_gradient(g_input, name)
        if index is None:
            continue
        grad, op, input_name = g_input[index], grad_ops[k], forward_inputs[index]
        if not isinstance(grad, GradientSlice):
            found.append((input_name, GradGenMeta(op, i, name, op.device_option)))
            continue
        meta = sparse.get(input_name)
        if meta is None:
            meta = sparse[input_name] = SparseGradGenMeta(None, 0, None, 0, grad,
                                                          op.device_option)
            found.append((input_name, meta))
        if name == grad.indices:
            meta.grad_op_indices, meta.idx_indices = op, i
        else:
            meta.grad_op_values, meta.idx_values = op, i
    return found


def pass_through_generators(
    forward_op: caffe2_pb2.OperatorDef, g_input: Sequence[str | GradientSlice | None],
    locally_generated: set[str], forward_inputs: Sequence[str] | None = None,
) -> list[tuple[str, Generator]]:
    """Generators for input gradients no gradient op writes (passed through from outputs)."""
    found: list[tuple[str, Generator]] = []
    inputs = forward_inputs if forward_inputs is not None else forward_op.input[:]
    for input_name, grad in zip(inputs, g_input):
        if grad is None:
            continue
        if isinstance(grad, GradientSlice):
            if not {grad.indices, grad.values} & locally_generated:
                found.append((input_name, SparseGradGenMeta(
                    None, 0, None, 0, grad, forward_op.device_option)))
        elif grad not in locally_generated:
            found.append((input_name, GradGenMeta(None, 0, grad, forward_op.device_option)))
    return found


# --- verifying -----------------------------------------------------------------------------
def _describe(generator: Generator) -> str:
    ops = ([generator.grad_op] if isinstance(generator, GradGenMeta)
           else [generator.grad_op_indices, generator.grad_op_values])
    made_by = ", ".join(op.type for op in ops if op is not None) or "passed through"
    return f"{generator.gradient} ({made_by}, {device_name(generator.device_option)})"


def verify_generators(blob: str, generators: Sequence[Generator]) -> bool:
    """True if the pieces must be summed; raise if they cannot be (mixed kinds, devices)."""
    if len({type(g) for g in generators}) > 1:
        pieces = ", ".join(_describe(g) for g in generators)
        raise GradientError(
            f"Gradients for param ''{blob}'' failed to verify: automatic aggregation of a mix "
            f"of sparse and dense gradients is not supported yet (pieces: {pieces}). Make "
            "every consumer of the blob produce the same kind of gradient (e.g. densify the "
            "sparse one with SparseToDense, or use a sparse op for every use).")
    if len(generators) < 2:
        return False
    options = [g.device_option for g in generators if g.device_option.ByteSize()]
    if any(not device_option_equal(option, options[0]) for option in options[1:]):
        pieces = ", ".join(_describe(g) for g in generators)
        raise GradientError(
            f"Gradients for param ''{blob}'' failed to verify: Unexpected behavior: not all "
            f"grad ops have the same device option (pieces: {pieces}). A blob read on "
            "several devices needs an explicit Copy per device so each gradient stays on "
            "one device.")
    return True


# --- sum ops -------------------------------------------------------------------------------
def _remove_suffix(name: str, suffix: str) -> str:
    return name[: -len(suffix)] if name.endswith(suffix) else name


def sum_output_name(generators: Sequence[Generator], blob: str) -> str:
    """The accumulated gradient's name: that of the first gradient op's piece."""
    for g in generators:
        if isinstance(g, GradGenMeta):
            if g.grad_op is not None:
                return g.grad_op.output[g.idx]
        elif g.grad_op_indices is not None:
            return _remove_suffix(g.grad_op_indices.output[g.idx_indices], "_indices")
        elif g.grad_op_values is not None:
            return _remove_suffix(g.grad_op_values.output[g.idx_values], "_values")
    return blob + "_grad"


def _rename_apart(op: caffe2_pb2.OperatorDef, idx: int, count: int) -> str:
    """Rename output ``idx`` of an emitted gradient op (and, for an ``If`` gradient op, the
    same output inside its then/else nets) to ``_<name>_autosplit_<count>``."""
    old = op.output[idx]
    new = f"_{old}_autosplit_{count}"
    op.output[idx] = new
    if op.type == "If":
        _rename_in_branches(op, old, new)
    return new


def _rename_in_branches(op: caffe2_pb2.OperatorDef, old: str, new: str) -> None:
    for arg in op.arg:
        if arg.name in ("then_net", "else_net") and arg.HasField("n"):
            for inner in arg.n.op:
                inner.output[:] = [new if b == old else b for b in inner.output]
            arg.n.external_output[:] = [new if b == old else b
                                        for b in arg.n.external_output]


def _dense_sum(generators: Sequence[GradGenMeta],
               out_name: str) -> tuple[list[caffe2_pb2.OperatorDef], str]:
    """``Sum`` of the pieces into ``out_name``: the first gradient op's piece keeps its name,
    later gradient ops' pieces are renamed ``_<name>_autosplit_<k>`` (in place, on the ops
    already emitted), passed-through pieces join as they are."""
    inputs: list[str] = []
    count = 0
    first = True
    for g in generators:
        if g.grad_op is None:
            if g.gradient == out_name:
                raise GradientError(
                    "The gradient output of empty gradient op can not be the same as the "
                    f"normal name of the current input gradient: {g.gradient!r} is passed "
                    f"through unchanged and also written by a gradient op (pieces: "
                    f"{', '.join(_describe(x) for x in generators)}). Give the passed-in "
                    "gradient another name.")
            inputs.append(g.gradient)
        elif first:
            first = False
            inputs.append(g.grad_op.output[g.idx])
        else:
            inputs.append(_rename_apart(g.grad_op, g.idx, count))
            count += 1
    if out_name in inputs:  # Sum is in place only on input 0
        k = inputs.index(out_name)
        inputs[0], inputs[k] = inputs[k], inputs[0]
    op = CreateOperator("Sum", [BlobReference(x) for x in inputs], [BlobReference(out_name)])
    return [op], out_name


def _sparse_sum(generators: Sequence[SparseGradGenMeta],
                out_name: str) -> tuple[list[caffe2_pb2.OperatorDef], GradientSlice]:
    indices: list[str] = []
    values: list[str] = []
    count_i = count_v = 0
    for g in generators:
        if g.grad_op_indices is not None:
            indices.append(_rename_apart(g.grad_op_indices, g.idx_indices, count_i))
            count_i += 1
        else:
            indices.append(str(g.gradient.indices))
        if g.grad_op_values is not None:
            values.append(_rename_apart(g.grad_op_values, g.idx_values, count_v))
            count_v += 1
        else:
            values.append(str(g.gradient.values))
    # Concatenate without deduplicating indices; optimizers deduplicate when they need to.
    ops = [CreateOperator("Concat", [BlobReference(x) for x in pieces],
                          [BlobReference(f"{out_name}_{part}_concat"),
                           BlobReference(f"{out_name}_{part}_concat_split")], axis=0)
           for part, pieces in (("indices", indices), ("values", values))]
    return ops, GradientSlice(f"{out_name}_indices_concat", f"{out_name}_values_concat")


def _set_sum_device(ops: Sequence[caffe2_pb2.OperatorDef],
                    generators: Sequence[Generator]) -> None:
    keep_tag_only = any(f"{ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG}:1" in g.device_option.extra_info
                        for g in generators)
    for op in ops:
        if not keep_tag_only:
            op.device_option.CopyFrom(generators[0].device_option)
        op.device_option.extra_info.append(f"{IS_AUTO_GEN_SUM_OPS_TAG}:1")


def make_sum_ops(blob: str, generators: Sequence[Generator]
                 ) -> tuple[list[caffe2_pb2.OperatorDef], str | GradientSlice]:
    """The ops adding up ``generators`` (renaming gradient-op outputs apart in place) and
    the name of the accumulated gradient."""
    out_name = sum_output_name(generators, blob)
    ops: list[caffe2_pb2.OperatorDef]
    grad: str | GradientSlice
    if isinstance(generators[0], GradGenMeta):
        ops, grad = _dense_sum([g for g in generators if isinstance(g, GradGenMeta)], out_name)
    else:
        ops, grad = _sparse_sum(
            [g for g in generators if isinstance(g, SparseGradGenMeta)], out_name)
    _set_sum_device(ops, generators)
    return ops, grad
