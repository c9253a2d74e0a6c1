"""Drawing nets as Graphviz DOT: op and blob nodes, one cluster per device.

``to_dot(net)`` returns DOT text; ``render(net, "graph.svg")`` runs Graphviz's ``dot`` to
make SVG or PNG (and writes plain DOT for ``.dot`` paths without needing Graphviz).
Collectives (NCCL*, Gloo Allreduce/Broadcast/..., Parallelize's ``dpm`` Sum) are drawn
highlighted so the communication pattern stands out.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from dpgraph.errors import ExportError, MissingDependencyError
from dpgraph.ir.analysis import is_collective
from dpgraph.ir.device import device_name, effective_device
from dpgraph.ir.proto_io import proto_of
from dpgraph.proto import caffe2_pb2

_OP_STYLE = 'shape=box, style="rounded,filled", fillcolor="#dbe9f6"'
_COLLECTIVE_STYLE = 'shape=box, style="rounded,filled,bold", fillcolor="#f6c342"'
_GRAD_STYLE = 'shape=box, style="rounded,filled", fillcolor="#eeeeee"'
_BLOB_STYLE = 'shape=ellipse, fontsize=10'


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped + '"'


def _op_style(op: caffe2_pb2.OperatorDef) -> str:
    if is_collective(op):
        return _COLLECTIVE_STYLE
    return _GRAD_STYLE if op.is_gradient_op else _OP_STYLE


def _step_net_lines(index: int, op: caffe2_pb2.OperatorDef) -> list[str]:
    """A dotted cluster per non-empty nested net argument (RecurrentNetwork step nets,
    If/While bodies), its ops chained in order, linked from the op's node."""
    lines: list[str] = []
    for arg in op.arg:
        if not arg.HasField("n") or not arg.n.op:
            continue
        prefix = f"op{index}_{arg.name}"
        lines.append(f"  subgraph cluster_{prefix} {{ label={_quote(arg.name)}; style=dotted;")
        lines.extend(f"    {prefix}_{k} [label={_quote(inner.type)}, {_op_style(inner)}];"
                     for k, inner in enumerate(arg.n.op))
        lines.append("  }")
        lines.extend(f"  {prefix}_{k} -> {prefix}_{k + 1};" for k in range(len(arg.n.op) - 1))
        lines.append(f"  op{index} -> {prefix}_0 [style=dotted, arrowhead=none];")
    return lines


def to_dot(net: Any, cluster_by_device: bool = True, show_blobs: bool = True,
           rankdir: str = "TB", max_label: int = 40) -> str:
    """DOT text for ``net`` (a Net or NetDef).

    Args:
        cluster_by_device: one ``subgraph cluster_<device>`` per device.
        show_blobs: draw blobs as ellipses between ops; otherwise ops connect directly.
        rankdir: Graphviz layout direction (``TB`` or ``LR``).
        max_label: blob labels longer than this are shortened with an ellipsis.
    """
    proto: caffe2_pb2.NetDef = proto_of(net)
    default = proto.device_option if proto.HasField("device_option") else None
    clusters: dict[str, list[str]] = {}
    edges: list[str] = []
    blobs: dict[tuple[str, int], str] = {}
    versions: dict[str, int] = {}
    producer: dict[str, str] = {}

    def blob_node(name: str) -> str:
        key = (name, versions.get(name, 0))
        if key not in blobs:
            blobs[key] = f"b{len(blobs)}"
        return blobs[key]

    for index, op in enumerate(proto.op):
        node = f"op{index}"
        label = op.type + (f"\n{op.name}" if op.name else "")
        device = device_name(effective_device(op, default))
        clusters.setdefault(device, []).append(f"{node} [label={_quote(label)}, {_op_style(op)}];")
        for blob in op.input:
            if show_blobs:
                edges.append(f"{blob_node(blob)} -> {node};")
            elif blob in producer:
                edges.append(f"{producer[blob]} -> {node} [label={_quote(blob[-max_label:])}];")
        for blob in op.output:
            producer[blob] = node
            versions[blob] = versions.get(blob, 0) + 1
            if show_blobs:
                edges.append(f"{node} -> {blob_node(blob)};")
    lines = [f"digraph {_quote(proto.name or 'net')} {{", f"  rankdir={rankdir};",
             "  node [fontname=Helvetica];"]
    for number, (device, nodes) in enumerate(sorted(clusters.items())):
        if cluster_by_device:
            lines.append(f"  subgraph cluster_{number} {{ label={_quote(device)}; "
                         'style=dashed;')
            lines.extend(f"    {n}" for n in nodes)
            lines.append("  }")
        else:
            lines.extend(f"  {n}" for n in nodes)
    for (name, _), node in blobs.items():
        label = name if len(name) <= max_label else "…" + name[-max_label:]
        lines.append(f"  {node} [label={_quote(label)}, {_BLOB_STYLE}];")
    for index, op in enumerate(proto.op):
        lines.extend(_step_net_lines(index, op))
    lines.extend(f"  {edge}" for edge in edges)
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(net: Any, path: str | Path, **options: Any) -> Path:
    """Write ``net`` to ``path``: ``.dot`` as text, ``.svg``/``.png``/``.pdf`` via Graphviz."""
    target = Path(path)
    fmt = target.suffix.lstrip(".").lower()
    text = to_dot(net, **options)
    if fmt in ("dot", "gv"):
        target.write_text(text)
        return target
    if fmt not in ("svg", "png", "pdf"):
        raise ExportError(f"cannot draw to {target.name!r}: use a .dot, .svg, .png or .pdf path")
    dot = shutil.which("dot")
    if dot is None:
        raise MissingDependencyError(
            f"drawing {target.name!r} needs Graphviz's 'dot' program, which is not installed "
            "(e.g. `apt-get install graphviz`); or draw to a .dot file instead.")
    result = subprocess.run([dot, f"-T{fmt}", "-o", str(target)], input=text.encode(),
                            capture_output=True, timeout=120, check=False)
    if result.returncode != 0:
        raise ExportError(f"Graphviz failed on {target.name!r}: "
                          f"{result.stderr.decode(errors='replace').strip()}")
    return target
