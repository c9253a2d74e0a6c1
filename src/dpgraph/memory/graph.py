"""Dependency graphs over a net's ops: the interference graph, topological orders, and the
checks that a memory pass kept the graph's meaning.

The interference graph of ``ops`` has one node per op index and an edge ``i -> j`` (``i < j``)
when an output of op ``i`` is an input of op ``j``::

    Copy(b1 -> b1); Copy(b1 -> b1); Copy(b1 -> b1)   edges (0, 1), (0, 2), (1, 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dpgraph.errors import ArgumentError
from dpgraph.proto import caffe2_pb2

OpList = Sequence[caffe2_pb2.OperatorDef]


@dataclass
class OpGraph:
    """A directed acyclic graph over op indices (edges in insertion order).

    Attributes:
        ops: the operators, ``ops[i]`` is node ``i``.
        succ: successors of each node, in the order the edges were added.
        deps: for each edge ``(i, j)``, the blobs op ``i`` writes that op ``j`` reads.
    """

    ops: list[caffe2_pb2.OperatorDef]
    succ: list[list[int]] = field(default_factory=list)
    deps: dict[tuple[int, int], set[str]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[int]:
        return list(range(len(self.ops)))

    def edges(self) -> list[tuple[int, int]]:
        """Edges sorted by source, then by target."""
        return sorted(self.deps)

    def predecessors(self) -> list[list[int]]:
        pred: list[list[int]] = [[] for _ in self.ops]
        for i, children in enumerate(self.succ):
            for j in children:
                pred[j].append(i)
        return pred

    def sources(self) -> list[int]:
        has_parent = {j for children in self.succ for j in children}
        return [i for i in self.nodes if i not in has_parent]


def _ops_of(net_or_ops: Any) -> list[caffe2_pb2.OperatorDef]:
    if hasattr(net_or_ops, "Proto"):
        return list(net_or_ops.Proto().op)
    if isinstance(net_or_ops, caffe2_pb2.NetDef):
        return list(net_or_ops.op)
    return list(net_or_ops)


def compute_interference_graph(ops: Any) -> OpGraph:
    """The graph with an edge ``i -> j`` for ``i < j`` when op ``j`` reads an output of op
    ``i`` (every earlier writer of the blob, not just the last one)."""
    ops = _ops_of(ops)
    graph = OpGraph(ops=ops, succ=[[] for _ in ops])
    writers: dict[str, list[int]] = {}
    for j, op in enumerate(ops):
        parents: dict[int, set[str]] = {}
        for blob in op.input:
            for i in writers.get(blob, ()):
                parents.setdefault(i, set()).add(blob)
        for i in sorted(parents):
            graph.succ[i].append(j)
            graph.deps[(i, j)] = parents[i]
        for blob in op.output:
            writers.setdefault(blob, []).append(j)
    for children in graph.succ:
        children.sort()
    return graph


def as_op_graph(graph: Any) -> OpGraph:
    """``graph`` as an :class:`OpGraph`: an OpGraph as is, or a networkx-style DiGraph
    over the nodes ``0..n-1`` (``nodes()``, ``edges()``), as Caffe2's tests build them."""
    if isinstance(graph, OpGraph):
        return graph
    nodes = sorted(graph.nodes())
    if nodes != list(range(len(nodes))):
        raise ArgumentError(f"graph nodes must be 0..n-1 (op indices), got {nodes}; number "
                            "the nodes by their op's index in the net.")
    result = OpGraph(ops=[caffe2_pb2.OperatorDef() for _ in nodes],
                     succ=[[] for _ in nodes])
    for i, j in graph.edges():
        result.succ[i].append(j)
        result.deps[(i, j)] = set()
    return result


def _reverse_dfs_postorder(graph: OpGraph, roots: Sequence[int]) -> list[int]:
    """Reversed DFS post-order from ``roots`` (in that order), then from the nodes not
    reached yet (by index): a topological order."""
    seen: set[int] = set()
    post: list[int] = []
    for root in list(roots) + graph.nodes:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(graph.succ[root]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                post.append(node)
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(graph.succ[child])))
    post.reverse()
    return post


def topological_sort_traversal(graph: Any) -> list[int]:
    """A depth-first topological order: roots by index, children by index, reversed
    post-order (so the root visited last comes first) -- the order networkx 2.x's
    ``topological_sort`` gives, which Caffe2's memonger relied on."""
    return _reverse_dfs_postorder(as_op_graph(graph), [])


def _longest_path_to_sink(graph: OpGraph, order: Sequence[int]) -> dict[int, int | None]:
    """For each node, the next node on one longest path to a sink (ties: smallest
    successor; ``None`` at a sink)."""
    length: dict[int, int] = {}
    step: dict[int, int | None] = {}
    for node in reversed(order):
        best: int | None = None
        for child in graph.succ[node]:
            if best is None or length[child] > length[best]:
                best = child
        step[node] = best
        length[node] = 0 if best is None else length[best] + 1
    return step


