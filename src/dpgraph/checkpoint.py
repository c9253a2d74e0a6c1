"""Checkpoints: save and load workspace blobs, and resume a data-parallel model.

One file (:func:`save_checkpoint`, :func:`load_checkpoint`; the format is described in
:mod:`dpgraph.runtime.checkpoint_file`) or a set of them for a multi-rank job that restarts
(:class:`CheckpointSet`: one file per rank and step, a manifest written last, newest complete
step found on resume, old steps pruned; :mod:`dpgraph.runtime.checkpoint_set`).

Resuming a ``Parallelize``'d model::

    save_model_checkpoint(model, "ckpt.pb")        # the blobs GetCheckpointParams names
    ...                                            # fresh process: build, RunInitNet
    load_model_checkpoint(model, "ckpt.pb")        # load + FinalizeAfterCheckpoint

    checkpoints = CheckpointSet(directory, rank, world_size, keep=2,
                                barrier=StoreBarrier(store, world_size))
    start = resume_model_checkpoint_set(model, checkpoints) or 0   # after RunInitNet
    ...
    save_model_checkpoint_set(model, checkpoints, step)            # on every rank
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dpgraph.jobs.checkpoint_manager import (  # noqa: F401  (Caffe2's checkpoint module API)
    CheckpointManager,
    JobRunner,
    MultiNodeCheckpointManager,
    UploadTaskGroupBuilder,
    db_name,
    epoch_limiter,
    get_ckpt_filename,
)
from dpgraph.jobs.job import Job  # noqa: F401  (Caffe2's checkpoint.Job)
from dpgraph.runtime.checkpoint_file import (  # noqa: F401  (the one-file API)
    FORMAT_VERSION,
    MANIFEST_NAME,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    write_atomic,
)
from dpgraph.runtime.checkpoint_set import (  # noqa: F401  (checkpoint sets)
    CheckpointSet,
    StoreBarrier,
)


def checkpoint_blob_names(model: Any) -> list[str]:
    """The blobs ``data_parallel_model.GetCheckpointParams`` names, sorted."""
    from dpgraph.parallel.lifecycle import GetCheckpointParams

    return sorted(str(b) for b in GetCheckpointParams(model))


def save_model_checkpoint(model: Any, path: str | os.PathLike[str],
                          workspace: Any = None) -> list[str]:
    """Save a Parallelize'd model's checkpoint params (master device + iteration
    counters); returns the saved names."""
    names = checkpoint_blob_names(model)
    save_checkpoint(path, names, workspace)
    return names


def load_model_checkpoint(model: Any, path: str | os.PathLike[str]) -> list[str]:
    """Load the master device's blobs, then ``FinalizeAfterCheckpoint`` copies them to
    every device.  Run the model's init nets first (``RunInitNet``)."""
    from dpgraph.parallel.lifecycle import FinalizeAfterCheckpoint

    names = load_checkpoint(path, expected=checkpoint_blob_names(model))
    FinalizeAfterCheckpoint(model)
    return names


def save_model_checkpoint_set(model: Any, checkpoints: CheckpointSet, step: int) -> Path:
    """Save a Parallelize'd model's checkpoint params as ``step`` of ``checkpoints`` (a
    :class:`CheckpointSet`); call on every rank.  Returns this rank's file."""
    return checkpoints.save(step, checkpoint_blob_names(model))


def resume_model_checkpoint_set(model: Any, checkpoints: CheckpointSet) -> int | None:
    """Load the newest complete checkpoint of ``checkpoints`` into a Parallelize'd model
    (after ``RunInitNet``) and copy it to every device; returns its step, or None when
    there is none (the model is left as initialized)."""
    from dpgraph.parallel.lifecycle import FinalizeAfterCheckpoint

    step = checkpoints.load(expected=checkpoint_blob_names(model))
    if step is not None:
        FinalizeAfterCheckpoint(model)
    return step
