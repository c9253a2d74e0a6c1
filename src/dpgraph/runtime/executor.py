"""Executors: ``simple`` (ops in order) and ``dag`` (a dependency-driven thread pool).

The DAG executor runs an op as soon as the previous writers of its inputs, the previous
writers and readers of its outputs and the writers of its ``control_input`` blobs are done;
ops with side effects also keep their relative order.  Every op reads exactly the values it
would read in order, so both executors give bitwise the same results.

Scheduling costs little on the critical path: the calling thread runs the first root's
chain itself (no hand-off, and its arrays come from the main allocator arena, not a worker
thread's, which would map fresh pages every step); a thread that finishes an op continues
with one ready child, and with no counting or locking when it is that child's only parent
and the child its only one (precomputed once per net).  Other ready children go to the
worker threads, which live as long as the net, except *deferrable* ones: ops that only
compute (no side effects, not collective or cross-device, no mutex, no Python code or
nested net) and lead to no op that is not so.  Those wait for a thread whose chain ended,
so they do not compete for the cores (and the GIL) with a running multi-threaded kernel.
Deferred ops are handed to the workers before the run's next op that could block.  A
valve thread checks every ``DEFER_LIMIT_S`` and hands them over when no op of the run
finished in that time (a thread may be waiting for one of them) or a CPU is idle.  So ops
that depend on each other's progress still run at the same time.  Ops leading to a
collective are never deferred.
"""

from __future__ import annotations

import functools
import heapq
import logging
import os
import queue
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from dpgraph.errors import WorkspaceError, did_you_mean
from dpgraph.runtime.operator import Blobs, OpInstance, Placement

logger = logging.getLogger("dpgraph.runtime.executor")

SIMPLE_TYPES = frozenset({"", "simple"})
DAG_TYPES = frozenset({"dag", "async_scheduling", "async_dag", "async_simple", "prof_dag",
                       "async_polling", "parallel", "singlethread_async", "async_child"})
DEFAULT_NUM_WORKERS = 4
#: How often the valve looks at a run with deferred ops (see the module docstring).
DEFER_LIMIT_S = 0.05


class SimpleExecutor:
    """Runs the ops one after the other in the calling thread."""

    kind = "simple"

    def __init__(self, ops: Sequence[OpInstance]) -> None:
        self.ops = list(ops)

    def run(self, blobs: Blobs, placement: Placement) -> None:
        for inst in self.ops:
            inst.run(blobs, placement)

    def close(self) -> None:
        """Nothing to release."""


#: Collectives whose input 0 is a common world: ordered per world (see dependencies).
WORLD_COLLECTIVES = frozenset({"Allreduce", "Broadcast", "Reduce", "Allgather",
                               "ReduceScatter", "Barrier"})


def _world_of(inst: OpInstance) -> str | None:
    return inst.inputs[0] if inst.type in WORLD_COLLECTIVES and inst.inputs else None


def _order_side_effect(j: int, world: str | None, deps: set[int], state: dict[str, Any]) -> None:
    """Chain op ``j`` (with side effects) after the ops it must follow: everything for a
    plain side effect, the previous plain one and its own world's tail for a collective."""
    if state["last"] is not None:
        deps.add(state["last"])
    tails: dict[str, int] = state["tails"]
    if world is not None:
        if world in tails:
            deps.add(tails[world])
        tails[world] = j
        return
    deps.update(tails.values())
    tails.clear()
    state["last"] = j


def dependencies(ops: Sequence[OpInstance], num_workers: int = 1) -> list[set[int]]:
    """For each op, the earlier ops it must wait for (data, anti, output, control, order).

    Ops with side effects keep their relative order, except that collectives on different
    common worlds may overlap when the net uses fewer worlds than ``num_workers`` (each
    rank can then have one collective in flight on every world, so ranks cannot wait on
    each other in a cycle); collectives on one world keep their order.
    """
    worlds = {w for w in map(_world_of, ops) if w is not None}
    per_world = 1 < len(worlds) < num_workers
    last_writer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    order: dict[str, Any] = {"last": None, "tails": {}}
    result: list[set[int]] = []
    for j, inst in enumerate(ops):
        deps: set[int] = set()
        for b in (*inst.inputs, *inst.control):
            if b in last_writer:
                deps.add(last_writer[b])
        for b in inst.outputs:
            if b in last_writer:
                deps.add(last_writer[b])
            deps.update(readers.get(b, ()))
        if inst.schema.side_effects:
            _order_side_effect(j, _world_of(inst) if per_world else None, deps, order)
        deps.discard(j)
        result.append(deps)
        for b in inst.inputs:
            readers.setdefault(b, []).append(j)
        for b in inst.outputs:
            last_writer[b] = j
            readers[b] = []
    return result


#: Nets up to this many ops get their dependency graph reduced (the ancestor sets cost
#: ops**2 / 8 bytes while they are built).
REDUCE_MAX_OPS = 4096


