"""The one pass driver: :func:`run_passes` runs a list of declared passes over one model.

A pass is a function of the :class:`~dpgraph.parallel.state.ParallelState` wrapped in a
:class:`Pass` that declares its contract: which config fields, state fields and nets it
``reads``, which it ``writes``, whether it calls user code (builders, transformers, the
optimizer builder) and when it runs (``enabled``).  Passes write only to the state and to the
nets they rewrite; :func:`~dpgraph.parallel.state.publish` is the one place model attributes
are set.  The driver, for ``Parallelize``, ``Parallelize_BMUF`` and the shared-model path:

1. validates the call (nothing is mutated before it passes);
2. snapshots the model (:mod:`dpgraph.parallel.transaction`);
3. runs each enabled pass in order, publishing first before any pass that calls user code;
4. publishes the results onto the model;
5. in debug mode (``ParallelConfig.verify``, or ``DPGRAPH_DEBUG=1`` in the environment):
   checks each pass against its declared ``writes`` and verifies every output net with
   :func:`dpgraph.ir.verify`;
6. on any exception restores the model exactly as it was and re-raises.

Adding a pass is one line in a pass list (``pipeline.TRAINING_PASSES`` for Parallelize,
``bmuf.BMUF_PASSES`` for BMUF), with its contract declared where it is defined::

    @parallel_pass(reads=("config.devices", "grad_names"), writes=("net", "grad_names"),
                   enabled=lambda config: config.bucket_mb > 0)
    def bucket_gradients(state: ParallelState) -> None:
        ...

    TRAINING_PASSES = (..., _infer_devices, bucket_gradients, _reduce_gradients, ...)

Contract names: ``config.<field>`` (read-only), a field of the state (a
:class:`ParallelState` or a subclass such as BMUF's), ``net`` and ``param_init_net`` (the
model's nets), ``model`` (params and other model state, written by user code and the
shared-model pruning).  In debug mode a pass that changes a state field or net its
``writes`` do not name fails (passes that call user code may change anything).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dpgraph.errors import ParallelizeError, VerificationError
from dpgraph.ir.net import shared_creation_stack
from dpgraph.ir.verify import verify_problems
from dpgraph.parallel.config import ParallelConfig
from dpgraph.parallel.state import ParallelState, publish
from dpgraph.parallel.transaction import take_snapshot
from dpgraph.parallel.validate import validate_call

log = logging.getLogger("dpgraph.parallel")

#: The model's nets a pass may declare it writes.
NETS = ("net", "param_init_net")


def _always(config: ParallelConfig) -> bool:
    return True


@dataclass(frozen=True)
class Pass:
    """One step of a pipeline and its declared contract."""

    run: Callable[[Any], None]  # a function of a ParallelState (or of a subclass)
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    user_code: bool = False
    enabled: Callable[[ParallelConfig], bool] = _always

    @property
    def name(self) -> str:
        return self.run.__name__

    def __call__(self, state: ParallelState) -> None:
        self.run(state)


def parallel_pass(reads: Iterable[str] = (), writes: Iterable[str] = (),
                  user_code: bool = False,
                  enabled: Callable[[ParallelConfig], bool] = _always
                  ) -> Callable[[Callable[[Any], None]], Pass]:
    """Declare a function of the state as a :class:`Pass` with its contract."""
    def declare(run: Callable[[Any], None]) -> Pass:
        return Pass(run, tuple(reads), tuple(writes), user_code, enabled)
    return declare


def debug_mode(config: ParallelConfig) -> bool:
    """Contract checks and output verification: ``config.verify`` or ``DPGRAPH_DEBUG=1``."""
    return config.verify or os.environ.get("DPGRAPH_DEBUG", "") not in ("", "0")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the graph is built.

    Building a large graph allocates hundreds of thousands of small objects and no
    garbage cycles; full collections would rescan the growing heap again and again and
    make the pass superlinear in the number of devices.  On the way out the objects are
    promoted without a scan (:func:`_promote_young_objects`).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            _promote_young_objects()
            gc.enable()


def _promote_young_objects() -> None:
    """Move every tracked object to the oldest generation without scanning it.

    The build makes no garbage cycles, but the allocation count it leaves would make the
    first allocation after ``gc.enable()`` scan everything it allocated (a young-generation
    collection of ~4 objects per output op: 19 ms for 16 devices, 75 ms for 64).
    ``gc.freeze()`` + ``gc.unfreeze()`` splices the generations into the oldest one and
    resets the count in O(1); any cycle among them is still freed, by the next full
    collection.  Skipped when the program froze objects itself (unfreezing would undo it).
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


