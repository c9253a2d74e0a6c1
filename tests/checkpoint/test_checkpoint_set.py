"""Checkpoint sets (dpgraph.checkpoint.CheckpointSet): one atomic file per rank and step, a
manifest written last; the newest complete step is found on resume; crashes, full disks and
unwritable directories leave the previous checkpoint usable and raise typed errors."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph import checkpoint, workspace
from dpgraph.errors import CheckpointError, CheckpointWriteError, CollectiveTimeoutError
from dpgraph.runtime import checkpoint_file
from dpgraph.runtime.checkpoint_set import MANIFEST_FILE
from dpgraph.runtime.workspace import Workspace

F32 = np.float32
NAMES = ["w", "m", "ITER"]


def fill(ws: Any, step: int, rank: int = 0) -> None:
    """Blobs whose values depend on the step and the rank."""
    ws.feed_blob("w", np.full((2, 3), step + 0.25 * rank, F32))
    ws.feed_blob("m", np.arange(4, dtype=F32) * step)
    ws.feed_blob("ITER", np.array([step], np.int64))


def current() -> Any:
    from dpgraph.runtime import api

    return api.current()


def save_steps(root: Path, steps: list[int], keep: int = 0) -> checkpoint.CheckpointSet:
    ckpt = checkpoint.CheckpointSet(root, keep=keep)
    for step in steps:
        fill(current(), step)
        ckpt.save(step, NAMES)
    return ckpt


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (names relative) and its bytes: a fingerprint."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def values(ws: Any) -> dict[str, bytes]:
    return {n: np.asarray(ws.fetch_blob(n)).tobytes() for n in NAMES if ws.has_blob(n)}


# --- saving and loading --------------------------------------------------------------------
def test_save_writes_rank_files_and_a_manifest_that_describes_them(tmp_path: Path) -> None:
    ckpt = save_steps(tmp_path, [7])
    step_dir = tmp_path / "step-00000007"
    assert sorted(p.name for p in step_dir.iterdir()) == [MANIFEST_FILE, "rank-00000.pb"]
    manifest = json.loads((step_dir / MANIFEST_FILE).read_text())
    data = (step_dir / "rank-00000.pb").read_bytes()
    assert manifest == {"format": "dpgraph-checkpoint-set", "version": 1, "step": 7,
                        "world_size": 1,
                        "files": [{"rank": 0, "name": "rank-00000.pb", "size": len(data),
                                   "sha256": hashlib.sha256(data).hexdigest()}]}
    # each rank file is a valid one-file checkpoint with its own CRC
    assert checkpoint.read_checkpoint(step_dir / "rank-00000.pb")["ITER"].tolist() == [7]
    assert ckpt.latest() == 7 and ckpt.steps() == [7]


def test_load_restores_the_newest_complete_step_exactly(tmp_path: Path) -> None:
    save_steps(tmp_path, [3, 6])
    saved = values(current())
    workspace.ResetWorkspace()
    fill(current(), 0)
    assert checkpoint.CheckpointSet(tmp_path).load(expected=NAMES) == 6
    assert values(current()) == saved


def test_no_checkpoint_loads_nothing(tmp_path: Path) -> None:
    fill(current(), 1)
    before = values(current())
    assert checkpoint.CheckpointSet(tmp_path / "absent").load() is None
    assert checkpoint.CheckpointSet(tmp_path).latest() is None
    assert values(current()) == before


def test_two_ranks_meet_in_barriers_and_each_loads_its_own_file(tmp_path: Path) -> None:
    gate = threading.Barrier(2, timeout=10)
    order: list[tuple[int, str]] = []

    def barrier_for(rank: int) -> Callable[[str], None]:
        def barrier(name: str) -> None:
            order.append((rank, name))
            gate.wait()
        return barrier

    spaces = [Workspace(f"rank{r}") for r in range(2)]
    sets = [checkpoint.CheckpointSet(tmp_path, r, 2, barrier=barrier_for(r)) for r in range(2)]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            fill(spaces[rank], 4, rank)
            sets[rank].save(4, NAMES, spaces[rank])
        except BaseException as error:  # noqa: BLE001  (reported below)
            errors.append(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not errors, errors
    assert sorted(name for _, name in order) == ["step-00000004/committed"] * 2 + \
        ["step-00000004/written"] * 2
    manifest = json.loads((tmp_path / "step-00000004" / MANIFEST_FILE).read_text())
    assert [f["name"] for f in manifest["files"]] == ["rank-00000.pb", "rank-00001.pb"]
    for rank in range(2):
        fresh = Workspace(f"fresh{rank}")
        fill(fresh, 0)
        assert sets[rank].load(expected=NAMES, workspace=fresh) == 4
        assert values(fresh) == values(spaces[rank])
    assert values(spaces[0]) != values(spaces[1])  # the ranks' files really differ


def test_every_rank_rejects_a_step_whose_other_rank_file_is_damaged(tmp_path: Path) -> None:
    sets = [checkpoint.CheckpointSet(tmp_path, r, 2, barrier=lambda name: None)
            for r in range(2)]
    spaces = [Workspace(f"rank{r}") for r in range(2)]
    for step in (5, 10):
        for rank in (1, 0):
            fill(spaces[rank], step, rank)
            sets[rank].write_rank(step, NAMES, spaces[rank])
        sets[0].commit(step)  # the barriers are no-ops: rank 0 commits after both wrote
    assert [s.latest() for s in sets] == [10, 10]
    damage_flip(tmp_path / "step-00000010", "rank-00001.pb")
    assert [s.latest() for s in sets] == [5, 5]  # rank 0 too: all ranks pick one step
    fresh = Workspace("fresh")
    assert sets[0].load(expected=NAMES, workspace=fresh) == 5
    assert fresh.fetch_blob("ITER").tolist() == [5]


def test_another_world_size_does_not_resume(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    save_steps(tmp_path, [2])
    two = checkpoint.CheckpointSet(tmp_path, 0, 2, barrier=lambda name: None)
    with caplog.at_level(logging.WARNING, "dpgraph.checkpoint"):
        assert two.latest() is None
    assert "written by 1 ranks, this job has 2" in caplog.text
    with pytest.raises(CheckpointError, match="same number of ranks"):
        two.validate(2)


def test_load_of_another_model_loads_nothing(tmp_path: Path) -> None:
    save_steps(tmp_path, [2])
    workspace.ResetWorkspace()
    current().feed_blob("w", np.zeros((5, 5), F32))
    before = np.asarray(current().fetch_blob("w")).tobytes()
    with pytest.raises(CheckpointError, match=r"rank-00000\.pb.*different model"):
        checkpoint.CheckpointSet(tmp_path).load(expected=NAMES)
    assert np.asarray(current().fetch_blob("w")).tobytes() == before
    assert not current().has_blob("m")


# --- damaged and incomplete steps ------------------------------------------------------------
def damage_truncate(step_dir: Path) -> None:
    path = step_dir / "rank-00000.pb"
    path.write_bytes(path.read_bytes()[:10])


def damage_flip(step_dir: Path, name: str = "rank-00000.pb") -> None:
    path = step_dir / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def damage_manifest_garbage(step_dir: Path) -> None:
    (step_dir / MANIFEST_FILE).write_bytes(b"\x00\xffnot json{")


def damage_manifest_truncated(step_dir: Path) -> None:
    path = step_dir / MANIFEST_FILE
    path.write_bytes(path.read_bytes()[:25])


def damage_manifest_missing(step_dir: Path) -> None:
    (step_dir / MANIFEST_FILE).unlink()


def damage_rank_missing(step_dir: Path) -> None:
    (step_dir / "rank-00000.pb").unlink()


def damage_manifest_foreign(step_dir: Path) -> None:
    manifest = json.loads((step_dir / MANIFEST_FILE).read_text())
    manifest["files"][0]["name"] = "../../etc/passwd"
    (step_dir / MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage, reason", [
    (damage_truncate, "truncated"),
    (damage_flip, "sha256"),
    (damage_manifest_garbage, "not a valid dpgraph-checkpoint-set manifest"),
    (damage_manifest_truncated, "not a valid dpgraph-checkpoint-set manifest"),
    (damage_manifest_missing, "no manifest"),
    (damage_rank_missing, "cannot read rank 0's checkpoint file"),
    (damage_manifest_foreign, "one file per rank"),
])
def test_damaged_newer_step_is_skipped_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None],
        reason: str) -> None:
    ckpt = save_steps(tmp_path, [5, 10])
    damage(tmp_path / "step-00000010")
    with caplog.at_level(logging.WARNING, "dpgraph.checkpoint"):
        assert ckpt.latest() == 5
    assert "step 10" in caplog.text and reason in caplog.text
    assert "step-00000010" in caplog.text
    with pytest.raises(CheckpointError, match=reason):
        ckpt.validate(10)
    workspace.ResetWorkspace()
    assert ckpt.load(expected=NAMES) == 5
    assert current().fetch_blob("ITER").tolist() == [5]


def test_crash_mid_write_leaves_the_previous_checkpoint_usable(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    ckpt = save_steps(tmp_path, [5])
    before = tree(tmp_path)
    # what a killed process leaves behind: a half-written temporary file, no rename
    step_dir = tmp_path / "step-00000010"
    step_dir.mkdir()
    (step_dir / ".rank-00000.pb.x1y2.tmp").write_bytes(b"\x0a\x05half")
    with caplog.at_level(logging.WARNING, "dpgraph.checkpoint"):
        assert ckpt.latest() == 5
    assert "no manifest" in caplog.text
    # a crash (an exception that is not an OSError) inside the write: the temporary goes
    fill(current(), 15)

    def dies(fd: int, data: bytes) -> None:
        os.write(fd, data[:7])
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint_file, "_write_all", dies)
        with pytest.raises(KeyboardInterrupt):
            ckpt.save(15, NAMES)
    assert not (tmp_path / "step-00000015" / "rank-00000.pb").exists()
    assert [p.name for p in (tmp_path / "step-00000015").glob("*.tmp")] == []
    assert {k: v for k, v in tree(tmp_path).items() if "step-00000005" in k} == before
    # the job, restarted, saves the crashed step again over the leftovers
    fill(current(), 10)
    ckpt.save(10, NAMES)
    assert ckpt.latest() == 10  # the empty step 15 is skipped
    assert checkpoint.read_checkpoint(step_dir / "rank-00000.pb")["ITER"].tolist() == [10]


def test_a_stale_manifest_never_vouches_for_rewritten_files(tmp_path: Path) -> None:
    ckpt = save_steps(tmp_path, [5, 10])
    fill(current(), 99)
    ckpt.write_rank(10, NAMES)  # rewritten, not committed (the job died before commit)
    assert not (tmp_path / "step-00000010" / MANIFEST_FILE).exists()
    assert ckpt.latest() == 5


# --- failed writes: typed, and the previous checkpoint intact ---------------------------------
def enospc_after(fraction: float, only: str = "") -> Callable[[int, bytes], None]:
    real = checkpoint_file._write_all

    def write(fd: int, data: bytes) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else ""
        if only and only not in target:
            real(fd, data)
            return
        os.write(fd, data[:int(len(data) * fraction)])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write


def test_full_disk_on_a_rank_file_is_typed_and_keeps_the_previous_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = save_steps(tmp_path, [5], keep=1)
    before = tree(tmp_path)
    fill(current(), 10)
    state = values(current())
    monkeypatch.setattr(checkpoint_file, "_write_all", enospc_after(0.5))
    with pytest.raises(CheckpointWriteError) as info:
        ckpt.save(10, NAMES)
    error = info.value
    assert isinstance(error, OSError) and isinstance(error, CheckpointError)
    assert str(tmp_path / "step-00000010" / "rank-00000.pb") in str(error)
    assert "file system is full" in str(error) and "free space" in str(error)
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.ENOSPC
    assert tree(tmp_path) == before  # no temporary, no half file, nothing pruned
    assert not (tmp_path / "step-00000010").exists()
    assert values(current()) == state
    monkeypatch.undo()
    assert ckpt.latest() == 5


def test_full_disk_on_the_manifest_leaves_the_step_incomplete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = save_steps(tmp_path, [5], keep=1)
    before = tree(tmp_path)
    fill(current(), 10)
    monkeypatch.setattr(checkpoint_file, "_write_all", enospc_after(0.3, MANIFEST_FILE))
    with pytest.raises(CheckpointWriteError, match=r"manifest .*MANIFEST\.json.*full"):
        ckpt.save(10, NAMES)
    monkeypatch.undo()
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if k.startswith("step-00000005")} == before
    assert sorted(after) == sorted(before) + ["step-00000010/rank-00000.pb"]
    assert ckpt.latest() == 5  # step 5 was not pruned: step 10 never became complete


def test_unwritable_directory_is_typed_and_keeps_the_previous_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ckpt"
    ckpt = save_steps(root, [5])
    before = tree(root)
    fill(current(), 10)
    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    os.chmod(root, 0o555)
    try:
        if os.access(root, os.W_OK):  # root ignores permissions: fail as others would
            monkeypatch.setattr(Path, "mkdir", denied)
            monkeypatch.setattr(checkpoint_file.tempfile, "mkstemp", denied)
        with pytest.raises(CheckpointWriteError) as info:
            ckpt.save(10, NAMES)
    finally:
        os.chmod(root, 0o755)
    message = str(info.value)
    assert str(root / "step-00000010" / "rank-00000.pb") in message
    assert "not writable" in message and "permissions" in message
    monkeypatch.undo()
    assert tree(root) == before and ckpt.latest() == 5


def test_a_file_in_the_way_of_the_directory_is_typed(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_bytes(b"x")
    fill(current(), 1)
    with pytest.raises(CheckpointWriteError, match="not_a_dir"):
        checkpoint.CheckpointSet(blocker / "ckpt").save(1, NAMES)
    assert blocker.read_bytes() == b"x"


def test_one_file_save_on_a_full_disk_keeps_the_old_file(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    path = tmp_path / "model.pb"
    fill(current(), 1)
    checkpoint.save_checkpoint(path, NAMES)
    old = path.read_bytes()
    fill(current(), 2)
    monkeypatch.setattr(checkpoint_file, "_write_all", enospc_after(0.5))
    with pytest.raises(CheckpointWriteError, match="model.pb.*full"):
        checkpoint.save_checkpoint(path, NAMES)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["model.pb"]


# --- pruning --------------------------------------------------------------------------------
def test_pruning_keeps_the_newest_complete_checkpoints(tmp_path: Path) -> None:
    ckpt = save_steps(tmp_path, [1, 2])
    (tmp_path / "step-00000003").mkdir()  # an incomplete leftover older than the next save
    (tmp_path / "step-00000003" / "rank-00000.pb").write_bytes(b"partial")
    (tmp_path / "step-00000009").mkdir()  # newer than the commit: not touched
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "step-1").mkdir()  # not a name this set writes: never listed, never removed
    keep2 = checkpoint.CheckpointSet(tmp_path, keep=2)
    for step in (4, 5):
        fill(current(), step)
        keep2.save(step, NAMES)
    assert ckpt.steps() == [4, 5, 9]
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "step-1").is_dir()
    assert keep2.latest() == 5
    all_kept = save_steps(tmp_path / "all", [1, 2, 3], keep=0)
    assert all_kept.steps() == [1, 2, 3]


def test_prune_failures_are_logged_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    ckpt = save_steps(tmp_path, [1], keep=1)

    def refuse(path: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr("dpgraph.runtime.checkpoint_set.shutil.rmtree", refuse)
    fill(current(), 2)
    with caplog.at_level(logging.WARNING, "dpgraph.checkpoint"):
        ckpt.save(2, NAMES)
    assert "Could not remove old checkpoint" in caplog.text and "step-00000001" in caplog.text
    assert ckpt.latest() == 2


# --- configuration and barriers --------------------------------------------------------------
@pytest.mark.parametrize("kwargs, fragment", [
    ({"rank": 2, "world_size": 2, "barrier": print}, "rank 2 is outside 0..1"),
    ({"rank": 0, "world_size": 2}, "need a barrier"),
    ({"keep": -1}, "keep must be an int >= 0"),
    ({"world_size": 0}, "world_size must be an int >= 1"),
    ({"rank": True}, "rank must be an int"),
])
def test_bad_configuration_is_typed(tmp_path: Path, kwargs: dict[str, Any],
                                    fragment: str) -> None:
    with pytest.raises(CheckpointError, match=fragment):
        checkpoint.CheckpointSet(tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_bad_step_is_typed(tmp_path: Path) -> None:
    fill(current(), 1)
    with pytest.raises(CheckpointError, match="step must be an int >= 0"):
        checkpoint.CheckpointSet(tmp_path).save(-1, NAMES)
    with pytest.raises(CheckpointError, match="missing or empty.*'nope'"):
        checkpoint.CheckpointSet(tmp_path).save(1, ["w", "nope"])
    assert list(tmp_path.iterdir()) == []


def meet(barriers: list[checkpoint.StoreBarrier], name: str) -> list[int]:
    """Every barrier called from its own thread; the ranks that got through."""
    done: list[int] = []

    def arrive(rank: int) -> None:
        barriers[rank](name)
        done.append(rank)

    threads = [threading.Thread(target=arrive, args=(r,)) for r in range(len(barriers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    return sorted(done)


def test_store_barrier_releases_all_ranks_and_times_out_typed() -> None:
    dist = pytest.importorskip("torch.distributed", reason="StoreBarrier uses a torch store")
    store = dist.HashStore()
    barriers = [checkpoint.StoreBarrier(store, 2, prefix="attempt-0", timeout=10)
                for _ in range(2)]
    assert meet(barriers, "step-1") == [0, 1]
    assert meet(barriers, "step-2") == [0, 1]
    lonely = checkpoint.StoreBarrier(store, 2, prefix="attempt-1", timeout=0.2)
    with pytest.raises(CollectiveTimeoutError, match=r"attempt-1/step-2.*restart the job"):
        lonely("step-2")


def test_store_barrier_sessions_ignore_a_crashed_attempts_arrivals() -> None:
    dist = pytest.importorskip("torch.distributed", reason="StoreBarrier uses a torch store")
    store = dist.HashStore()  # outlives the attempts, as torchrun's agent store does
    first = [checkpoint.StoreBarrier(store, 2, prefix="job", timeout=0.2, rank=r)
             for r in range(2)]
    with pytest.raises(CollectiveTimeoutError, match="job/1/step-5"):
        first[0]("step-5")  # rank 1 died before arriving
    second = [checkpoint.StoreBarrier(store, 2, prefix="job", timeout=0.5, rank=r)
              for r in range(2)]
    assert [b.prefix for b in second] == ["job/2", "job/2"]
    with pytest.raises(CollectiveTimeoutError):
        second[0]("step-5")  # the old arrival does not complete the new barrier
    assert meet(second, "step-10") == [0, 1]
