"""Running a parallelized model: init/run nets, checkpoints, predictor export."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _parallel_helpers import build, train

from dpgraph import core, data_parallel_model, workspace
from dpgraph.proto import caffe2_pb2


def test_run_net_runs_each_net_and_pairs() -> None:
    model, _ = train(range(2), iters=0)
    counter = core.Net("counter")
    counter.Iter("cnt", "cnt")
    workspace.FeedBlob("cnt", np.array([0], dtype=np.int64))
    model._data_parallel_model_nets.append((counter, 3))
    data_parallel_model.CreateNet(model, overwrite=True)
    before = workspace.FetchBlob("cpu_0/ITER")[0]
    data_parallel_model.RunNet(model, 2)
    assert workspace.FetchBlob("cpu_0/ITER")[0] == before + 2
    assert workspace.FetchBlob("cnt")[0] == 3


def test_finalize_after_checkpoint_broadcasts_master_blobs() -> None:
    model, _ = train(range(3), iters=1)
    loaded = np.full(workspace.FetchBlob("cpu_0/fc1_w").shape, 7.0, dtype=np.float32)
    workspace.FeedBlob("cpu_0/fc1_w", loaded)
    data_parallel_model.FinalizeAfterCheckpoint(model, cpu_mode=True)
    for d in (1, 2):
        np.testing.assert_array_equal(workspace.FetchBlob(f"cpu_{d}/fc1_w"), loaded)
    ops = model._checkpoint_net.Proto().op
    assert {op.output[0] for op in ops} >= {"cpu_1/fc1_w", "cpu_2/ITER"}
    workspace.FeedBlob("cpu_0/fc2_b", np.ones(3, dtype=np.float32))
    data_parallel_model.FinalizeAfterCheckpoint(model, cpu_mode=True)  # cached net reruns
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_2/fc2_b"), np.ones(3))


def test_finalize_after_checkpoint_with_extra_blobs() -> None:
    model, _ = train(range(2), iters=0)
    workspace.FeedBlob("cpu_0/moment", np.arange(3, dtype=np.float32))
    data_parallel_model.FinalizeAfterCheckpoint(model, blobs=["cpu_0/moment"], cpu_mode=True)
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_1/moment"), np.arange(3))
    assert model._device_grouped_blobs["moment"] == {0: "cpu_0/moment", 1: "cpu_1/moment"}


def test_extract_predictor_net() -> None:
    model, params = train(range(2), iters=1)
    predict, export = data_parallel_model.ExtractPredictorNet(
        model, ["data"], ["fc2"], core.DeviceOption(caffe2_pb2.CPU, 0))
    proto = predict.Proto()
    assert [op.type for op in proto.op] == ["FC", "Relu", "FC"]
    assert proto.op[0].input[0] == "data" and proto.op[-1].output[0] == "fc2"
    assert set(map(str, export)) == {"cpu_0/fc1_w", "cpu_0/fc1_b", "cpu_0/fc2_w",
                                     "cpu_0/fc2_b"}
    x = np.random.RandomState(3).randn(5, 6).astype(np.float32)
    workspace.FeedBlob("data", x)
    workspace.RunNetOnce(predict)
    h = np.maximum(x @ params["fc1_w"].T + params["fc1_b"], 0)
    np.testing.assert_allclose(workspace.FetchBlob("fc2"), h @ params["fc2_w"].T
                               + params["fc2_b"], rtol=1e-5, atol=1e-6)


def test_synchronize_is_deprecated_no_op_on_one_host() -> None:
    model = build(range(2))
    n_ops = len(model.net.Proto().op)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data_parallel_model.Synchronize(model)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    data_parallel_model.AddDistributedBlobSync(model, ["cpu_0/fc1_w"])
    assert len(model.net.Proto().op) == n_ops


def test_helpers_need_a_parallelized_model() -> None:
    from dpgraph import model_helper

    with pytest.raises(AssertionError, match="Parallelize"):
        data_parallel_model.GetCheckpointParams(model_helper.ModelHelper(name="plain"))


def test_collectives_concurrency_control() -> None:
    init = core.Net("cc_init")
    rendezvous = {"kv_handler": "store", "shard_id": 1, "num_shards": 2, "engine": "GLOO",
                  "transport": "tcp"}
    control = data_parallel_model.CollectivesConcurrencyControl("allreduce", 2, init,
                                                                rendezvous)
    got = [control.get_control_and_context(f"out_{i}") for i in range(4)]
    assert got == [("allreduce_0_cw", None), ("allreduce_1_cw", None),
                   ("allreduce_0_cw", "out_0"), ("allreduce_1_cw", "out_1")]
    ops = init.Proto().op
    assert [op.type for op in ops] == ["CreateCommonWorld", "CloneCommonWorld"]
    args = {a.name: a for a in ops[0].arg}
    assert (args["size"].i, args["rank"].i, args["timeout_ms"].i) == (2, 1, 30000)
    assert args["transport"].s == b"tcp" and ops[0].engine == "GLOO"
    assert list(ops[1].input) == ["allreduce_0_cw"]
