"""workspace.C: workspace objects, DBs, op schemas, module functions;
workspace.FillRandomNetworkInputs."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import NotSupportedError, WorkspaceError

C = workspace.C


def test_workspace_objects_blobs_nets_and_children() -> None:
    ws = C.Workspace()
    ws.create_blob("c_x").feed(np.arange(3, dtype=np.float32))
    assert "c_x" in ws.blobs and list(ws.blobs) == ["c_x"]
    np.testing.assert_array_equal(ws.blobs["c_x"].fetch(), [0, 1, 2])
    assert not workspace.HasBlob("c_x")  # not the current workspace
    net = core.Net("c_net")
    net.Scale("c_x", "c_y", scale=2.0)
    ws.create_net(net).run()
    np.testing.assert_array_equal(ws.fetch_blob("c_y"), [0, 2, 4])
    assert net.Name() in ws.nets
    child = C.Workspace(ws)
    child.run(core.Net("c_child").Proto())
    child_net = core.Net("c_child2")
    child_net.Scale("c_x", "c_z", scale=3.0)
    child_net.Scale("c_x", "c_x", scale=10.0)
    child.run(child_net)
    assert "c_z" in child.blobs and "c_z" not in ws.blobs  # new blobs stay local
    np.testing.assert_array_equal(ws.fetch_blob("c_x"), [0, 10, 20])  # shared ones
    with pytest.raises(KeyError):
        ws.blobs["missing"]
    unfed = core.Net("c_unfed")
    unfed.Mul(["c_a", "c_b"], "c_c")
    with pytest.raises(RuntimeError, match="non-existing input blob: c_a"):
        ws.create_net(unfed)


def test_current_workspace_object_and_guard() -> None:
    workspace.FeedBlob("c_cur", np.ones(1))
    current = C.Workspace.current
    assert current is C.Workspace.current
    assert "c_cur" in current.blobs
    other = C.Workspace()
    with workspace.WorkspaceGuard(other):
        workspace.FeedBlob("c_inside", np.ones(1))
    assert "c_inside" in other.blobs and not workspace.HasBlob("c_inside")
    assert C.Workspace.current is current


def test_create_db_transactions_and_cursors(tmp_path) -> None:
    path = str(tmp_path / "c.minidb")
    db = C.create_db("minidb", path, C.Mode.new)
    txn = db.new_transaction()
    for i in range(3):
        txn.put(f"key{i}", f"value{i}".encode())
    txn.commit()
    del txn
    db.close()
    db = C.create_db("minidb", path, C.Mode.read)
    cursor = db.new_cursor()
    cursor.seek_to_first()
    seen = []
    while cursor.valid():
        seen.append((cursor.key(), cursor.value()))
        cursor.next()
    assert seen == [(f"key{i}", f"value{i}".encode()) for i in range(3)] or \
        seen == [(f"key{i}".encode(), f"value{i}".encode()) for i in range(3)]
    db.close()


def test_op_schema_facts() -> None:
    fc = C.OpSchema.get("FC")
    assert (fc.min_input, fc.max_input, fc.min_output, fc.max_output) == (3, 3, 1, 1)
    assert fc.CalculateOutput(3) == 1 and fc.num_inputs_allowed(3)
    assert not fc.num_inputs_allowed(2) and fc.num_inputs_outputs_allowed(3, 1)
    assert C.OpSchema.get("Sum").max_input == C.OpSchema.inf
    assert C.OpSchema.get("NoSuchOp") is None
    with pytest.raises(NotSupportedError, match="C\\+\\+ internal"):
        _ = C.memonger_compute_blob_recycling_for_dag
    assert not hasattr(C, "no_such_name")


def test_module_functions_follow_the_current_workspace() -> None:
    C.feed_blob("c_mod", np.array([1.0]))
    assert C.has_blob("c_mod") and "c_mod" in C.blobs()
    assert C.fetch_blob("c_mod").tolist() == [1.0]
    assert C.current_workspace() == workspace.CurrentWorkspace()
    assert "FC" in C.registered_operators()


def test_fill_random_network_inputs() -> None:
    net = core.Net("c_fill")
    net.Concat(["X0", "X1", "X2"], ["concat_out", "split_info"])
    net.Relu("concat_out", "r")
    workspace.FillRandomNetworkInputs(net, [[(30, 20)] * 3], [["float"] * 3])
    x0 = workspace.FetchBlob("X0")
    assert x0.shape == (30, 20) and x0.dtype == np.float32
    assert 0.0 <= x0.min() and x0.max() < 1.0
    with pytest.raises(RuntimeError):
        workspace.FillRandomNetworkInputs(net, [[(30, 20)]], [["float"]])
    with pytest.raises(WorkspaceError, match="unknown type"):
        workspace.FillRandomNetworkInputs(net, [[(2,)] * 3], [["complex"] * 3])
    workspace.FillRandomNetworkInputs(net, [[(4,)] * 3], [["bool", "int", "long"]])
    assert set(np.unique(workspace.FetchBlob("X0"))) <= {0, 1}
    assert workspace.FetchBlob("X2").dtype == np.int64


def test_blob_tensor_access_serde_and_net_creation() -> None:
    ws = C.Workspace()
    assert ws.blobs == {} and ws.nets == {}
    ws.create_blob("c_t").feed(np.array([1.1, 1.2, 1.3]))
    tensor = ws.blobs["c_t"].tensor()
    tensor.data[0] = 3.3
    np.testing.assert_array_equal(ws.blobs["c_t"].fetch(), [3.3, 1.2, 1.3])
    tensor.init([2, 3], core.DataType.INT32)
    tensor.data[1, 1] = 100
    assert ws.blobs["c_t"].fetch().dtype == np.int32 and ws.fetch_blob("c_t")[1, 1] == 100
    with pytest.raises(RuntimeError):
        tensor.init([3, 4], core.DataType.STRING)
    value = np.array([1.1, 10.2])
    tensor.feed(value)
    value[0] = 5.2
    assert tensor.fetch()[0] == 1.1
    copy = ws.create_blob("c_t_serde")
    copy.deserialize(ws.blobs["c_t"].serialize("c_t"))
    np.testing.assert_array_equal(copy.fetch(), [1.1, 10.2])
    net = core.Net("c_create")
    net.ConstantFill([], "c_filled", shape=[2], value=1.0)
    ws.create_net(net)
    assert "c_filled" in ws.blobs  # created with the net, as Caffe2's operators do
    with pytest.raises(RuntimeError):
        ws.create_net(net)
    ws.create_net(net, overwrite=True)
    ws.nets[net.Name()].run()
    assert ws.blobs["c_filled"].fetch().tolist() == [1.0, 1.0]
    with pytest.raises(TypeError):
        ws.create_net("...")


def _write_int_records(path: str, count: int = 8) -> None:
    import lmdb

    from dpgraph.proto import caffe2_pb2

    env = lmdb.open(path, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for j in range(count):
            record = caffe2_pb2.TensorProtos()
            record.protos.add(data_type=caffe2_pb2.TensorProto.INT32, int32_data=[j])
            txn.put(str(j).encode(), record.SerializeToString())
    env.close()


def _prefetching_net(ws: C.Workspace, path: str) -> C.Net:
    """A net of ``ws`` whose TensorProtosDBInput has run once (a batch is read ahead)."""
    init = core.Net("init")
    init.CreateDB([], "reader", db=path, db_type="lmdb")
    ws.run(init)
    net = core.Net("read")
    net.TensorProtosDBInput(["reader"], ["label"], batch_size=2)
    created = ws.create_net(net)
    created.run()
    return created


def _prefetch_threads() -> int:
    import threading

    return sum(t.name == "dpgraph-prefetch" for t in threading.enumerate())


def test_a_dropped_workspace_object_destroys_its_nets(tmp_path) -> None:
    """As destroying a Caffe2 workspace destroys its ops: a prefetching input op's thread
    ends and its reader closes once nothing holds the Workspace (a Net of it does)."""
    import gc
    import weakref

    from dpgraph.runtime import finalizers

    path = str(tmp_path / "db")
    _write_int_records(path)
    before = _prefetch_threads()
    ws = C.Workspace()
    runtime = weakref.ref(ws._ws)
    net = _prefetching_net(ws, path)
    del ws
    gc.collect()
    assert net.run() and _prefetch_threads() == before + 1  # the Net keeps it alive
    del net
    gc.collect()
    assert finalizers.flush(timeout=30)  # a drop inside a collection closes on the reaper
    assert runtime() is None and _prefetch_threads() == before


def test_a_workspace_collected_on_its_own_prefetch_thread_closes_without_deadlock(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collection that frees a Workspace object can run on the prefetch thread of one of
    its ops, mid-batch.  Closing the op there would wait for that very thread's batch; the
    close runs on the reaper thread instead, once the batch is read."""
    import gc
    import threading
    import time

    from dpgraph.data.prefetch import Prefetcher
    from dpgraph.runtime import finalizers

    path = str(tmp_path / "db")
    _write_int_records(path)
    before = _prefetch_threads()
    release = threading.Event()
    serve_one = Prefetcher._serve_one

    def collect_first(self: Prefetcher, request: object) -> bool:
        if request is not None:
            release.wait(30)
            gc.collect()  # frees the Workspace object, here on the prefetch thread
        return serve_one(self, request)

    monkeypatch.setattr(Prefetcher, "_serve_one", collect_first)
    ws = C.Workspace()
    ws.cycle = ws  # only a collection frees it
    _prefetching_net(ws, path)  # its read-ahead now waits for ``release``
    del ws
    release.set()
    deadline = time.monotonic() + 30
    while _prefetch_threads() != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert finalizers.flush(timeout=30)
    assert _prefetch_threads() == before, "the prefetch thread did not end"