def _tree_heights(children: dict[int, list[int]], root: int) -> dict[int, int]:
    """Height of every node of a tree (leaves 0), without recursion."""
    height: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        kids = children.get(node, [])
        if expanded:
            height[node] = 1 + max((height[c] for c in kids), default=-1)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in kids)
    return height


def _ordered_sources(graph: OpGraph) -> list[int]:
    """Sources ordered so that, after the reversed post-order, the source with the longest
    chain to a (virtual common) sink comes first.

    The longest paths of all sources form a tree rooted at the common sink; sources are the
    leaves of that tree, listed depth first with shallower subtrees before deeper ones.
    """
    order = _reverse_dfs_postorder(graph, [])
    step = _longest_path_to_sink(graph, order)
    sink = -1
    children: dict[int, list[int]] = {}
    for source in graph.sources():
        node: int = source
        while True:
            parent = step[node]
            parent = sink if parent is None else parent
            kids = children.setdefault(parent, [])
            if node in kids:
                break  # the rest of this path is already in the tree
            kids.append(node)
            if parent == sink:
                break
            node = parent
    height = _tree_heights(children, sink)
    leaves: list[int] = []
    stack = [sink]
    while stack:
        node = stack.pop()
        kids = children.get(node, [])
        if not kids:
            leaves.append(node)
            continue
        stack.extend(reversed(sorted(kids, key=height.__getitem__)))
    return leaves


def topological_sort_traversal_longest_path(graph: Any) -> list[int]:
    """A topological order that runs the longest dependency chain first, so that the
    blobs of shorter independent branches are created late and die early."""
    graph = as_op_graph(graph)
    if not graph.ops:
        return []
    return _reverse_dfs_postorder(graph, _ordered_sources(graph))


def _parents(ops: OpList) -> list[list[int]]:
    """Per op, the index of the op that last wrote each of its inputs, in input order;
    inputs nobody wrote (external blobs) add nothing, as in Caffe2."""
    owner: dict[str, int] = {}
    result = []
    for i, op in enumerate(ops):
        result.append([owner[b] for b in op.input if b in owner])
        for b in op.output:
            owner[b] = i
    return result


def _same_op(a: caffe2_pb2.OperatorDef, b: caffe2_pb2.OperatorDef) -> bool:
    """Caffe2's per-op check: type, device option and engine (arguments may differ: a
    memory pass renames blobs inside step nets and adds ``.rename`` arguments)."""
    return a.type == b.type and a.device_option == b.device_option and a.engine == b.engine


def verify_graph_equality(net_a: Any, net_b: Any) -> bool:
    """True when both nets run the same ops (type, device option, engine) and every op's
    inputs were last written by the same ops: blob names, external ones included, may
    differ. The ops whose parents differ are printed, as Caffe2 does."""
    ops_a, ops_b = _ops_of(net_a), _ops_of(net_b)
    if len(ops_a) != len(ops_b):
        return False
    if not all(_same_op(a, b) for a, b in zip(ops_a, ops_b)):
        return False
    parents_a, parents_b = _parents(ops_a), _parents(ops_b)
    for j, (pa, pb) in enumerate(zip(parents_a, parents_b)):
        if pa != pb:
            print(f"Difference {j} vs {j} \n {ops_a[j]} \n {ops_b[j]}")
            print(f"Parents: {pa} vs {pb}")
    return parents_a == parents_b


def _inplace_pairs(op: caffe2_pb2.OperatorDef) -> list[tuple[int, int]]:
    outputs = list(op.output)
    return [(i, outputs.index(b)) for i, b in enumerate(op.input) if b in outputs]


def verify_inplace_blobs(net_a: Any, net_b: Any) -> bool:
    """True when every op has the same in-place (input, output) pairs in both nets: a
    memory pass must not make an op in place."""
    ops_a, ops_b = _ops_of(net_a), _ops_of(net_b)
    if len(ops_a) != len(ops_b):
        return False
    return all(a.type == b.type and _inplace_pairs(a) == _inplace_pairs(b)
               for a, b in zip(ops_a, ops_b))


def hazard_ancestors(ops: OpList) -> list[int]:
    """Bitsets: bit ``i`` of ``result[j]`` is set when op ``j`` must run after op ``i``
    (read-after-write, write-after-read, write-after-write, transitively) -- the order
    the DAG executor enforces."""
    last_writer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    ancestors: list[int] = []
    for j, op in enumerate(ops):
        deps: set[int] = set()
        for b in op.input:
            if b in last_writer:
                deps.add(last_writer[b])
        for b in op.output:
            if b in last_writer:
                deps.add(last_writer[b])
            deps.update(readers.get(b, ()))
        mask = 0
        for d in deps:
            mask |= ancestors[d] | (1 << d)
        mask &= ~(1 << j)
        ancestors.append(mask)
        for b in op.input:
            readers.setdefault(b, []).append(j)
        for b in op.output:
            last_writer[b] = j
            readers[b] = []
    return ancestors
