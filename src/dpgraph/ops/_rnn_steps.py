"""Step workspaces for RecurrentNetwork: chained blob look-up and a small step-net runner.

Caffe2 runs a recurrent step net in child workspaces: step workspace t -> the shared-blobs
workspace -> the op's workspace.  A read resolves to the first level holding the name; a
write goes to the first level already holding it, else to the step workspace itself, so
forward activations stay local to their step while parameters, states and accumulated
gradients live in the op's workspace.  :class:`ScratchWorkspaces` is the opaque value of the
op's ``step_workspaces`` output and persists across runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterator, MutableMapping
from typing import Any

import numpy as np

from dpgraph.errors import BlobNotFoundError, DpgraphError, OperatorError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops import observing
from dpgraph.ops.context import OpContext
from dpgraph.proto import caffe2_pb2


class BlobChain(MutableMapping[str, Any]):
    """Blobs of a workspace chain; ``levels[0]`` is the innermost (local) level."""

    __slots__ = ("levels",)

    def __init__(self, levels: list[dict[str, Any]]) -> None:
        self.levels = levels

    def __getitem__(self, name: str) -> Any:
        for level in self.levels:
            if name in level:
                return level[name]
        raise KeyError(name)

    def __setitem__(self, name: str, value: Any) -> None:
        for level in self.levels:
            if name in level:
                level[name] = value
                return
        self.levels[0][name] = value

    def __delitem__(self, name: str) -> None:
        for level in self.levels:
            if name in level:
                del level[name]
                return
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(name in level for level in self.levels)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for level in self.levels:
            for name in level:
                if name not in seen:
                    seen.add(name)
                    yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)


def parent_blobs(workspace: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (blobs, placement) dicts of the workspace an op runs in (runtime Workspace, a
    step workspace, or a test harness that only has ``blobs``)."""
    if workspace is None:
        return {}, {}
    blobs = getattr(workspace, "_blobs", None)
    if blobs is None:
        blobs = getattr(workspace, "blobs", None)
    if blobs is None:
        blobs = {}
    placement = getattr(workspace, "_placement", None)
    return blobs, ({} if placement is None else placement)


class StepWorkspace:
    """One step workspace: local blobs chained to the shared and the op's workspace."""

    def __init__(self, local: dict[str, Any], chain: BlobChain, rng: Any) -> None:
        self.local = local
        self._blobs = chain
        self._placement: dict[str, Any] = {}
        self.rng = rng
        self.nets: dict[Any, Any] = {}

    def get_blob_or_none(self, name: str, device: Any = None) -> Any:
        return self._blobs.get(name)


class ScratchWorkspaces:
    """The value of RecurrentNetwork's last output: the per-step workspaces and the
    shared-blobs workspace, kept across runs (Caffe2's ``detail::ScratchWorkspaces``)."""

    def __init__(self, parent: dict[str, Any], rng: Any) -> None:
        self.parent = parent
        self.shared: dict[str, Any] = {}
        self.steps: list[StepWorkspace] = []
        self.rng = rng
        self.plans: dict[Any, Any] = {}

    def __repr__(self) -> str:
        return (f"<ScratchWorkspaces: {len(self.steps)} step workspaces, a C++ native class of "
                "type caffe2::detail::ScratchWorkspaces>")

    def ensure(self, count: int) -> None:
        """Grow (never shrink) to at least ``count`` step workspaces."""
        while len(self.steps) < count:
            local: dict[str, Any] = {}
            chain = BlobChain([local, self.shared, self.parent])
            self.steps.append(StepWorkspace(local, chain, self.rng))


class StepOp:
    """One instantiated step-net operator."""

    __slots__ = ("op", "kernel", "ctx", "inputs", "outputs")

    def __init__(self, op: caffe2_pb2.OperatorDef, workspace: StepWorkspace, xp: Any,
                 default_device: caffe2_pb2.DeviceOption) -> None:
        schema = OPERATORS.lookup(op.type)
        problem = schema.check_arity(len(op.input), len(op.output))
        if problem or schema.kernel is None:
            raise OperatorError(f"step-net op {op.type} (inputs {list(op.input)}, outputs "
                                f"{list(op.output)}): {problem or 'has no kernel in dpgraph'}")
        self.op = op
        self.kernel = schema.kernel
        device = op.device_option if op.HasField("device_option") else default_device
        self.ctx = OpContext(op, arguments_dict(op.arg), xp, device, workspace)
        self.inputs = tuple(op.input)
        self.outputs = tuple(op.output)


def compile_net(ops: list[caffe2_pb2.OperatorDef], workspace: StepWorkspace, xp: Any,
                device: caffe2_pb2.DeviceOption) -> list[StepOp]:
    return [StepOp(op, workspace, xp, device) for op in ops]


def run_step_ops(step_ops: list[StepOp], blobs: BlobChain, where: str,
                 watched: Container[str] = (), on_write: Callable[[str], None] | None = None
                 ) -> None:
    """Run ``step_ops`` in order on ``blobs``; a failure names the step-net op and ``where``
    (the RecurrentNetwork op and timestep).  ``on_write(name)`` runs right after an op wrote
    a blob in ``watched`` (links write through before the next op reads)."""
    for index, step in enumerate(step_ops):
        try:
            values = [blobs[name] for name in step.inputs]
        except KeyError as missing:
            raise BlobNotFoundError(
                f"{where}: step-net op {index} ({step.op.type}) reads blob {missing.args[0]!r}, "
                "which is neither a step blob, a link, a state nor a blob of the op's "
                "workspace; pass it to the recurrent op as an input (a reference).") from None
        ctx = step.ctx
        ctx.inputs = values
        start = time.perf_counter() if observing.ACTIVE else 0.0
        try:
            outs = step.kernel(ctx)
        except Exception as error:
            raise _step_failure(error, f"{where}: step-net op {index} ({step.op.type}, inputs "
                                       f"{list(step.inputs)}, outputs {list(step.outputs)}) "
                                       f"failed") from error
        finally:
            ctx.inputs = []
            if start:
                observing.report(step, time.perf_counter() - start)
        for name, value in zip(step.outputs, outs):
            blobs[name] = np.asarray(value) if isinstance(value, np.generic) else value
            if on_write is not None and name in watched:
                on_write(name)


def _step_failure(error: Exception, message: str) -> Exception:
    """``error`` re-raised with the step context; dpgraph error classes are kept."""
    if isinstance(error, DpgraphError):
        try:
            return type(error)(f"{message}: {error}")
        except TypeError:
            pass
    return OperatorError(f"{message}: {type(error).__name__}: {error}")
