"""experiment_util.ModelTrainerLog and timeout_guard as Caffe2 has them
(caffe2-jobs-facts §3.1-3.2)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
from collections import OrderedDict

import numpy as np
import pytest

from dpgraph import experiment_util, timeout_guard


class _Recorder(experiment_util.ExternalLogger):
    def __init__(self, fail: bool = False) -> None:
        self.args = None
        self.rows: list[OrderedDict] = []
        self.fail = fail

    def set_runtime_args(self, runtime_args):
        self.args = runtime_args

    def log(self, log_dict):
        if self.fail:
            raise ValueError("broken sink")
        self.rows.append(log_dict)


def test_model_trainer_log_file_format(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    ok, broken = _Recorder(), _Recorder(fail=True)

    class Args:
        def __init__(self):
            self.lr = 0.1

    log = experiment_util.ModelTrainerLog("exp", Args(), external_loggers=[ok, broken])
    assert re.fullmatch(r"exp_\d{8}_\d{6}", log.experiment_id)
    assert log.filename == log.experiment_id + ".log"
    assert ok.args["lr"] == 0.1 and ok.args["experiment_id"] == log.experiment_id
    assert "hostname" in ok.args
    caplog.set_level(logging.WARNING, logger="experiment_logger")
    log.log(input_count=64, batch_count=2,
            additional_values={"loss": np.array([0.5]), "accuracy": 0.25})
    log.log(input_count=128, batch_count=4, additional_values={"loss": 0.4, "accuracy": 0.5})
    lines = (tmp_path / log.filename).read_text().splitlines()
    assert lines[0].startswith("# <") and len(lines) == 4
    assert lines[1] == ("time_spent,cumulative_time_spent,input_count,cumulative_input_count,"
                        "cumulative_batch_count,inputs_per_sec,accuracy,loss")
    first = lines[2].split(",")
    assert first[2:5] == ["64", "64", "2"] and first[-2:] == ["0.25", "[0.5]"]
    assert lines[3].split(",")[2:5] == ["64", "128", "4"]
    assert [list(r)[-2:] for r in ok.rows] == [["accuracy", "loss"]] * 2
    assert "Failed to call ExternalLogger" in caplog.text


def test_model_trainer_log_plain_args(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = experiment_util.ModelTrainerLog("plain", {"a": 1})
    assert log.external_loggers == [] and log.headers is None
    assert (tmp_path / log.filename).read_text() == "# {'a': 1}\n"


def test_guard_quiet_when_done_and_fires_with_the_caffe2_message(caplog):
    fired = []
    with timeout_guard.CompleteInTimeOrDie(5, exit_fn=fired.append) as watcher:
        pass
    watcher.join(5)
    assert watcher.completed and not watcher.fired and fired == []
    caplog.set_level(logging.ERROR, logger="timeout_guard")
    with timeout_guard.CompleteInTimeOrDie(0.05, exit_fn=fired.append) as watcher:
        watcher.join(5)
    assert fired == [1] and watcher.fired
    assert re.search(r"Call did not finish in time\. Timeout:0\.05s PID: \d+", caplog.text)


def test_guard_stays_armed_when_the_block_raises():
    fired = []
    with pytest.raises(KeyError):
        with timeout_guard.CompleteInTimeOrDie(0.05, exit_fn=fired.append) as watcher:
            raise KeyError("boom")
    watcher.join(5)
    assert fired == [1]  # Caffe2 completes the watcher only on a normal exit


def test_timeout_sends_sigint_to_the_process():
    script = textwrap.dedent("""
        import time
        from dpgraph import timeout_guard
        try:
            with timeout_guard.CompleteInTimeOrDie(0.2):
                time.sleep(30)
        except KeyboardInterrupt:
            print("interrupted")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert "interrupted" in done.stdout
    assert "Call did not finish in time" in done.stderr
