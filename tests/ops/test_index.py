"""Index ops (IntIndexCreate ... IndexSize): Caffe2's index_ops semantics."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import OperatorError
from dpgraph.ir.registry import OPERATORS


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _run(op_type, inputs, outputs, **kwargs):
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **kwargs))


@pytest.mark.parametrize("create,keys,dtype", [
    ("IntIndexCreate", [7, 3, 7, 9], np.int32),
    ("LongIndexCreate", [70, 30, 70, 90], np.int64),
    ("StringIndexCreate", [b"a", b"b", b"a", b"c"], object)])
def test_get_freeze_store_load_size(create, keys, dtype):
    _run(create, [], ["idx"], max_elements=10)
    workspace.FeedBlob("keys", np.array(keys, dtype=dtype))
    _run("IndexGet", ["idx", "keys"], ["ids"])
    np.testing.assert_array_equal(workspace.FetchBlob("ids"), [1, 2, 1, 3])
    assert workspace.FetchBlob("ids").dtype == np.int64
    _run("IndexSize", ["idx"], ["size"])
    assert int(workspace.FetchBlob("size")) == 4  # the unknown id 0 counts
    _run("IndexFreeze", ["idx"], ["idx"])
    fresh = {np.int32: [5], np.int64: [50], object: [b"z"]}[dtype]
    workspace.FeedBlob("new", np.array(fresh + keys[:1], dtype=dtype))
    _run("IndexGet", ["idx", "new"], ["new_ids"])
    np.testing.assert_array_equal(workspace.FetchBlob("new_ids"), [0, 1])
    _run("IndexStore", ["idx"], ["stored"])
    assert list(workspace.FetchBlob("stored")) == [keys[0], keys[1], keys[3]]
    _run(create, [], ["copy"])
    _run("IndexLoad", ["copy", "stored"], ["copy"])
    _run("IndexGet", ["copy", "keys"], ["copy_ids"])
    np.testing.assert_array_equal(workspace.FetchBlob("copy_ids"), [1, 2, 1, 3])


def test_load_skip_first_entry_and_repeats():
    _run("IntIndexCreate", [], ["idx"])
    workspace.FeedBlob("items", np.array([0, 11, 12], np.int32))
    _run("IndexLoad", ["idx", "items"], ["idx"], skip_first_entry=1)
    workspace.FeedBlob("q", np.array([12, 11], np.int32))
    _run("IndexGet", ["idx", "q"], ["ids"])
    np.testing.assert_array_equal(workspace.FetchBlob("ids"), [2, 1])
    workspace.FeedBlob("dup", np.array([5, 5], np.int32))
    with pytest.raises(OperatorError, match="Repeated elements"):
        _run("IndexLoad", ["idx", "dup"], ["idx"])


def test_max_elements_and_bad_handle():
    _run("IntIndexCreate", [], ["idx"], max_elements=3)
    workspace.FeedBlob("keys", np.array([1, 2, 3], np.int32))
    with pytest.raises(OperatorError, match="max size"):
        _run("IndexGet", ["idx", "keys"], ["ids"])
    workspace.FeedBlob("notidx", np.zeros(2, np.float32))
    with pytest.raises(OperatorError, match="not an index"):
        _run("IndexSize", ["notidx"], ["s"])


def test_freeze_and_load_enforce_in_place():
    for op_type in ("IndexFreeze", "IndexLoad"):
        schema = OPERATORS.get(op_type)
        assert schema.extra["enforce_inplace"] == ((0, 0),)
        assert schema.side_effects


@pytest.mark.parametrize("create,keys,dtype", [
    ("IntIndexCreate", [7, 3, 9], np.int32),
    ("LongIndexCreate", [70, 30, 90], np.int64),
    ("StringIndexCreate", [b"a", b"b", b"c"], object)])
@pytest.mark.parametrize("frozen", [False, True])
def test_save_load_round_trip_keeps_ids_limit_and_frozen(tmp_path, create, keys, dtype,
                                                          frozen):
    _run(create, [], ["idx"], max_elements=5)
    workspace.FeedBlob("keys", np.array(keys, dtype=dtype))
    _run("IndexLoad", ["idx", "keys"], ["idx"])
    if frozen:
        _run("IndexFreeze", ["idx"], ["idx"])
    path = str(tmp_path / "index.minidb")
    _run("Save", ["idx"], [], absolute_path=1, db_type="minidb", db=path)
    workspace.FeedBlob("idx", np.array([]))
    _run("Load", [], ["idx"], absolute_path=1, db_type="minidb", db=path)
    query = {np.int32: [9, 7, 1], np.int64: [90, 70, 10], object: [b"c", b"a", b"q"]}[dtype]
    workspace.FeedBlob("query", np.array(query, dtype=dtype))
    _run("IndexGet", ["idx", "query"], ["ids"])
    # a frozen index maps the unseen key to 0; a growing one hands out id 4
    np.testing.assert_array_equal(workspace.FetchBlob("ids"), [3, 1, 0 if frozen else 4])
    _run("IndexStore", ["idx"], ["stored"])
    assert workspace.FetchBlob("stored").dtype == np.dtype(dtype)
    if not frozen:  # max_elements=5 survived: ids 1..4 are used, a fifth key is refused
        workspace.FeedBlob("extra", np.array({np.int32: [11], np.int64: [11],
                                              object: [b"r"]}[dtype], dtype=dtype))
        with pytest.raises(OperatorError, match="max_elements"):
            _run("IndexGet", ["idx", "extra"], ["ids2"])