# --- debug mode: contracts and verification ----------------------------------------------------
def _frozen(value: Any) -> Any:
    """A comparable copy of the containers in ``value`` (leaves are kept as they are)."""
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(value)
    return value


def _observed(state: ParallelState) -> dict[str, Any]:
    """What a pass may change, for the contract check: state fields and the nets' bytes."""
    seen: dict[str, Any] = {f.name: _frozen(getattr(state, f.name))
                            for f in dataclasses.fields(state)
                            if f.name not in ("model", "config")}
    for name in NETS:
        seen[name] = getattr(state.model, name).Proto().SerializeToString()
    return seen


def _check_contract(pass_: Pass, before: dict[str, Any], after: dict[str, Any]) -> None:
    changed = sorted(k for k in before if before[k] != after[k])
    undeclared = [k for k in changed if k not in pass_.writes]
    if undeclared and not pass_.user_code:
        raise ParallelizeError(
            f"Parallelize pass {pass_.name} changed {undeclared}, which its contract does not "
            f"declare (writes={list(pass_.writes)}); declare them or leave them alone.")


def _known_blobs(init_protos: Sequence[Any]) -> set[str]:
    known: set[str] = set()
    for proto in init_protos:
        known.update(proto.external_input)
        for op in proto.op:
            known.update(op.output)
    return known


def verify_outputs(state: ParallelState) -> None:
    """:func:`dpgraph.ir.verify` every net the model runs (init nets first)."""
    model = state.model
    init = [n.Proto() for n in state.init_nets] or [model.param_init_net.Proto()]
    runs = [(n[0] if isinstance(n, tuple) else n).Proto() for n in state.nets] or [
        model.net.Proto()]
    problems = []
    for proto in init:
        problems += [f"{proto.name}: {p}" for p in verify_problems(proto)]
    known = _known_blobs(init)
    for proto in runs:
        problems += [f"{proto.name}: {p}" for p in verify_problems(proto, known)]
    if problems:
        raise VerificationError("Parallelize produced nets that do not verify:\n  "
                                + "\n  ".join(problems))


# --- the driver -----------------------------------------------------------------------------
def _run_one(pass_: Pass, state: ParallelState, debug: bool) -> None:
    if pass_.user_code:
        publish(state)
    before = _observed(state) if debug else None
    with shared_creation_stack():  # the ops' creation stacks share this frame's callers
        pass_.run(state)
    if before is not None:
        _check_contract(pass_, before, _observed(state))
    log.debug("Parallelize pass %s done", pass_.name)


def run_passes(model: Any, config: ParallelConfig, passes: Sequence[Pass],
               state: ParallelState | None = None,
               validate: Callable[[Any, ParallelConfig], None] | None = validate_call
               ) -> ParallelState:
    """Validate, snapshot, run ``passes`` in order, publish, verify (debug mode); on any
    exception restore ``model`` exactly as it was and re-raise.

    Args:
        model: the ModelHelper to rewrite.
        config: the frozen configuration every pass reads.
        passes: the pipeline; disabled passes (``enabled(config)`` false) are skipped.
        state: a prepared state (a ParallelState subclass for pipelines with more
            results); by default a fresh ``ParallelState(model, config)``.
        validate: the up-front check (nothing is mutated before it passes); ``None`` when
            the caller has validated already.
    """
    if validate is not None:
        validate(model, config)
    snapshot = take_snapshot(model)
    state = ParallelState(model=model, config=config) if state is None else state
    debug = debug_mode(config)
    with _gc_paused():
        try:
            for pass_ in passes:
                if pass_.enabled(config):
                    _run_one(pass_, state, debug)
            publish(state)
            if debug:
                verify_outputs(state)
        except BaseException:
            snapshot.restore()
            raise
    return state
