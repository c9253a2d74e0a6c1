"""Checkpoint files: exact round trips, atomic writes, typed errors, and resuming a
Parallelize'd model bitwise."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph import brew, checkpoint, core, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.errors import CheckpointError
from dpgraph.proto import caffe2_pb2

VALUES: dict[str, Any] = {
    "f32": np.random.RandomState(0).randn(3, 4).astype(np.float32),
    "f64": np.array([[1e-300, -2.5], [np.pi, np.inf]], dtype=np.float64),
    "i32": np.array([1, -2, 2**31 - 1], dtype=np.int32),
    "iter": np.array([2**40 + 7], dtype=np.int64),
    "b": np.array([True, False, True]),
    "f16": np.array([0.5, -1.25, 65504.0], dtype=np.float16),
    "u8": np.arange(6, dtype=np.uint8).reshape(2, 3),
    "scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "nan": np.array([np.nan, -0.0], dtype=np.float32),
    "strings": np.array([b"ab", b"", b"\x00z"], dtype=object),
    "text": b"opaque bytes",
}


def _feed_all() -> None:
    for name, value in VALUES.items():
        workspace.FeedBlob(name, value)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    _feed_all()
    path = tmp_path / "ckpt.pb"
    checkpoint.save_checkpoint(path, list(VALUES))
    workspace.ResetWorkspace()
    loaded = checkpoint.load_checkpoint(path)
    assert loaded == sorted(VALUES)
    for name, want in VALUES.items():
        got = workspace.FetchBlob(name)
        if isinstance(want, bytes):
            assert got == want
            continue
        assert got.dtype == want.dtype and got.shape == want.shape, name
        if want.dtype == object:
            assert list(got.reshape(-1)) == list(want.reshape(-1))
        else:
            assert got.tobytes() == want.tobytes(), name


def test_file_is_tensor_protos_with_manifest(tmp_path: Path) -> None:
    _feed_all()
    path = tmp_path / "ckpt.pb"
    checkpoint.save_checkpoint(path, ["iter", "f32"])
    message = caffe2_pb2.TensorProtos()
    message.ParseFromString(path.read_bytes())
    assert [p.name for p in message.protos] == ["f32", "iter", checkpoint.MANIFEST_NAME]
    assert message.protos[1].data_type == caffe2_pb2.TensorProto.INT64
    assert list(message.protos[2].int64_data)[:2] == [1, 2]


def test_write_is_atomic(tmp_path: Path) -> None:
    _feed_all()
    path = tmp_path / "ckpt.pb"
    path.write_bytes(b"old")
    checkpoint.save_checkpoint(path, ["f32"])
    assert os.listdir(tmp_path) == ["ckpt.pb"]
    with pytest.raises(CheckpointError):
        checkpoint.save_checkpoint(path, ["f32", "no_such_blob"])
    assert os.listdir(tmp_path) == ["ckpt.pb"]
    assert checkpoint.read_checkpoint(path).keys() == {"f32"}


def test_truncated_files_raise(tmp_path: Path) -> None:
    _feed_all()
    path = tmp_path / "ckpt.pb"
    checkpoint.save_checkpoint(path, ["f32", "iter", "i32"])
    data = path.read_bytes()
    for cut in range(0, len(data), 7):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            checkpoint.load_checkpoint(path)


def test_corrupt_and_foreign_files_raise(tmp_path: Path) -> None:
    _feed_all()
    path = tmp_path / "ckpt.pb"
    checkpoint.save_checkpoint(path, ["f32"])
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        checkpoint.load_checkpoint(path)
    path.write_bytes(caffe2_pb2.NetDef(name="not a checkpoint").SerializeToString())
    with pytest.raises(CheckpointError):
        checkpoint.load_checkpoint(path)
    with pytest.raises(CheckpointError):
        checkpoint.load_checkpoint(tmp_path / "absent.pb")


def test_missing_blob_and_shape_mismatch(tmp_path: Path) -> None:
    _feed_all()
    path = tmp_path / "ckpt.pb"
    checkpoint.save_checkpoint(path, ["f32", "iter"])
    with pytest.raises(CheckpointError, match="missing"):
        checkpoint.load_checkpoint(path, expected=["f32", "i32"])
    workspace.FeedBlob("f32", np.zeros((4, 3), dtype=np.float32))
    workspace.FeedBlob("iter", np.array([0], dtype=np.int64))
    with pytest.raises(CheckpointError, match="different model"):
        checkpoint.load_checkpoint(path)
    np.testing.assert_array_equal(workspace.FetchBlob("iter"), [0])  # nothing loaded
    workspace.FeedBlob("f32", np.zeros((3, 4), dtype=np.float64))
    with pytest.raises(CheckpointError):
        checkpoint.load_checkpoint(path)


# --- resuming a Parallelize'd model ---------------------------------------------------
BATCH, IN, HIDDEN, OUT = 8, 5, 6, 3


def _forward(model: Any, loss_scale: float) -> list[Any]:
    hidden = brew.relu(model, brew.fc(model, "data", "fc1", IN, HIDDEN), "relu1")
    out = brew.fc(model, hidden, "fc2", HIDDEN, OUT)
    dist = model.net.SquaredL2Distance([out, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def _optimizer(model: Any) -> Any:
    return optimizer.build_sgd(model, 0.05, momentum=0.9, policy="step", stepsize=7,
                               gamma=0.5)


def _build(gpu: bool) -> Any:
    model = model_helper.ModelHelper(name="resume")
    data_parallel_model.Parallelize(model, lambda m: None, _forward,
                                    optimizer_builder_fun=_optimizer, devices=[0, 1],
                                    cpu_device=not gpu)
    return model


def _feed(model: Any, step: int, gpu: bool) -> None:
    rs = np.random.RandomState(step)
    for d in model._devices:
        option = core.DeviceOption(caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU, d)
        workspace.FeedBlob(f"{model._device_prefix}_{d}/data",
                           rs.randn(BATCH, IN).astype(np.float32), option)
        workspace.FeedBlob(f"{model._device_prefix}_{d}/label",
                           rs.randn(BATCH, OUT).astype(np.float32), option)


def _train(model: Any, steps: range, gpu: bool) -> None:
    for step in steps:
        _feed(model, step, gpu)
        data_parallel_model.RunNet(model, 1)


def _state(model: Any) -> dict[str, np.ndarray]:
    names = checkpoint.checkpoint_blob_names(model)
    names += [str(p) for p in model.params]
    return {n: workspace.FetchBlob(n) for n in names}


def _seed_params(model: Any) -> None:
    for param in model.GetParams(f"{model._device_prefix}_0/"):
        shape = workspace.FetchBlob(str(param)).shape
        workspace.FeedBlob(str(param), np.random.RandomState(len(str(param))).randn(
            *shape).astype(np.float32))


@pytest.mark.parametrize("gpu", [False, True])
def test_resume_is_bitwise_identical(tmp_path: Path, gpu: bool) -> None:
    if gpu:
        workspace.SetVirtualGpus(2)
    path = tmp_path / "model.ckpt"
    model = _build(gpu)
    workspace.RunNetOnce(model.param_init_net)
    _seed_params(model)
    data_parallel_model.FinalizeAfterCheckpoint(model)
    data_parallel_model.CreateNet(model)
    checkpoint.save_model_checkpoint(model, tmp_path / "initial.ckpt")
    _train(model, range(20), gpu)
    reference = _state(model)

    workspace.ResetWorkspace()
    model = _build(gpu)
    data_parallel_model.RunInitNet(model)
    checkpoint.load_model_checkpoint(model, tmp_path / "initial.ckpt")
    _train(model, range(10), gpu)
    saved = checkpoint.save_model_checkpoint(model, path)
    assert any("optimizer_iteration" in n or "ITER" in n.upper() for n in saved)
    assert all(n.startswith(f"{model._device_prefix}_0/") or "iteration" in n for n in saved)

    workspace.SwitchWorkspace("resumed", True)
    try:
        model = _build(gpu)
        data_parallel_model.RunInitNet(model)
        checkpoint.load_model_checkpoint(model, path)
        _train(model, range(10, 20), gpu)
        resumed = _state(model)
    finally:
        workspace.SwitchWorkspace("default")
        workspace.ResetWorkspace()
    assert resumed.keys() == reference.keys()
    for name, want in reference.items():
        assert resumed[name].dtype == want.dtype
        assert resumed[name].tobytes() == want.tobytes(), name
