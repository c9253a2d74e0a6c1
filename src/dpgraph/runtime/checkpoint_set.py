"""A checkpoint set: the checkpoints of a multi-rank job, one per step, one file per rank,
each made complete by a manifest written last.

Layout under ``directory`` (a file system every rank reaches, like a FileStore's)::

    step-00000040/rank-00000.pb    rank 0's blobs (the checkpoint_file format, own CRC)
    step-00000040/rank-00001.pb
    step-00000040/MANIFEST.json    written by rank 0 once every rank's file is in place

``MANIFEST.json`` is ``{"format": "dpgraph-checkpoint-set", "version": 1, "step": 40,
"world_size": 2, "files": [{"rank": 0, "name": "rank-00000.pb", "size": ..., "sha256":
...}, ...]}``.  Every file, the manifest included, is written atomically (temporary file,
fsync, rename, directory fsync), so a crash during a save leaves a step without a valid
manifest, and :meth:`CheckpointSet.latest` skips it (with a logged warning) for the newest
step whose manifest is valid and whose files all match it.  After a commit rank 0 prunes all
but the newest ``keep`` complete checkpoints.

A save is :meth:`CheckpointSet.write_rank` on every rank, then :meth:`CheckpointSet.commit`
(a barrier, the manifest and pruning on rank 0, a barrier); :meth:`CheckpointSet.save` does
both.  Ranks agree on the step to resume from because each validates every rank's file of
the same directory (no rank writes while others resume: a save needs every rank).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpgraph.errors import CheckpointError, CheckpointWriteError, CollectiveTimeoutError
from dpgraph.runtime import api
from dpgraph.runtime.checkpoint_file import (
    apply_checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    fsync_dir,
    write_atomic,
)

logger = logging.getLogger("dpgraph.checkpoint")

SET_FORMAT = "dpgraph-checkpoint-set"
SET_VERSION = 1
MANIFEST_FILE = "MANIFEST.json"
MAX_MANIFEST_BYTES = 1 << 20
_STEP_DIR = re.compile(r"step-(\d+)")

#: ``barrier(name)`` returns once every rank has called it with the same ``name``.
Barrier = Callable[[str], None]


@dataclass(frozen=True)
class RankFile:
    """One rank's file as the manifest lists it."""

    rank: int
    name: str
    size: int
    sha256: str


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pb"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _describe(path: Path, data: bytes, rank: int) -> RankFile:
    return RankFile(rank, path.name, len(data), hashlib.sha256(data).hexdigest())


