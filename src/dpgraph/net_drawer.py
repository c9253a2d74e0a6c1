"""Caffe2's ``net_drawer``: nets as ``pydot`` graphs.

pydot is optional.  The graphs are built from :func:`dpgraph.export.to_dot`'s DOT text, so
they have its device clusters and collective highlighting; with custom ``op_node_producer``
or ``blob_node_producer`` callables they are built node by node through pydot instead.
:func:`dpgraph.export.to_dot` and :func:`dpgraph.export.render` need no pydot at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dpgraph.errors import MissingDependencyError
from dpgraph.export.dot import to_dot
from dpgraph.ir.proto_io import proto_of
from dpgraph.proto import caffe2_pb2

OpNodeProducer = Callable[[caffe2_pb2.OperatorDef, int], Any]
BlobNodeProducer = Callable[..., Any]


def _pydot() -> Any:
    try:
        import pydot  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise MissingDependencyError(
            "net_drawer needs pydot, which is not installed: `pip install pydot` (and "
            "Graphviz to render).  dpgraph.export.to_dot(net) and "
            "dpgraph.export.render(net, path) draw nets without it.") from None
    return pydot


def _as_net(operators_or_net: Any, name: str | None) -> caffe2_pb2.NetDef:
    """A NetDef named ``name`` (default: the net's name, else ``unnamed``)."""
    if hasattr(operators_or_net, "Proto"):
        operators_or_net = operators_or_net.Proto()
    net = caffe2_pb2.NetDef()
    if isinstance(operators_or_net, caffe2_pb2.NetDef):
        net.CopyFrom(operators_or_net)
    else:
        net.op.extend(operators_or_net)
    net.name = name or net.name or "unnamed"
    return net


def _from_dot_text(text: str) -> Any:
    graphs = _pydot().graph_from_dot_data(text)
    return graphs[0]


def GetPydotGraph(operators_or_net: Any, name: str | None = None, rankdir: str = "LR",
                  op_node_producer: OpNodeProducer | None = None,
                  blob_node_producer: BlobNodeProducer | None = None) -> Any:
    """A ``pydot.Dot`` with op boxes and blob ellipses (one node per blob version)."""
    net = _as_net(operators_or_net, name)
    if op_node_producer is None and blob_node_producer is None:
        return _from_dot_text(to_dot(net, rankdir=rankdir))
    return _build_with_producers(net, rankdir, op_node_producer, blob_node_producer)


def _build_with_producers(net: caffe2_pb2.NetDef, rankdir: str,
                          op_node_producer: OpNodeProducer | None,
                          blob_node_producer: BlobNodeProducer | None) -> Any:
    pydot = _pydot()
    make_op = op_node_producer or (
        lambda op, index: pydot.Node(f"op{index}", label=f'"{op.type}"', shape="box"))
    make_blob = blob_node_producer or (
        lambda node_name, label: pydot.Node(node_name, label=f'"{label}"', shape="oval"))
    graph = pydot.Dot(net.name, graph_type="digraph", rankdir=rankdir)
    version: dict[str, int] = {}
    nodes: dict[str, Any] = {}

    def blob_node(blob: str) -> Any:
        if blob not in nodes:
            nodes[blob] = make_blob(f'"{blob}#{version.get(blob, 0)}"', label=blob)
            graph.add_node(nodes[blob])
        return nodes[blob]

    for index, op in enumerate(net.op):
        op_node = make_op(op, index)
        graph.add_node(op_node)
        for blob in op.input:
            graph.add_edge(pydot.Edge(blob_node(blob), op_node))
        for blob in op.output:
            if blob in nodes:  # a new version of the blob gets its own node
                version[blob] = version.get(blob, 0) + 1
                del nodes[blob]
            graph.add_edge(pydot.Edge(op_node, blob_node(blob)))
    return graph


def GetPydotGraphMinimal(operators_or_net: Any, name: str | None = None, rankdir: str = "LR",
                         minimal_dependency: bool = False) -> Any:
    """A ``pydot.Dot`` of ops only, each connected to the producers of its inputs.

    dpgraph always draws the minimal dependencies (an edge from an input's latest
    producer), so ``minimal_dependency`` is accepted for compatibility.
    """
    del minimal_dependency
    net = _as_net(operators_or_net, name)
    return _from_dot_text(to_dot(net, show_blobs=False, rankdir=rankdir))


def GetOperatorMapForPlan(plan_def: Any) -> dict[str, Iterable[caffe2_pb2.OperatorDef]]:
    """``{"<plan>_<net>": ops}`` for each net of a PlanDef (or Plan); unnamed nets are
    called ``<plan>_network_<i>``."""
    plan = proto_of(plan_def)
    return {f"{plan.name}_{net.name or f'network_{i}'}": net.op
            for i, net in enumerate(plan.network)}


__all__ = ["GetOperatorMapForPlan", "GetPydotGraph", "GetPydotGraphMinimal"]
