"""``optimize_interference``: reorder a net along a topological order of its dependency
graph, then assign blobs with disjoint live ranges to shared buffers.

Before::

    FC(data, w1, b1) -> fc1; FC(fc1, w2, b2) -> fc2; FC(fc2, w3, b3) -> fc3

After (``fc1`` is dead when ``fc3`` is written; the buffer keeps its first blob's name)::

    FC(data, w1, b1) -> fc1; FC(fc1, w2, b2) -> fc2; FC(fc2, w3, b3) -> fc1
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dpgraph.ir.registry import OPERATORS
from dpgraph.memory.assign import (
    AssignmentAlgorithm,
    Optimization,
    apply_assignments,
    blob_assignments,
    compute_assignments,
    compute_ranges,
)
from dpgraph.memory.graph import OpGraph, compute_interference_graph, topological_sort_traversal
from dpgraph.memory.sharing import BlobUse, as_netdef, pinned_blobs
from dpgraph.proto import caffe2_pb2


def compute_dependency_graph(ops: Any) -> OpGraph:
    """The interference graph plus write-after-read and write-after-write edges and the
    order of ops with side effects: every topological order of it computes the same
    values as the original order."""
    graph = compute_interference_graph(ops)
    last_writer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    last_effect: int | None = None
    for j, op in enumerate(graph.ops):
        extra: set[int] = set()
        for b in op.output:
            if b in last_writer:
                extra.add(last_writer[b])
            extra.update(readers.get(b, ()))
        schema = OPERATORS.get(op.type)
        if schema is not None and schema.side_effects:
            if last_effect is not None:
                extra.add(last_effect)
            last_effect = j
        for i in sorted(extra - {j}):
            if (i, j) not in graph.deps:
                graph.deps[(i, j)] = set()
                graph.succ[i].append(j)
        for b in op.input:
            readers.setdefault(b, []).append(j)
        for b in op.output:
            last_writer[b] = j
            readers[b] = []
    for children in graph.succ:
        children.sort()
    return graph


def optimize_interference(
    net: Any,
    static_blobs: Iterable[Any],
    ordering_function: Callable[[OpGraph], list[int]] = topological_sort_traversal,
    blob_sizes: Mapping[str, int] | None = None,
    algo: AssignmentAlgorithm = AssignmentAlgorithm.GREEDY,
) -> Optimization:
    """Reorder ``net`` (a Net or NetDef, not modified) by ``ordering_function`` over its
    dependency graph, compute live ranges and assign non-static blobs to shared buffers
    with ``algo``.  Blobs never read (outputs), inputs and pinned blobs stay as they are.
    """
    proto = as_netdef(net)
    graph = compute_dependency_graph(proto.op)
    order = ordering_function(graph)
    linearized = [proto.op[i] for i in order]
    result = caffe2_pb2.NetDef()
    result.CopyFrom(proto)
    del result.op[:]
    result.op.extend(linearized)
    use = BlobUse.of(linearized)
    never_read = {b for b in use.first_write if b not in use.first_read}
    static = {str(b) for b in static_blobs} | pinned_blobs(proto) | never_read
    ranges = compute_ranges(list(result.op), blob_sizes)
    assignments = compute_assignments(ranges, static, algo)
    apply_assignments(result, assignments)
    return Optimization(net=result, assignments=assignments,
                        blob_assignments=blob_assignments(assignments))
