"""SSA bookkeeping for the backward pass: blob versions, usages and the version checks.

Every time an op writes a blob, the blob's version goes up by one (a blob first seen as an
op input is at version 0, so writing it makes version 1).  Gradient ops run after the whole
forward pass, so they can only read forward blobs at their *final* version; a gradient op
that needs an older version (an input or output that a later op overwrote) is an error.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dpgraph.errors import GradientError, StopGradientError
from dpgraph.ir.blob import GradientSlice
from dpgraph.proto import caffe2_pb2

GradValue = str | GradientSlice | None


@dataclass
class OpSSA:
    """A forward op with the versions of the blobs it read and wrote."""

    op: caffe2_pb2.OperatorDef
    in_versions: dict[str, int]
    out_versions: dict[str, int]


def gradient_index(g_output: Sequence[GradValue], name: str) -> int | None:
    """The output whose (dense or sparse) gradient is called ``name``, if any."""
    for index, grad in enumerate(g_output):
        if type(grad) is str:  # the common case first
            if grad == name:
                return index
        elif isinstance(grad, GradientSlice):
            if name in (str(grad.indices), str(grad.values)):
                return index
        elif grad is not None and str(grad) == name:
            return index
    return None


def _op_summary(op: caffe2_pb2.OperatorDef) -> str:
    return f"{op.type}({list(op.input)} -> {list(op.output)})"


class SSA:
    """Blob versions of a list of forward ops (Caffe2's ``core.IR`` forward bookkeeping).

    Attributes:
        ssa: one :class:`OpSSA` per forward op.
        input_usages: ``{blob: {version: [indices of the ops reading it]}}``.
        frontier: the latest version of every blob after the forward pass.
        gradient_frontier: the version of each blob whose gradient is currently known.
    """

    def __init__(self, operators: Iterable[caffe2_pb2.OperatorDef]) -> None:
        self.ssa: list[OpSSA] = []
        self.input_usages: defaultdict[str, defaultdict[int, list[int]]] = defaultdict(
            lambda: defaultdict(list))
        self.frontier: dict[str, int] = {}
        self.gradient_frontier: dict[str, int] = {}
        self.out_version_history: defaultdict[str, list[tuple[caffe2_pb2.OperatorDef, int]]] = (
            defaultdict(list))
        self.in_version_history: defaultdict[str, list[tuple[caffe2_pb2.OperatorDef, int]]] = (
            defaultdict(list))
        #: each op's input and output names, read once (protobuf fields are slow to read)
        self.blob_names: list[tuple[list[str], list[str]]] = []
        operators = list(operators)
        for op in operators:
            self.Play(op)
        self.SanityCheck(operators)

    def Play(self, op: caffe2_pb2.OperatorDef) -> None:
        """Record ``op``: it reads the current versions and bumps those it writes."""
        inputs, outputs = op.input[:], op.output[:]
        index, frontier = len(self.ssa), self.frontier
        usages, in_history = self.input_usages, self.in_version_history
        in_versions: dict[str, int] = {}
        for name in inputs:
            version = frontier.setdefault(name, 0)
            in_versions[name] = version
            usages[name][version].append(index)
            in_history[name].append((op, version))
        out_history = self.out_version_history
        out_versions: dict[str, int] = {}
        for name in outputs:
            version = frontier[name] + 1 if name in frontier else 0
            frontier[name] = out_versions[name] = version
            out_history[name].append((op, version))
        self.ssa.append(OpSSA(op, in_versions, out_versions))
        self.blob_names.append((inputs, outputs))

    def SanityCheck(self, operators: Iterable[caffe2_pb2.OperatorDef]) -> None:
        """A StopGradient whose output nobody reads is almost certainly a mistake."""
        for op in operators:
            if op.type == "StopGradient" and op.output[0] not in self.input_usages:
                raise StopGradientError(
                    f"StopGradient's output {op.output[0]!r} is orphan: no op reads it, so "
                    "the gradient is not stopped anywhere. You typically want the same blob "
                    f"as input and output (StopGradient([{op.input[0]!r}], "
                    f"[{op.input[0]!r}])). Op: {_op_summary(op)}"
                )

    # --- version checks ----------------------------------------------------------------
    def _history(self, name: str, direction: str) -> str:
        history = (self.out_version_history if direction == "out"
                   else self.in_version_history).get(name, [])
        lines = [f"  version ({direction}) {version} <-- {_op_summary(op)}"
                 for op, version in history]
        return (f"\nVersion history of blob {name!r} (was the same blob written twice by "
                "different ops?):\n" + "\n".join(lines))

    def CheckGradientOperatorInput(self, grad_op_input: str, g_output: Sequence[GradValue],
                                   fwd_op_idx: int, locally_generated: set[str]) -> None:
        """Raise :class:`GradientError` if a gradient op of op ``fwd_op_idx`` cannot read
        ``grad_op_input``: it must be an output gradient of the current version, a forward
        input/output at the version the forward op saw, or made by an earlier gradient op
        of the same forward op."""
        entry = self.ssa[fwd_op_idx]
        index = gradient_index(g_output, grad_op_input)
        if index is not None:
            output = self.blob_names[fwd_op_idx][1][index]
            current = self.gradient_frontier.get(output)
            if current != entry.out_versions[output]:
                raise GradientError(
                    f"Gradient name {grad_op_input!r} is expected to correspond to version "
                    f"{entry.out_versions[output]} of {output!r}, but currently we have "
                    f"version {current}{self._where(fwd_op_idx)}." + self._history(output, "out"))
        elif grad_op_input in entry.out_versions:
            self._check_forward_version(grad_op_input, entry.out_versions, "output", fwd_op_idx)
        elif grad_op_input in entry.in_versions:
            self._check_forward_version(grad_op_input, entry.in_versions, "input", fwd_op_idx)
        elif grad_op_input not in locally_generated:
            raise GradientError(
                f"Blob {grad_op_input!r} read by a gradient op is neither an input, output or "
                f"output gradient of the forward op nor made by one of its earlier gradient "
                f"ops{self._where(fwd_op_idx)}.")

    def _where(self, fwd_op_idx: int) -> str:
        """The forward op an error is about (made only when raising)."""
        return f" (gradient of op #{fwd_op_idx} {_op_summary(self.ssa[fwd_op_idx].op)})"

    def _check_forward_version(self, name: str, versions: dict[str, int], kind: str,
                               fwd_op_idx: int) -> None:
        if self.frontier[name] != versions[name]:
            raise GradientError(
                f"Gradient operator needs {kind} {name!r} at version {versions[name]}, but "
                f"currently we have version {self.frontier[name]}: a later op overwrote it"
                f"{self._where(fwd_op_idx)}. Write that op's result to a new blob instead of "
                f"reusing {name!r}." + self._history(name, "out"))