class StoreBarrier:
    """A barrier over a ``torch.distributed`` store (TCPStore, FileStore, a PrefixStore):
    each call adds one arrival under its key; the last rank to arrive releases the others.

    A store can outlive a job attempt (torchrun's agent store across restarts, a FileStore
    directory used again), and old arrivals must not count.  With ``rank``, each barrier
    object takes the next *session* number of its rank (the n-th barrier a rank creates on
    this store and prefix is session n, the same on every rank of one attempt) and keys live
    under ``<prefix>/<session>``; without it, give each attempt its own ``prefix`` (e.g. with
    torchrun's ``TORCHELASTIC_RESTART_COUNT``).
    """

    def __init__(self, store: Any, world_size: int, prefix: str = "dpgraph/checkpoint",
                 timeout: float = 300.0, rank: int | None = None) -> None:
        self.store, self.world_size, self.timeout = store, world_size, timeout
        self.prefix = prefix
        if rank is not None:
            session = self._store_call(prefix, lambda: store.add(f"{prefix}/session/{rank}", 1))
            self.prefix = f"{prefix}/{session}"

    def __call__(self, name: str) -> None:
        key = f"{self.prefix}/{name}"

        def meet() -> None:
            if self.store.add(f"{key}/arrived", 1) == self.world_size:
                self.store.set(f"{key}/released", "1")
            self.store.wait([f"{key}/released"], datetime.timedelta(seconds=self.timeout))
        self._store_call(key, meet)

    def _store_call(self, key: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except RuntimeError as error:  # torch's stores raise RuntimeError subclasses
            raise CollectiveTimeoutError(
                f"Checkpoint barrier {key!r}: not every one of the {self.world_size} ranks "
                f"arrived within {self.timeout:g}s, or the store failed ({error}); a rank "
                "died or is stuck. The previous complete checkpoint is still usable; restart "
                "the job.") from error


class CheckpointSet:
    """The checkpoints of one job in ``directory``, as rank ``rank`` of ``world_size`` sees
    them.

    Args:
        directory: where step directories go; shared by every rank.
        rank, world_size: this process's rank and the number of ranks.
        keep: complete checkpoints kept after each commit (0: keep all).
        barrier: ``barrier(name)`` across the ranks (e.g. :class:`StoreBarrier`); required
            when ``world_size > 1``.

    Raises:
        CheckpointError: an invalid rank, world size or keep, or no barrier for several ranks.
    """

    def __init__(self, directory: str | os.PathLike[str], rank: int = 0, world_size: int = 1,
                 keep: int = 2, barrier: Barrier | None = None) -> None:
        _check_int("world_size", world_size, 1)
        _check_int("rank", rank, 0)
        _check_int("keep", keep, 0)
        if rank >= world_size:
            raise CheckpointError(f"CheckpointSet {os.fspath(directory)!r}: rank {rank} is "
                                  f"outside 0..{world_size - 1}; pass this process's rank.")
        if world_size > 1 and barrier is None:
            raise CheckpointError(f"CheckpointSet {os.fspath(directory)!r}: {world_size} ranks "
                                  "need a barrier to agree that every file is written; pass "
                                  "barrier=StoreBarrier(store, world_size).")
        self.directory = Path(directory)
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self.barrier = barrier

    # --- paths ---------------------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        _check_int("step", step, 0)
        return self.directory / step_dir_name(step)

    def rank_path(self, step: int, rank: int | None = None) -> Path:
        return self.step_dir(step) / rank_file_name(self.rank if rank is None else rank)

    def steps(self) -> list[int]:
        """Every step with a directory here, complete or not, ascending."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise CheckpointError(f"Cannot list checkpoint directory {str(self.directory)!r}: "
                                  f"{error.strerror}; check that it is readable.") from error
        found = (_STEP_DIR.fullmatch(n) for n in names)
        steps = (int(m.group(1)) for m in found if m)
        return sorted(s for s in steps if (self.directory / step_dir_name(s)).is_dir())

    # --- saving --------------------------------------------------------------------------
    def write_rank(self, step: int, blob_names: Iterable[Any], workspace: Any = None) -> Path:
        """Write this rank's blobs for ``step`` atomically; returns the file.

        Raises:
            CheckpointError: a blob is missing or not a tensor.
            CheckpointWriteError: the directory is not writable, the disk is full, ...; the
                previous checkpoints are untouched.
        """
        data = encode_checkpoint(blob_names, api.resolve(workspace))
        path = self.rank_path(step)
        if self.rank == 0:
            self._drop_manifest(step)  # a stale manifest must never vouch for new files
        try:
            write_atomic(path, data)
        except CheckpointWriteError:
            _remove_if_empty(path.parent)
            raise
        return path

    def commit(self, step: int) -> None:
        """Make ``step`` complete once every rank has written its file: rank 0 writes the
        manifest and prunes old checkpoints.  Call on every rank after :meth:`write_rank`.

        Raises:
            CheckpointError: a rank's file is missing or unreadable (rank 0).
            CheckpointWriteError: the manifest cannot be written (rank 0); ``step`` stays
                incomplete and the previous checkpoint remains the newest complete one.
        """
        self._barrier(f"{step_dir_name(step)}/written")
        if self.rank == 0:
            self._write_manifest(step)
            self.prune(step)
        self._barrier(f"{step_dir_name(step)}/committed")

    def save(self, step: int, blob_names: Iterable[Any], workspace: Any = None) -> Path:
        """:meth:`write_rank`, then :meth:`commit`; returns this rank's file."""
        path = self.write_rank(step, blob_names, workspace)
        self.commit(step)
        return path

    def _barrier(self, name: str) -> None:
        if self.barrier is not None:
            self.barrier(name)

    def _write_manifest(self, step: int) -> None:
        files = []
        for rank in range(self.world_size):
            path = self.rank_path(step, rank)
            try:
                data = path.read_bytes()
            except OSError as error:
                raise CheckpointError(
                    f"Checkpoint step {step}: cannot read rank {rank}'s file {str(path)!r} "
                    f"({error.strerror}); every rank must write to the same directory (a "
                    "shared file system).") from error
            files.append(asdict(_describe(path, data, rank)))
        manifest = {"format": SET_FORMAT, "version": SET_VERSION, "step": step,
                    "world_size": self.world_size, "files": files}
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        write_atomic(self.step_dir(step) / MANIFEST_FILE, text, "checkpoint manifest")

    def _drop_manifest(self, step: int) -> None:
        manifest = self.step_dir(step) / MANIFEST_FILE
        try:
            manifest.unlink()
        except FileNotFoundError:
            return
        except OSError as error:
            raise CheckpointWriteError(f"Cannot replace checkpoint manifest {str(manifest)!r}: "
                                       f"{error.strerror}; make the directory writable.") \
                from error
        fsync_dir(manifest.parent)

    # --- finding and loading ---------------------------------------------------------------
    def validate(self, step: int) -> list[RankFile]:
        """The files of complete checkpoint ``step``.

        Raises:
            CheckpointError: no manifest (the save did not finish), an unreadable or foreign
                manifest, another world size, or a file missing, truncated or changed.
        """
        return self._validated(step)[0]

    def latest(self) -> int | None:
        """The newest complete step (every file matches its manifest), or None.  Newer
        incomplete or damaged steps are skipped with a logged warning."""
        newest = self._newest()
        return None if newest is None else newest[0]

    def load(self, step: int | None = None, expected: Iterable[Any] | None = None,
             workspace: Any = None) -> int | None:
        """Load this rank's blobs of ``step`` (default: :meth:`latest`) into the workspace;
        returns the step, or None when there is no complete checkpoint.  ``expected`` as in
        ``load_checkpoint``; nothing is loaded on an error."""
        found = self._newest() if step is None else (step, self._validated(step)[1])
        if found is None:
            return None
        step, data = found
        where = str(self.rank_path(step))
        apply_checkpoint(decode_checkpoint(data, where), where, expected, workspace)
        return step

    def _newest(self) -> tuple[int, bytes] | None:
        """The newest complete step and this rank's verified bytes of it."""
        for step in reversed(self.steps()):
            try:
                return step, self._validated(step)[1]
            except CheckpointError as error:
                logger.warning("Skipping checkpoint step %d in %s: %s", step, self.directory,
                               error)
        return None

    def _validated(self, step: int) -> tuple[list[RankFile], bytes]:
        """Every rank's file checked against the manifest (so every rank picks the same
        step); the entries and this rank's bytes."""
        where = self.step_dir(step) / MANIFEST_FILE
        entries = _parse_manifest(where, _read_limited(where), step, self.world_size)
        mine = b""
        for entry in entries:
            data = self._verified_bytes(step, entry)
            mine = data if entry.rank == self.rank else mine
        return entries, mine

    def _verified_bytes(self, step: int, entry: RankFile) -> bytes:
        path = self.step_dir(step) / entry.name
        try:
            size = path.stat().st_size
            if size != entry.size:
                raise CheckpointError(f"{path}: {size} bytes, the manifest says {entry.size}; "
                                      "the file is truncated or was replaced.")
            data = path.read_bytes()
        except OSError as error:
            raise CheckpointError(f"{path}: cannot read rank {entry.rank}'s checkpoint file "
                                  f"({error.strerror}).") from error
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CheckpointError(f"{path}: the content does not match the manifest's sha256; "
                                  "the file is corrupt.")
        return data

    # --- pruning ---------------------------------------------------------------------------
    def prune(self, newest: int | None = None) -> list[int]:
        """Remove every step older than the ``keep`` newest complete ones up to ``newest``
        (default: all), complete or not; returns the removed steps.  Failures to delete
        are logged, not raised: a leftover old checkpoint never stops training."""
        if self.keep == 0:
            return []
        steps = [s for s in self.steps() if newest is None or s <= newest]
        complete = [s for s in steps if (self.step_dir(s) / MANIFEST_FILE).is_file()]
        if len(complete) <= self.keep:
            return []
        oldest_kept = complete[-self.keep]
        removed = [s for s in steps if s < oldest_kept]
        for step in removed:
            _remove_step(self.step_dir(step))
        return removed


def _check_int(what: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"CheckpointSet: {what} must be an int >= {minimum}, got "
                              f"{value!r}.")


def _read_limited(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no manifest; the save of this step did not finish "
                              "(a rank crashed or is still writing).") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read the manifest ({error.strerror}).") \
            from error
    if len(data) > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{path}: the manifest is larger than {MAX_MANIFEST_BYTES} "
                              "bytes; it is not a dpgraph checkpoint manifest.")
    return data


