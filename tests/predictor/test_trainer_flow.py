"""A Caffe2 ImageNet-style trainer (resnet50_trainer's CPU path, trimmed to a small
ResNeXt) runs through the import alias: Parallelize on 2 CPU devices, MultiPrecisionSgd with
weight decay, timeout_guard, ModelTrainerLog, SaveModel with predictor_exporter.save_to_db,
and a second run resuming with LoadModel + FinalizeAfterCheckpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).with_name("_imagenet_trainer.py")


def _run(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), *map(str, args)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_trainer_trains_saves_and_resumes(tmp_path):
    first = _run(tmp_path, 1)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "resnext_model_1.mdl").exists()
    assert int(np.load(tmp_path / "iteration.npy").item()) == 2
    (log,) = tmp_path.glob("resnext18_gpu2_b4_L10_lr0.10_v2_*.log")
    lines = log.read_text().splitlines()
    assert lines[0] == "# {'num_epochs': 1}"
    assert lines[1].split(",") == [
        "time_spent", "cumulative_time_spent", "input_count", "cumulative_input_count",
        "cumulative_batch_count", "inputs_per_sec", "accuracy", "epoch", "learning_rate",
        "loss", "top1_test_accuracy", "top5_test_accuracy"]
    assert lines[2].split(",")[2:5] == ["8", "8", "1"]
    second = _run(tmp_path, 2, tmp_path / "resnext_model_1.mdl")
    assert second.returncode == 0, second.stderr[-3000:]
    assert int(np.load(tmp_path / "iteration.npy").item()) == 4  # resumed at iteration 2
    assert (tmp_path / "resnext_model_2.mdl").exists()
    assert not (tmp_path / "resnext_model_1.mdl").exists()
