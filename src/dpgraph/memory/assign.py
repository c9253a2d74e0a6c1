"""Live ranges of blobs over a linear op order and their assignment to shared buffers.

A blob's :class:`LiveRange` runs from the op that first writes it (``defined``) to the last
op that touches it (``used``); two blobs may share a buffer when their ranges do not
overlap (inclusive ends, so sharing never makes an op in place).  An *assignment* is a list
of ``(blob, LiveRange)`` sharing one buffer, named after its first blob::

    b1 [1, 3] size 10, b2 [3, 4] size 1, b3 [5, 6] size 1, b4 [5, 7] size 10
    greedy  -> [[b1, b4], [b2, b3]]    memory 10 + 1 = 11
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from dpgraph.ir.proto_io import proto_of
from dpgraph.proto import caffe2_pb2


class LiveRange(NamedTuple):
    """When a blob is live (op positions) and how big it is (``None`` when unknown)."""

    defined: int | None
    used: int | None
    size: int | None


class AssignmentAlgorithm(enum.Enum):
    GREEDY = 0
    DYNAMIC_PROGRAMMING = 1


class Statistics(NamedTuple):
    baseline_nbytes: int
    optimized_nbytes: int


class Optimization(NamedTuple):
    """Result of :func:`optimize_interference`."""

    net: caffe2_pb2.NetDef
    assignments: list[list[tuple[str, LiveRange]]]
    blob_assignments: dict[str, str]


RangeItem = tuple[str, LiveRange]
Assignment = list[RangeItem]


def compute_ranges(linearized_ops: Sequence[caffe2_pb2.OperatorDef],
                   blob_sizes: Mapping[str, int] | None = None) -> dict[str, LiveRange]:
    """Live range of every blob the ops touch.

    ``defined`` is the first op writing the blob (``None`` when the blob is read before it
    is written, or only read: an input);
    ``used`` is the last op touching it after a read (``None`` when it is never read: an
    output that may be fetched, which then stays live to the end).
    """
    defined: dict[str, int] = {}
    first_read: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, op in enumerate(linearized_ops):
        for b in op.input:
            first_read.setdefault(b, i)
            last[b] = i
        for b in op.output:
            defined.setdefault(b, i)
            last[b] = i
    ranges = {}
    for b in last:
        size = None if blob_sizes is None else blob_sizes.get(b)
        used = last[b] if b in first_read else None
        start = defined.get(b)
        if start is not None and first_read.get(b, start + 1) <= start:
            start = None  # read before (or while) first written: an input of the net
        ranges[b] = LiveRange(start, used, size)
    return ranges


def get_updated_ranges(ranges: Sequence[RangeItem], max_live: int | None = None
                       ) -> list[RangeItem]:
    """Fill unknowns: ``defined=None`` -> -1, ``used=None`` -> ``max_live`` (default: one
    past the largest ``used``), ``size=None`` -> 1."""
    if max_live is None:
        max_live = max((r.used for _, r in ranges if r.used is not None), default=0) + 1
    result = []
    for name, r in ranges:
        result.append((name, LiveRange(-1 if r.defined is None else r.defined,
                                       max_live if r.used is None else r.used,
                                       1 if r.size is None else r.size)))
    return result


def _overlaps(a: LiveRange, b: LiveRange) -> bool:
    return a.defined <= b.used and b.defined <= a.used  # type: ignore[operator]


def _fits(item: RangeItem, assignment: Assignment) -> bool:
    return not any(_overlaps(item[1], other[1]) for other in assignment)


def _max_size(assignment: Assignment) -> int:
    return max((r.size or 0) for _, r in assignment)


def get_memory_usage(assignments: Iterable[Assignment]) -> int:
    """Sum over assignments of their largest blob."""
    return sum(_max_size(a) for a in assignments if a)


def _defined(item: RangeItem) -> int:
    return -1 if item[1].defined is None else item[1].defined


def _order(assignments: list[Assignment], originals: Mapping[str, RangeItem]
           ) -> list[Assignment]:
    """Original ranges, each assignment sorted by definition."""
    return [sorted((originals[name] for name, _ in a), key=_defined)
            for a in assignments]


def _greedy(items: Sequence[RangeItem], start: list[Assignment]) -> list[Assignment]:
    assignments = [list(a) for a in start]
    ordered = sorted(items, key=lambda it: (-(it[1].size or 0), it[1].defined))
    for item in ordered:
        size = item[1].size or 0
        best, best_cost = None, None
        for a in assignments:
            if not _fits(item, a):
                continue
            cost = (max(size - _max_size(a), 0), abs(_max_size(a) - size))
            if best_cost is None or cost < best_cost:
                best, best_cost = a, cost
        if best is None:
            assignments.append([item])
        else:
            best.append(item)
    return assignments


def compute_assignments_greedy(ranges_sizes: Sequence[RangeItem],
                               init_assignment: Sequence[Assignment] | None
                               ) -> list[Assignment]:
    """Largest blobs first; each joins the compatible assignment closest in size (growing
    an assignment as little as possible) or starts a new one."""
    originals = {name: (name, r) for name, r in ranges_sizes}
    for a in init_assignment or []:
        originals.update({name: (name, r) for name, r in a})
    items = get_updated_ranges(ranges_sizes)
    start = [get_updated_ranges(a) for a in init_assignment or []]
    return _order(_greedy(items, start), originals)


def _dp_search(items: Sequence[RangeItem], start: list[Assignment], bound: int,
               budget: int) -> list[Assignment] | None:
    """Exact memoised search: blobs by decreasing size, each either joins a compatible
    assignment (free: it is not larger) or opens one (costs its size).  States are the
    canonical sets of assignments; the search stops after ``budget`` expansions."""
    ordered = sorted(items, key=lambda it: (-(it[1].size or 0), it[1].defined))
    best: list[Any] = [bound + 1, None]
    seen: dict[tuple[int, frozenset[Any]], int] = {}
    expansions = [0]

    def key(groups: list[Assignment]) -> frozenset[Any]:
        return frozenset(frozenset(name for name, _ in g) for g in groups)

    def visit(index: int, groups: list[Assignment], cost: int) -> None:
        if cost >= best[0] or expansions[0] > budget:
            return
        state = (index, key(groups))
        if seen.get(state, cost + 1) <= cost:
            return
        seen[state] = cost
        expansions[0] += 1
        if index == len(ordered):
            best[0], best[1] = cost, [list(g) for g in groups]
            return
        item = ordered[index]
        for g in groups:
            if _fits(item, g):
                added = max((item[1].size or 0) - _max_size(g), 0)
                g.append(item)
                visit(index + 1, groups, cost + added)
                g.pop()
        groups.append([item])
        visit(index + 1, groups, cost + (item[1].size or 0))
        groups.pop()

    visit(0, [list(g) for g in start], get_memory_usage(start))
    return best[1]


def compute_assignments_dp(ranges_sizes: Sequence[RangeItem],
                           init_assignment: Sequence[Assignment] | None,
                           counter: Any = None, budget: int | None = None) -> list[Assignment]:
    """Minimum-memory assignment by memoised search over assignment states, seeded with
    the greedy result as the bound (so never worse than greedy); past ``budget`` state
    expansions (default: exhaustive for small nets, fewer for large ones) the best
    assignment found so far is returned."""
    if budget is None:
        budget = min(20000, max(200, 400_000 // max(len(ranges_sizes), 1)))
    greedy = compute_assignments_greedy(ranges_sizes, init_assignment)
    originals = {name: (name, r) for a in greedy for name, r in a}
    items = get_updated_ranges(ranges_sizes)
    start = [get_updated_ranges(a) for a in init_assignment or []]
    found = _dp_search(items, start, get_memory_usage(
        [get_updated_ranges(a) for a in greedy]), budget)
    if counter is not None and hasattr(counter, "append"):
        counter.append(1)
    return greedy if found is None else _order(found, originals)


def compute_assignments(ranges: Mapping[str, LiveRange], static_blobs: Iterable[Any],
                        algo: AssignmentAlgorithm = AssignmentAlgorithm.GREEDY
                        ) -> list[Assignment]:
    """Assignments of the non-static blobs that the ops define before reading."""
    static = {str(b) for b in static_blobs}
    items = [(name, r) for name, r in ranges.items()
             if name not in static and r.defined is not None]
    if algo == AssignmentAlgorithm.DYNAMIC_PROGRAMMING:
        return compute_assignments_dp(items, None)
    return compute_assignments_greedy(items, None)


def compute_blob_assignments(assignments: Iterable[Assignment]) -> dict[str, str]:
    """Every blob of a multi-blob assignment -> the assignment's last blob (Caffe2's
    naming of a shared buffer)."""
    return {name: a[-1][0] for a in assignments if len(a) > 1 for name, _ in a}


blob_assignments = compute_blob_assignments


def apply_assignments(net: caffe2_pb2.NetDef, assignments: Any) -> None:
    """Rename blobs in place: ``assignments`` is a list of assignments or a
    ``{blob: canonical}`` mapping; step nets of ops are renamed too."""
    mapping = assignments if isinstance(assignments, Mapping) else blob_assignments(
        assignments)
    rename_blobs(net.op, mapping)


def _rename_list(names: Any, mapping: Mapping[str, str]) -> list[str]:
    """Rename in place; returns the names that changed."""
    changed = []
    for i, b in enumerate(names):
        if b in mapping:
            names[i] = mapping[b]
            changed.append(b)
    return changed


def _is_recurrent(op: caffe2_pb2.OperatorDef) -> bool:
    return op.type.startswith("RecurrentNetwork")


def rename_blobs(ops: Iterable[caffe2_pb2.OperatorDef], mapping: Mapping[str, str]) -> None:
    """Rename op inputs and outputs (and those of nets held in op arguments).

    RecurrentNetwork ops get, as in Caffe2's memonger, their step nets renamed (ops and
    external inputs) and one string argument ``<old>.rename = <new>`` per renamed input or
    output, which the gradient op follows for its links and gradient names.
    """
    for op in ops:
        changed = _rename_list(op.input, mapping) + _rename_list(op.output, mapping)
        for arg in op.arg:
            if arg.HasField("n"):
                rename_blobs(arg.n.op, mapping)
                if _is_recurrent(op) and arg.name.endswith("step_net"):
                    _rename_list(arg.n.external_input, mapping)
            for sub in arg.nets:
                rename_blobs(sub.op, mapping)
        if _is_recurrent(op):
            for b in dict.fromkeys(changed):
                op.arg.add(name=b + ".rename", s=mapping[b].encode())


def compute_statistics(assignments: Iterable[Assignment]) -> Statistics:
    """Bytes of every assigned blob (the range's size, else the current workspace's
    value) against the bytes of the largest blob per assignment."""
    from dpgraph.runtime import api

    def nbytes(name: str, r: LiveRange) -> int:
        if r.size is not None:
            return int(r.size)
        value = api.FetchBlob(name) if api.HasBlob(name) else None
        return int(getattr(value, "nbytes", 0) or 0)

    sizes = [[nbytes(name, r) for name, r in a] for a in assignments if a]
    return Statistics(baseline_nbytes=sum(sum(s) for s in sizes),
                      optimized_nbytes=sum(max(s) for s in sizes))


def collect_blob_sizes(net: Any) -> dict[str, int]:
    """``{blob: nbytes}`` of every blob the net's ops touch, from the current workspace
    (0 for blobs the workspace does not hold)."""
    from dpgraph.runtime import api

    proto = proto_of(net)
    sizes: dict[str, int] = {}
    for op in proto.op:
        for b in list(op.input) + list(op.output):
            if b not in sizes:
                value = api.FetchBlob(b) if api.HasBlob(b) else None
                sizes[b] = int(getattr(value, "nbytes", 0) or 0)
    return sizes
