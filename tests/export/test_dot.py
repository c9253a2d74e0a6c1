"""Graphviz drawing of nets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpgraph.core import DeviceOption
from dpgraph.errors import ExportError, MissingDependencyError
from dpgraph.export import render, to_dot
from dpgraph.proto import caffe2_pb2


def parallel_like_net() -> caffe2_pb2.NetDef:
    proto = caffe2_pb2.NetDef(name="par")
    for device in range(4):
        op = proto.op.add(type="FC", input=[f"gpu_{device}/x", f"gpu_{device}/w"],
                          output=[f"gpu_{device}/y"])
        op.device_option.CopyFrom(DeviceOption(caffe2_pb2.CUDA, device))
    nccl = proto.op.add(type="NCCLAllreduce", input=[f"gpu_{d}/y" for d in range(4)],
                        output=[f"gpu_{d}/y" for d in range(4)])
    nccl.device_option.CopyFrom(DeviceOption(caffe2_pb2.CUDA, 0))
    return proto


def test_dot_has_one_cluster_per_device_and_highlighted_collectives() -> None:
    text = to_dot(parallel_like_net())
    assert text.startswith('digraph "par" {')
    assert text.count("subgraph cluster_") == 4
    for device in range(4):
        assert f'label="gpu_{device}"' in text
    assert text.count("#f6c342") == 1  # the one NCCLAllreduce
    assert '"gpu_3/y"' in text


def test_dot_without_clusters_or_blobs() -> None:
    text = to_dot(parallel_like_net(), cluster_by_device=False, show_blobs=False)
    assert "subgraph" not in text
    assert "op0 -> op4" in text


def test_render_dot_and_formats(tmp_path: Path) -> None:
    assert render(parallel_like_net(), tmp_path / "g.dot").read_text().startswith("digraph")
    with pytest.raises(ExportError, match=".jpeg"):
        render(parallel_like_net(), tmp_path / "g.jpeg")


def test_render_svg_or_clear_message(tmp_path: Path) -> None:
    if shutil.which("dot") is None:
        with pytest.raises(MissingDependencyError, match="Graphviz"):
            render(parallel_like_net(), tmp_path / "g.svg")
    else:
        assert "<svg" in render(parallel_like_net(), tmp_path / "g.svg").read_text()
