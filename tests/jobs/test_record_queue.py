"""RecordQueue (jobs/record_queue.py, facade record_queue): records read from a dataset by
concurrent producers (with a process step) come out of the queue whole, each exactly once."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.dataset import Dataset
from dpgraph.errors import ModelConfigError
from dpgraph.record_queue import RecordQueue
from dpgraph.schema import FeedRecord, NewRecord, Scalar, Struct, from_blob_list


def _source(values: np.ndarray, labels: np.ndarray):
    schema = Struct(("x", Scalar(np.float32)), ("label", Scalar(np.int32)))
    contents = from_blob_list(schema, [values, labels])
    ds = Dataset(schema)
    net = core.Net("init")
    ds.init_empty(net)
    blobs = NewRecord(net, contents)
    FeedRecord(blobs, contents)
    ds.writer(init_net=net).write_record(net, blobs)
    return ds, contents, net


def test_record_queue_moves_every_record_once() -> None:
    values = np.arange(1, 9, dtype=np.float32)
    labels = np.arange(8, dtype=np.int32)
    ds, contents, net = _source(values, labels)
    reader = ds.reader(init_net=net, batch_size=1)
    sink = Dataset(contents, name="sink")
    sink.init_empty(init_net=net)
    sink_writer = sink.writer(init_net=net)
    workspace.RunNetOnce(net)

    queue = RecordQueue(contents, name="rq", capacity=2, num_threads=3)
    assert queue.schema.field_names() == ["x", "label"]

    def double_x(proc_net, fields):
        doubled = proc_net.Scale(fields.x(), scale=2.0)
        return from_blob_list(fields, [doubled, proc_net.Copy(fields.label())])

    q_reader, q_step, q_exit, schema = queue.build(reader, double_x)
    assert schema is queue.schema and q_reader is queue.reader
    consumers = []
    for i in range(2):
        read_net, write_net = core.Net(f"consume_{i}"), core.Net(f"write_{i}")
        should_stop, fields = q_reader.read_record(read_net)
        sink_writer.write(write_net, fields.field_blobs())
        consumers.append(core.execution_step(
            f"consumer_{i}", [core.execution_step(f"c{i}", read_net),
                              core.execution_step(f"w{i}", write_net)],
            should_stop_blob=should_stop))
    producer = core.execution_step("producer", [q_step, q_exit])
    work = core.execution_step(
        "work", [producer, core.execution_step("consumers", consumers,
                                               concurrent_substeps=True)],
        concurrent_substeps=True)
    plan = core.Plan("rq_test")
    plan.AddStep(work)
    workspace.RunPlan(plan)
    got_x, got_label = workspace.FetchBlobs(sink.get_blobs())
    order = np.argsort(got_label)
    np.testing.assert_array_equal(got_label[order], labels)
    np.testing.assert_array_equal(got_x[order], 2 * values)


def test_record_queue_from_column_names_and_bad_fields() -> None:
    queue = RecordQueue(["a", "b"], name="cols")
    assert queue.schema.field_names() == ["a", "b"]
    assert workspace.HasBlob(str(queue.blobs_queue))
    with pytest.raises(ModelConfigError, match="Struct or a list"):
        RecordQueue("a")
