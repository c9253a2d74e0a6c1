"""Restart and resume under torchrun: one of two ranks of examples/train_distributed.py dies
in the middle of saving a checkpoint, torchrun (--max-restarts=1) restarts the job, every
rank resumes from the newest complete checkpoint, and the final parameters (with momentum
and the iteration counter that drives the learning rate) equal an uninterrupted run's
bitwise."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpgraph.checkpoint import CheckpointSet, read_checkpoint

if importlib.util.find_spec("torch") is None or \
        importlib.util.find_spec("torch.distributed.run") is None:
    pytest.skip("torchrun (torch.distributed.run) is not installed: pip install torch",
                allow_module_level=True)
pytestmark = pytest.mark.dist

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_distributed.py"
STEPS, EVERY, CRASH = 24, 5, 15  # the crash hits step 15's save: 10 is the newest complete
TRAIN = ["--steps", str(STEPS), "--batch-size", "8", "--lr-halve-every", "4",
         "--checkpoint-every", str(EVERY), "--keep-checkpoints", "2"]
DIGEST = re.compile(r"rank (\d)/2: .*params sha256 ([0-9a-f]{64})")


def torchrun(directory: Path, launcher: tuple[str, ...] = (),
             script: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", *launcher, str(EXAMPLE), *TRAIN,
               "--checkpoint-dir", str(directory), *script]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)


def kill(job: subprocess.Popen[str]) -> None:
    """torchrun and its workers (their own process group)."""
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.communicate()


def finish(job: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        out, err = job.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill(job)
        pytest.fail("torchrun did not finish within 120 s")
    assert job.returncode == 0, out[-3000:] + err[-3000:]
    return out, err


def digests(output: str) -> dict[str, str]:
    found = dict(DIGEST.findall(output))
    assert sorted(found) == ["0", "1"], output
    return found


def test_killed_rank_restarts_and_resumes_to_bitwise_equal_parameters(tmp_path: Path) -> None:
    jobs = [torchrun(tmp_path / "plain"),  # both at once: the wall time is mostly start-up
            torchrun(tmp_path / "crashed", ("--max-restarts=1",),
                     ("--crash-at-step", str(CRASH)))]
    try:
        (plain, _), (crashed, crashed_err) = [finish(job) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                kill(job)
    log = crashed + crashed_err
    assert f"rank 1: crashing at step {CRASH} as asked" in log
    for rank in (0, 1):
        assert f"rank {rank}/2: attempt 1, resumed from step 10" in crashed, log
    assert re.search(r"Skipping checkpoint step 15 .*no manifest", log), log
    assert "attempt 1" not in plain and "resumed" not in plain

    expected = digests(plain)
    assert len(set(expected.values())) == 1  # every rank holds the same model
    assert digests(crashed) == expected

    for rank in (0, 1):
        sets = [CheckpointSet(tmp_path / run, rank, 2, barrier=lambda name: None)
                for run in ("plain", "crashed")]
        assert [s.latest() for s in sets] == [STEPS, STEPS]
        assert sets[0].steps() == sets[1].steps() == [20, STEPS]  # keep 2: older pruned
        final = [read_checkpoint(s.rank_path(STEPS)) for s in sets]
        assert sorted(final[0]) == ["cpu_0/ITER", "cpu_0/pred_b", "cpu_0/pred_b_momentum",
                                    "cpu_0/pred_w", "cpu_0/pred_w_momentum"]
        assert final[0]["cpu_0/ITER"].tolist() == [STEPS]
        for name, value in final[0].items():
            other = final[1][name]
            assert value.dtype == other.dtype and value.shape == other.shape, name
            assert np.asarray(value).tobytes() == np.asarray(other).tobytes(), name