def reduced(deps: Sequence[set[int]]) -> list[set[int]]:
    """The transitive reduction of ``deps`` (parents always have lower indices): a parent
    that is also an ancestor of another parent is dropped.  Every op still waits for all
    its former dependencies (through the kept ones), so runs read the same values, while
    chains become single-parent edges the scheduler follows without counting or locking."""
    ancestors: list[int] = []  # bit p of ancestors[j]: op p must finish before op j
    result: list[set[int]] = []
    for parents in deps:
        union = 0
        for p in parents:
            union |= ancestors[p]
        result.append({p for p in parents if not union >> p & 1})
        for p in parents:
            union |= 1 << p
        ancestors.append(union)
    return result


def is_pure(inst: OpInstance) -> bool:
    """True for an op that only computes: it cannot block on or be observed by anything
    but its blobs (no side effects, collective, cross-device placement, mutex, Python code
    or nested net)."""
    schema = inst.schema
    return not (schema.side_effects or schema.collective or schema.cross_device
                or schema.mutex_input is not None or inst.type.startswith("Python")
                or inst.type.startswith("RecurrentNetwork")
                or any(arg.HasField("n") or len(arg.nets) for arg in inst.op.arg))


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def idle_cpu() -> bool:
    """True when fewer threads are runnable on the machine than this process may use CPUs
    (from /proc/loadavg; True where that is unreadable)."""
    try:
        with open("/proc/loadavg", "rb") as handle:
            running = int(handle.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return True
    return running - 1 < _usable_cpus()  # not counting the thread asking


def deferrable(ops: Sequence[OpInstance], children: Sequence[Sequence[int]]) -> list[bool]:
    """For each op: pure, and every op depending on it (transitively) pure too."""
    result = [is_pure(inst) for inst in ops]
    for j in reversed(range(len(ops))):  # children come after their parents
        if result[j] and not all(result[c] for c in children[j]):
            result[j] = False
    return result


class _WorkerPool:
    """``n`` daemon threads taking ``(fn, args)`` tasks from one queue, and a valve thread
    that, while checks are armed, calls each ``check()`` every ``DEFER_LIMIT_S`` until it
    returns True.  It sleeps on a timer while checks are armed (one wake per interval,
    not per run) and blocks when none are."""

    def __init__(self, num_workers: int, name: str) -> None:
        self.tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._checks: dict[int, Any] = {}
        self._checks_lock = threading.Lock()
        self._armed = threading.Event()
        self._closing = threading.Event()
        self.threads = [threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
                        for i in range(num_workers)]
        self.threads.append(threading.Thread(target=self._valve_loop, name=f"{name}-valve",
                                             daemon=True))
        for thread in self.threads:
            thread.start()

    def _loop(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None:
                return
            task[0](*task[1:])

    def arm(self, key: int, check: Any) -> None:
        """Have the valve call ``check()`` every ``DEFER_LIMIT_S`` until it returns True."""
        with self._checks_lock:
            self._checks[key] = check
            if not self._armed.is_set():
                self._armed.set()

    def _valve_loop(self) -> None:
        while True:
            self._armed.wait()
            if self._closing.wait(DEFER_LIMIT_S):
                return
            with self._checks_lock:
                checks = list(self._checks.items())
            finished = [key for key, check in checks if check()]
            with self._checks_lock:
                for key in finished:
                    self._checks.pop(key, None)
                if not self._checks:
                    self._armed.clear()

    def close(self) -> None:
        for _ in self.threads[:-1]:
            self.tasks.put(None)
        self._closing.set()
        self._armed.set()


class _RunState:
    __slots__ = ("pending", "in_flight", "errors", "lock", "done", "blobs", "placement",
                 "deferred", "valve_armed", "finished", "seen", "looked")

    def __init__(self, pending: list[int], blobs: Blobs, placement: Placement) -> None:
        self.pending = pending
        self.in_flight = 0  # running, queued or deferred
        self.errors: list[tuple[int, BaseException]] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.blobs, self.placement = blobs, placement
        self.deferred: list[int] = []  # a heap of ready deferrable ops no thread runs yet
        self.valve_armed = False
        self.finished = self.seen = 0  # ops done; ops done when the valve last looked
        self.looked = False  # whether the valve looked since the ops were deferred


class DagExecutor:
    """Runs ops on ``num_workers`` threads as soon as their dependencies are done."""

    kind = "dag"

    def __init__(self, ops: Sequence[OpInstance], num_workers: int, name: str = "net") -> None:
        self.ops = list(ops)
        self.num_workers = max(1, num_workers)
        self.name = name
        deps = dependencies(self.ops, self.num_workers)
        if len(deps) <= REDUCE_MAX_OPS:
            deps = reduced(deps)
        self.indegree = [len(d) for d in deps]
        self.children: list[list[int]] = [[] for _ in self.ops]
        for j, parents in enumerate(deps):
            for i in sorted(parents):
                self.children[i].append(j)
        self.roots = [j for j, d in enumerate(self.indegree) if d == 0]
        #: ``solo[i]``: op i's only child when op i is also that child's only parent (the
        #: child is ready as soon as op i is done), else -1.
        self.solo = [kids[0] if len(kids) == 1 and self.indegree[kids[0]] == 1 else -1
                     for kids in self.children]
        self.pure = [is_pure(inst) for inst in self.ops]
        self.deferrable = deferrable(self.ops, self.children)
        self._pool: _WorkerPool | None = None
        self._pool_lock = threading.Lock()

    def _get_pool(self) -> _WorkerPool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = _WorkerPool(self.num_workers, f"dpgraph-{self.name}")
                weakref.finalize(self, self._pool.close)
            return self._pool

    def run(self, blobs: Blobs, placement: Placement) -> None:
        if not self.ops:
            return
        pool = self._get_pool()
        state = _RunState(list(self.indegree), blobs, placement)
        state.in_flight = len(self.roots)
        for j in self.roots[1:]:
            pool.tasks.put((self._run_chain, state, j, pool))
        self._run_chain(state, self.roots[0], pool)
        state.done.wait()
        if state.errors:
            raise min(state.errors, key=lambda e: e[0])[1]

    def _run_chain(self, state: _RunState, index: int | None, pool: _WorkerPool) -> None:
        """Run ``index``, then keep running one newly ready child in this thread (the
        lowest-numbered, so the calling thread follows the net's main line)."""
        solo, pure = self.solo, self.pure
        while index is not None:
            if state.deferred and not pure[index]:
                with state.lock:  # this op might wait for a deferred one: hand them over
                    self._hand_over(state, pool)
            failed = self._run_op(state, index)
            state.finished += 1  # progress for the valve (approximate without the lock)
            if solo[index] >= 0 and not failed and not state.errors:
                index = solo[index]  # ready now and nobody else counts it: no lock
                continue
            with state.lock:
                state.in_flight -= 1
                if failed or state.errors:
                    following = None
                    state.in_flight -= len(state.deferred)  # never run
                    state.deferred.clear()
                else:
                    following = self._release_children(state, index, pool)
                    if following is None and state.deferred:
                        following = heapq.heappop(state.deferred)
                if state.in_flight == 0:
                    state.done.set()
            index = following

    def _hand_over(self, state: _RunState, pool: _WorkerPool) -> None:
        """Queue every deferred op to the workers (the caller holds the lock)."""
        for j in sorted(state.deferred):
            pool.tasks.put((self._run_chain, state, j, pool))
        state.deferred.clear()

    def _valve(self, state: _RunState, pool: _WorkerPool) -> bool:
        """Every ``DEFER_LIMIT_S`` while ops are deferred: hand them to the workers when
        no op finished since the last look (a thread may wait for one of them) or a CPU is
        idle.  True when the valve is done with this run."""
        with state.lock:
            if state.done.is_set() or not state.deferred:
                state.valve_armed = False
                return True
            stalled = state.looked and state.finished == state.seen
            state.looked, state.seen = True, state.finished
            if not stalled and not idle_cpu():
                return False
            state.valve_armed = False
            self._hand_over(state, pool)
            return True

    def _run_op(self, state: _RunState, index: int) -> bool:
        """Run op ``index``; True when it failed or was skipped because an op already failed
        (the first errors are kept for the caller)."""
        if state.errors:  # after a failure, queued ops are skipped
            return True
        try:
            self.ops[index].run(state.blobs, state.placement)
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller
            with state.lock:
                state.errors.append((index, error))
            return True
        return False

    def _release_children(self, state: _RunState, index: int, pool: _WorkerPool) -> int | None:
        """Count op ``index`` as done for its children (the caller holds the lock): of the
        children that became ready, return the first for this thread to run, defer the
        deferrable others and queue the rest to the workers."""
        following = None
        for child in self.children[index]:
            state.pending[child] -= 1
            if state.pending[child] == 0:
                state.in_flight += 1
                if following is None:
                    following = child
                elif self.deferrable[child]:
                    heapq.heappush(state.deferred, child)
                    if not state.valve_armed:
                        state.valve_armed, state.looked = True, False
                        pool.arm(id(state), functools.partial(self._valve, state, pool))
                else:
                    pool.tasks.put((self._run_chain, state, child, pool))
        return following

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def make_executor(net_type: str, ops: Sequence[OpInstance], num_workers: int,
                  name: str) -> SimpleExecutor | DagExecutor:
    """The executor for NetDef ``type`` (empty/'simple' -> simple, DAG-like -> dag)."""
    if net_type in SIMPLE_TYPES:
        return SimpleExecutor(ops)
    if net_type in DAG_TYPES:
        return DagExecutor(ops, num_workers or DEFAULT_NUM_WORKERS, name)
    raise WorkspaceError(
        f"Net {name!r} has unknown type {net_type!r}; use '' or 'simple' for the sequential "
        f"executor, or 'dag'/'async_scheduling' for the parallel one."
        + did_you_mean(net_type, sorted(SIMPLE_TYPES | DAG_TYPES)))
