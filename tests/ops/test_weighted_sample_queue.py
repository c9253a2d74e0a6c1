"""WeightedSampleDequeueBlobs (ops/queue.py): queue choice by weight, the table index
output, the closed-queue status and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import OperatorError, ShapeError
from dpgraph.ops.gradient_builder import make_op
from dpgraph.ops.queue import BlobsQueue
from dpgraph.ops.testing import run_op


def queues(*records_per_queue: int) -> list[BlobsQueue]:
    out = []
    for q, count in enumerate(records_per_queue):
        queue = BlobsQueue(f"q{q}", capacity=max(count, 1), num_blobs=2)
        for r in range(count):
            queue.put((np.array([q], np.int64), np.array([r], np.float32)))
        out.append(queue)
    return out


def sample_op(num_queues: int, **args):
    names = [f"q{i}" for i in range(num_queues)]
    return make_op("WeightedSampleDequeueBlobs", names, ["a", "b", "status"], **args)


def test_zero_weight_queue_is_never_read_and_table_index_is_written() -> None:
    qs = queues(3, 3)
    op = sample_op(2, weights=[0.0, 1.0], table_idx_blob=1)
    for step in range(3):
        a, b, status = run_op(op, qs, seed=step)
        assert a.tolist() == [1] and b.dtype == np.int32 and b.tolist() == [1]
        assert not bool(status)
    assert len(qs[0]) == 3 and len(qs[1]) == 0


def test_weights_pick_queues_in_proportion() -> None:
    qs = queues(400, 400)
    op = sample_op(2, weights=[1.0, 3.0])
    picks = [int(run_op(op, qs, seed=s)[0][0]) for s in range(200)]
    assert 0.6 < np.mean(picks) < 0.9  # queue 1 has probability 0.75


def test_closed_drained_queue_sets_status() -> None:
    qs = queues(0)
    qs[0].close()
    a, b, status = run_op(sample_op(1), qs)
    assert bool(status) and status.dtype == np.bool_


def test_bad_arguments_are_rejected() -> None:
    qs = queues(1, 1)
    with pytest.raises((ShapeError, OperatorError), match="weights has 1 entries"):
        run_op(sample_op(2, weights=[1.0]), qs)
    with pytest.raises((ShapeError, OperatorError), match="must be positive"):
        run_op(sample_op(2, weights=[0.0, 0.0]), qs)
    with pytest.raises((ShapeError, OperatorError), match="table_idx_blob 2"):
        run_op(sample_op(2, table_idx_blob=2), qs)
    three = make_op("WeightedSampleDequeueBlobs", ["q0"], ["a", "b", "c", "s"])
    with pytest.raises((ShapeError, OperatorError), match="3 data outputs"):
        run_op(three, qs[:1])