def _parse_manifest(path: Path, data: bytes, step: int, world_size: int) -> list[RankFile]:
    try:
        manifest = json.loads(data.decode("utf-8"))
        if manifest["format"] != SET_FORMAT or manifest["version"] != SET_VERSION:
            raise ValueError(f"format {manifest['format']!r} version {manifest['version']!r}")
        entries = [RankFile(int(f["rank"]), str(f["name"]), int(f["size"]), str(f["sha256"]))
                   for f in manifest["files"]]
        saved_step, saved_size = int(manifest["step"]), int(manifest["world_size"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path}: not a valid {SET_FORMAT} manifest version "
                              f"{SET_VERSION} ({error}); the file is corrupt.") from None
    if saved_step != step:
        raise CheckpointError(f"{path}: the manifest is for step {saved_step}, not {step}; "
                              "the directory was renamed or copied wrongly.")
    if saved_size != world_size:
        raise CheckpointError(f"{path}: written by {saved_size} ranks, this job has "
                              f"{world_size}; resume with the same number of ranks.")
    if [(e.rank, e.name) for e in entries] != \
            [(r, rank_file_name(r)) for r in range(world_size)]:
        raise CheckpointError(f"{path}: the manifest does not list one file per rank "
                              f"0..{world_size - 1}; the file is corrupt.")
    return entries


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass


def _remove_step(directory: Path) -> None:
    """The manifest first, so a step half-removed by a crash is incomplete, not damaged."""
    try:
        (directory / MANIFEST_FILE).unlink(missing_ok=True)
        fsync_dir(directory)
        shutil.rmtree(directory)
    except OSError as error:
        logger.warning("Could not remove old checkpoint %s: %s", directory, error)
