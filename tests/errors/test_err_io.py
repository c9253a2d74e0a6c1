"""Checkpoints, export, the CLI and collectives misused: typed errors with the file, blob or
buffer named and the fix; nothing half-written or half-loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _error_checks import expect_error

from dpgraph import checkpoint, cli, core, workspace
from dpgraph.collectives import cpu
from dpgraph.errors import (
    CheckpointError,
    CheckpointWriteError,
    CollectiveError,
    ExportError,
    OperatorError,
    RendezvousError,
    ShapeError,
)
from dpgraph.ir.proto_io import write_proto
from dpgraph.proto import caffe2_pb2

F32 = np.float32


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    workspace.FeedBlob("w", np.ones((2, 3), F32))
    workspace.FeedBlob("b", np.ones(3, F32))
    path = tmp_path / "ok.pb"
    checkpoint.save_checkpoint(path, ["w", "b"])
    return path


def workspace_state() -> dict[str, bytes]:
    return {name: workspace.FetchBlob(name).tobytes() for name in workspace.Blobs()}


@pytest.mark.parametrize("content, fragment", [
    (None, "No such file"),
    (b"", "no checkpoint manifest"),
    (b"\x00\xff garbage" * 10, "not a readable checkpoint"),
])
def test_load_missing_empty_or_garbage_file(tmp_path: Path, content: bytes | None,
                                            fragment: str) -> None:
    path = tmp_path / "bad.pb"
    if content is not None:
        path.write_bytes(content)
    workspace.FeedBlob("w", np.zeros(2, F32))
    before = workspace_state()
    expect_error(lambda: checkpoint.load_checkpoint(path), CheckpointError, ValueError,
                 str(path), fragment)
    assert workspace_state() == before


def test_load_truncated_or_corrupt_checkpoint(saved: Path) -> None:
    data = saved.read_bytes()
    truncated = saved.with_name("truncated.pb")
    truncated.write_bytes(data[:len(data) // 2])
    flipped = bytearray(data)
    flipped[20] ^= 0xFF
    corrupt = saved.with_name("corrupt.pb")
    corrupt.write_bytes(bytes(flipped))
    workspace.FeedBlob("b", np.zeros(3, F32))
    before = workspace_state()
    expect_error(lambda: checkpoint.load_checkpoint(truncated), CheckpointError, ValueError,
                 "truncated.pb", "truncated")
    expect_error(lambda: checkpoint.load_checkpoint(corrupt), CheckpointError, ValueError,
                 "corrupt.pb", "corrupt")
    assert workspace_state() == before


def test_load_checkpoint_of_another_model_loads_nothing(saved: Path) -> None:
    workspace.FeedBlob("w", np.ones((4, 3), F32))
    workspace.FeedBlob("b", np.zeros(3, F32))
    before = workspace_state()
    expect_error(lambda: checkpoint.load_checkpoint(saved), CheckpointError, ValueError,
                 "'w'", "float32[2, 3]", "float32[4, 3]", "different model")
    expect_error(lambda: checkpoint.load_checkpoint(saved, expected=["w", "zzz"]),
                 CheckpointError, ValueError, "['zzz']", "different model")
    assert workspace_state() == before


def test_save_checkpoint_failures_write_nothing(saved: Path, tmp_path: Path) -> None:
    target = tmp_path / "missing.pb"
    expect_error(lambda: checkpoint.save_checkpoint(target, ["w", "nope"]), CheckpointError,
                 ValueError, "['nope']", "init net")
    assert not target.exists()
    directory = tmp_path / "a_directory"
    directory.mkdir()
    expect_error(lambda: checkpoint.save_checkpoint(directory, ["w"]), CheckpointWriteError,
                 OSError, str(directory), "writable")
    assert directory.is_dir() and list(directory.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_directory", "ok.pb"]


def test_export_onnx_without_parameter_values() -> None:
    from dpgraph import export

    net = core.Net("err_export")
    net.FC(["a", "w", "b"], ["y"])
    expect_error(lambda: export.to_onnx(net, {}, {"a": (1, 2)}), ExportError, ValueError,
                 net.Name(), "['w', 'b']", "parameters")


@pytest.mark.parametrize("args, fragment", [
    (["inspect", "{missing}"], "cannot read"),
    (["inspect", "{garbage}"], "not a valid serialized NetDef"),
    (["verify", "{missing}"], "cannot read"),
    (["draw", "{net}", "-o", "{dir}"], "use a .dot, .svg, .png or .pdf output"),
])
def test_cli_with_bad_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            args: list[str], fragment: str) -> None:
    net = caffe2_pb2.NetDef(name="p")
    net.op.add(type="Relu", input=["x"], output=["y"])
    write_proto(net, tmp_path / "net.pb")
    (tmp_path / "garbage.pb").write_bytes(b"\x00\xff garbage" * 10)
    paths = {"missing": str(tmp_path / "missing.pb"), "garbage": str(tmp_path / "garbage.pb"),
             "net": str(tmp_path / "net.pb"), "dir": str(tmp_path)}
    argv = [a.format(**paths) for a in args]
    assert cli.main(argv) != 0
    err = capsys.readouterr().err
    assert err.startswith(f"dpgraph {args[0]}: error:") and fragment in err
    assert "Traceback" not in err


def test_cli_with_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", "--devices", "abc"])
    assert info.value.code == 2
    assert "--devices: invalid int value: 'abc'" in capsys.readouterr().err


def test_collectives_with_mismatched_or_bad_buffers() -> None:
    world = cpu.create()
    a, b = np.ones(3, F32), np.ones(4, F32)
    expect_error(lambda: world.allreduce([a, b]), CollectiveError, RuntimeError,
                 "allreduce", "'cpu'", "copy 1 has shape (4,)", "must match")
    expect_error(lambda: world.allreduce([a, np.ones(3, np.float64)]), CollectiveError,
                 RuntimeError, "float64")
    expect_error(lambda: world.allreduce([[1.0, 2.0, 3.0]]), CollectiveError, RuntimeError,
                 "local copy 0 is a list", "numpy")
    expect_error(lambda: world.broadcast([a], root=3), CollectiveError, RuntimeError,
                 "root 3")
    np.testing.assert_array_equal(a, np.ones(3, F32))
    world.close()
    expect_error(lambda: world.allreduce([a]), CollectiveError, RuntimeError, "destroyed",
                 "CreateCommonWorld")
    expect_error(lambda: cpu.create(rank=3, size=2), RendezvousError, RuntimeError,
                 "rank 3 of 2", "GLOO")


def test_nccl_allreduce_with_mismatched_device_copies() -> None:
    workspace.SetVirtualGpus(2)
    for device, size in ((0, 3), (1, 4)):
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, device)):
            workspace.FeedBlob(f"g{device}", np.ones(size, F32))
    net = core.Net("err_nccl")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
        net.NCCLAllreduce(["g0", "g1"], ["g0", "g1"])
    before = workspace_state()
    error = expect_error(lambda: workspace.RunNetOnce(net), OperatorError, ShapeError,
                         "NCCLAllreduce", "'g1' is [4] float32", "gpu_1")
    assert isinstance(error, RuntimeError)
    assert workspace_state() == before
