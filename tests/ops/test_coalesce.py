"""AsyncNetBarrier (pass-through, no gradient) and UnsafeCoalesce (outputs alias one buffer)."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.errors import GradientError
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import run_op


def test_async_net_barrier_passes_inputs_through() -> None:
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((0, 4), np.float32)]
    outs = run_op(CreateOperator("AsyncNetBarrier", ["a", "b"], ["a", "b"]), xs)
    assert all(o is x for o, x in zip(outs, xs))
    outs = run_op(CreateOperator("AsyncNetBarrier", ["a"], ["c"]), xs[:1])
    np.testing.assert_array_equal(outs[0], xs[0])
    with pytest.raises(Exception, match="as many outputs"):
        run_op(CreateOperator("AsyncNetBarrier", ["a", "b"], ["a"]), xs)
    with pytest.raises(GradientError):
        build_gradient(CreateOperator("AsyncNetBarrier", ["a"], ["a"]), ["a_grad"])
    assert build_gradient(CreateOperator("AsyncNetBarrier", ["a"], ["a"]), [None])[0] == []


def test_unsafe_coalesce_outputs_view_the_coalesced_buffer() -> None:
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7.0], np.float32),
          np.zeros((0, 2), np.float32)]
    op = CreateOperator("UnsafeCoalesce", ["a", "b", "c"], ["a", "b", "c", "buf"])
    *views, buf = run_op(op, xs)
    np.testing.assert_array_equal(buf, [0, 1, 2, 3, 4, 5, 7])
    assert [v.shape for v in views] == [x.shape for x in xs]
    buf[:] = -2.0  # the outputs alias the coalesced blob
    assert (views[0] == -2).all() and views[1].tolist() == [-2.0]
    with pytest.raises(Exception, match="float32"):
        run_op(op, [xs[0], np.array([1], np.int32), xs[2]])
    with pytest.raises(Exception, match="plus the coalesced"):
        run_op(CreateOperator("UnsafeCoalesce", ["a"], ["a"]), xs[:1])


def test_feeding_coalesced_storage_writes_through_to_every_view() -> None:
    """As Caffe2's FeedBlob reuses a tensor's memory: feeding the coalesced blob (or a view)
    an array of its shape and dtype changes every blob sharing it; another shape does not."""
    from dpgraph import core, workspace

    workspace.ResetWorkspace()
    workspace.FeedBlob("x", np.ones((2, 2), np.float32))
    workspace.FeedBlob("y", np.ones(3, np.float32))
    op = core.CreateOperator("UnsafeCoalesce", ["x", "y"], ["x", "y", "shared"])
    workspace.RunOperatorOnce(op)
    workspace.FeedBlob("shared", np.full(7, -2.0, np.float32))
    assert (workspace.FetchBlob("x") == -2).all() and (workspace.FetchBlob("y") == -2).all()
    workspace.FeedBlob("y", np.array([5.0, 6.0, 7.0], np.float32))
    np.testing.assert_array_equal(workspace.FetchBlob("shared")[4:], [5, 6, 7])
    workspace.FeedBlob("shared", np.zeros(8, np.float32))  # another shape: a new tensor
    assert (workspace.FetchBlob("x") == -2).all()
    workspace.FeedBlob("x", np.zeros((2, 2), np.float64))  # another dtype: a new tensor
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [5, 6, 7])
    workspace.FeedBlob("x", np.zeros((2, 2), np.float32))
    workspace.RunOperatorOnce(op)  # coalescing again is fine
    np.testing.assert_array_equal(workspace.FetchBlob("shared"), [0, 0, 0, 0, 5, 6, 7])
    plain = np.ones(2, np.float32)
    workspace.FeedBlob("plain", plain)
    workspace.FeedBlob("plain", np.zeros(2, np.float32))
    assert plain.tolist() == [1, 1]  # ordinary blobs are replaced, never written into
