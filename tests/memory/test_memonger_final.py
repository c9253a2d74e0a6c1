"""The final memonger API on Caffe2's examples (caffe2-jobs-facts §6.2): naming, schema
check, inference passes, Free insertion, estimates, assignment helpers, and share_grad_blobs
on a zoo ResNeXt keeping the loss and a kept gradient exact."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from dpgraph import brew, core, memonger, workspace
from dpgraph.cnn import CNNModelHelper
from dpgraph.errors import MemongerError
from dpgraph.model_helper import ModelHelper
from dpgraph.models import resnet
from dpgraph.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _blobs(proto):
    return {b for op in proto.op for b in list(op.input) + list(op.output)}


def _shared(proto):
    return {b for b in _blobs(proto) if "_shared" in b}


def _fc_chain(namescope="name_x/", n=4):
    m = ModelHelper(name="chain")
    with core.NameScope(namescope.rstrip("/")):
        blob = "data"
        for i in range(n):
            blob = brew.fc(m, blob, f"fc{i}", dim_in=8, dim_out=8)
            blob = brew.relu(m, blob, blob)
        out = brew.fc(m, blob, "out", dim_in=8, dim_out=4)
        loss = m.net.AveragedLoss(m.net.SquaredL2Distance([out, "label"], "sq"), "loss")
    grads = m.AddGradientOperators([loss])
    return m, grads, loss


def test_share_grad_blobs_names_and_namescope_slash():
    m, grads, loss = _fc_chain()
    optim = memonger.share_grad_blobs(m.net, [str(loss)], set(m.param_to_grad.values()),
                                      "name_x",
                                      share_activations=True)
    shared = _shared(optim)
    assert shared and all(b.startswith("name_x/__m") and b.endswith("_shared") for b in shared)
    assert len(_blobs(optim)) < len(_blobs(m.net.Proto()))
    assert memonger.verify_graph_equality(m.net.Proto(), optim)
    assert memonger.verify_inplace_blobs(m.net.Proto(), optim)


def test_activations_are_conv_fc_outputs_without_the_head():
    m, grads, loss = _fc_chain()
    optim = memonger.share_grad_blobs(m.net, [str(loss)], set(m.param_to_grad.values()),
                                      "name_x/",
                                      share_activations=True)
    outputs = {b for op in optim.op for b in op.output}
    assert {"name_x/fc3", "name_x/out"} <= outputs  # the last two activations are kept
    assert not {"name_x/fc1", "name_x/fc2"} & _blobs(optim)  # recycled activations
    grads_only = memonger.share_grad_blobs(m.net, [str(loss)], set(m.param_to_grad.values()),
                                           "name_x/", share_activations=False)
    assert {"name_x/fc1", "name_x/fc2"} <= _blobs(grads_only)


def test_schema_check_refuses_broken_enforced_inplace():
    m = ModelHelper(name="idx")
    m.net.IntIndexCreate([], "A")
    m.net.IndexFreeze("A", "B")
    m.net.IndexSize("B", "C")
    with pytest.raises(RuntimeError, match="in place"):
        memonger.optimize_inference_for_dag(m.net, ["A"], "")


def test_index_freeze_in_place_as_head():
    m = ModelHelper(name="idx")
    m.net.IndexFreeze("A", "A")
    blob = m.net.IndexGet(["A", "keys"], "ids")
    for i in range(4):
        blob = m.net.Cast(blob, f"c{i}", to=core.DataType.FLOAT)
    m.net.Proto().external_input.extend(["A", "keys"])
    m.net.Proto().external_output.append(str(blob))
    optim = memonger.optimize_inference_for_dag(m.net, ["A"], "")
    assert len(_blobs(optim)) < len(_blobs(m.net.Proto()))


def test_inference_for_dag_checks_inputs_and_gradient_ops():
    net = caffe2_pb2.NetDef(name="n", external_input=["z"])
    net.op.append(core.CreateOperator("Relu", "x", "y"))
    with pytest.raises(AssertionError, match="x not in external input"):
        memonger.optimize_inference_for_dag(net, ["z"])
    m, grads, loss = _fc_chain("", 2)
    m.net.Proto().external_input.extend(["data", "label"] + [str(p) for p in m.params])
    with pytest.raises(MemongerError, match="gradient"):
        memonger.optimize_inference_for_dag(m.net, ["data"])


def test_optimize_inference_fast_naming_and_skips():
    m = ModelHelper(name="fast")
    blob = "data"
    for i in range(5):
        blob = m.net.Relu(blob, f"r{i}")
    optim = memonger.optimize_inference_fast(m.net.Proto(), {"data", str(blob)})
    assert _shared(optim) and all(b.startswith("__m") for b in _shared(optim))
    assert len(_blobs(optim)) < len(_blobs(m.net.Proto()))
    again = memonger.optimize_inference_fast(optim, {"data", str(blob)})
    assert again == optim  # already memongered: unchanged
    dag = caffe2_pb2.NetDef()
    dag.CopyFrom(m.net.Proto())
    dag.type = "dag"
    assert memonger.optimize_inference_fast(dag, {"data"}) == dag
    workspace.FeedBlob("data", np.random.RandomState(0).randn(3).astype(np.float32))
    workspace.RunNetOnce(m.net)
    want = workspace.FetchBlob(str(blob))
    workspace.RunNetOnce(optim)
    np.testing.assert_array_equal(workspace.FetchBlob(str(blob)), want)


def test_release_blobs_when_used_caffe2_rules():
    m = ModelHelper(name="free")
    m.net.Copy("data", "x")
    m.net.Relu("x", "y")
    m.net.Relu("y", "z")
    m.net.Relu("z", "u")
    m.net.Alias("u", "u_alias")
    m.net.Relu("u_alias", "out")
    freed = memonger.release_blobs_when_used(m.net.Proto(), set("data"))
    frees = [op for op in freed.op if op.type == "Free"]
    assert {op.input[0] for op in frees} == {"x", "y", "z", "u_alias"}
    types = [op.type for op in freed.op]
    assert types.index("Free") == 2  # x is freed right after its last use (Relu -> y)
    keep_z = memonger.release_blobs_when_used(m.net.Proto(), {"z"},
                                              selector_fun=lambda b: b != "y")
    assert {op.input[0] for op in keep_z.op if op.type == "Free"} == {"x", "u_alias"}


def test_estimate_memory_usage():
    cpu = core.DeviceOption(caffe2_pb2.CPU)
    net = core.Net("est")
    with core.DeviceScope(cpu):
        net.Relu("x", "a")
        net.Relu("a", "b")
    net.Proto().op.add(type="Free", input=["a"], output=["a"])
    with core.DeviceScope(cpu):
        net.Relu("b", "c")
    shapes = {"a": [10], "b": [10, 2], "c": [5]}
    types = {b: caffe2_pb2.TensorProto.FLOAT for b in shapes}
    total, highwater, by_op = memonger.estimate_memory_usage([net.Proto()], shapes, types, cpu)
    assert total == 4 * (10 + 20 + 5)
    assert highwater == 4 * 30  # a and b live together; c comes after a is freed
    assert by_op["Relu"] == total


def test_assignment_helpers_on_caffe2_examples():
    LR = memonger.LiveRange
    ranges = [("b1", LR(1, 3, 10)), ("b2", LR(3, 4, 1)), ("b3", LR(5, 6, 1)),
              ("b4", LR(5, 7, 10))]
    greedy = memonger.compute_assignments_greedy(ranges, None)
    assert [[n for n, _ in a] for a in greedy] == [["b1", "b4"], ["b2", "b3"]]
    assert memonger.get_memory_usage(greedy) == 11
    assert memonger.get_memory_usage(memonger.compute_assignments_dp(ranges, None)) == 11
    memonger.verify_assignments(greedy)
    with pytest.raises(MemongerError):
        memonger.verify_assignments([[("b1", LR(1, 3, 10)), ("b2", LR(3, 4, 1))]])
    assert memonger.is_compatible(LR(5, 6, 1), [("b2", LR(3, 4, 1))], set())
    assert not memonger.is_compatible(LR(4, 6, 1), [("b2", LR(3, 4, 1))], set())
    assert not memonger.is_compatible(LR(5, 6, 1), [("b2", LR(3, 4, 1))], {"b2"})
    mapping = memonger.blob_assignments(greedy)
    assert mapping == {"b1": "b4", "b4": "b4", "b2": "b3", "b3": "b3"}
    assert memonger.compute_blob_assignments(greedy) == mapping


def test_topological_orders_of_networkx_graphs():
    g = nx.DiGraph()
    g.add_nodes_from(range(4))
    g.add_edges_from([(0, 1), (1, 3), (2, 3)])
    assert memonger.topological_sort_traversal(g) == [2, 0, 1, 3]
    assert memonger.topological_sort_traversal_longest_path(g) == [0, 1, 2, 3]
    g.add_edge(4, 5)
    assert memonger.topological_sort_traversal(g) == [4, 5, 2, 0, 1, 3]
    assert memonger.topological_sort_traversal_longest_path(g) == [0, 1, 2, 3, 4, 5]
    ops = [core.CreateOperator("Copy", "b1", "b1") for _ in range(3)]
    assert list(memonger.compute_interference_graph(ops).edges()) == [(0, 1), (0, 2), (1, 2)]


def test_verify_graph_equality_on_renamed_and_merged_nets():
    def net(names):
        n = core.Net("g")
        n.Relu("x", names[0])
        n.Relu("x", names[1])
        n.Sum([names[0], names[1]], "out")
        return n.Proto()

    assert memonger.verify_graph_equality(net(["a", "b"]), net(["p", "q"]))
    assert not memonger.verify_graph_equality(net(["a", "b"]), net(["a", "a"]))


def test_share_grad_blobs_on_a_resnext_keeps_loss_and_kept_grad():
    model = CNNModelHelper(order="NCHW", name="test")
    with core.NameScope("gpu_0"):
        data = model.net.AddExternalInput("gpu_0/data")
        label = model.net.AddExternalInput("gpu_0/label")
        _, loss = resnet.create_resnext(model, data, 3, 10, num_layers=18, num_groups=1,
                                        num_width_per_group=8, label=label, no_bias=0)
    param_to_grad = model.AddGradientOperators([loss])
    shapes, _ = workspace.InferShapesAndTypes(
        [model.param_init_net, model.net], {"gpu_0/data": [2, 3, 32, 32],
                                            "gpu_0/label": [2]})
    conv_grad = str(param_to_grad["gpu_0/conv1_w"])
    optim = memonger.share_grad_blobs(
        model.net, ["gpu_0/loss"], set(model.param_to_grad.values()), "gpu_0/",
        share_activations=True, dont_share_blobs={conv_grad}, blob_shapes=shapes)
    assert len(_blobs(optim)) < len(_blobs(model.net.Proto()))
    rng = np.random.RandomState(0)
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob("gpu_0/data", rng.rand(2, 3, 32, 32).astype(np.float32))
    workspace.FeedBlob("gpu_0/label", rng.randint(10, size=2).astype(np.int32))
    workspace.RunNetOnce(model.net)
    loss1, grad1 = workspace.FetchBlob("gpu_0/last_out_L10"), workspace.FetchBlob(conv_grad)
    workspace.FeedBlob(conv_grad, np.array([0.0], np.float32))
    optim.type, optim.num_workers = "dag", 4
    workspace.RunNetOnce(optim)
    np.testing.assert_almost_equal(workspace.FetchBlob("gpu_0/last_out_L10"), loss1, 7)
    np.testing.assert_almost_equal(workspace.FetchBlob(conv_grad), grad1, 7)


def test_memonger_mix_cpu_gpu_never_shares_across_devices():
    workspace.SetVirtualGpus(1)
    m = ModelHelper(name="mix")
    gpu = core.DeviceOption(caffe2_pb2.CUDA, 0)
    cpu = core.DeviceOption(caffe2_pb2.CPU, 0)
    with core.DeviceScope(gpu):
        blob = "data"
        for i in range(4):
            blob = brew.fc(m, blob, f"fc{i}", dim_in=8, dim_out=8)
        m.net.CopyGPUToCPU(blob, "fc_cpu_in")
    with core.DeviceScope(cpu):
        blob = "fc_cpu_in"
        for i in range(4, 8):
            blob = brew.fc(m, blob, f"fc{i}", dim_in=8, dim_out=8)
        sq = m.net.SquaredL2Distance([blob, "label"], "sq")
        loss = m.net.AveragedLoss(sq, "loss")
    m.AddGradientOperators([loss])
    optim = memonger.share_grad_blobs(m.net, ["loss"], set(m.param_to_grad.values()), "",
                                      share_activations=True, dont_share_blobs=set())
    assert len(_blobs(optim)) < len(_blobs(m.net.Proto()))
    by_device: dict[str, set[int]] = {}
    for op in optim.op:
        if op.type in ("CopyGPUToCPU", "CopyCPUToGPU"):
            continue
        for b in list(op.input) + list(op.output):
            by_device.setdefault(b, set()).add(op.device_option.device_type)
    assert not [b for b, kinds in by_device.items() if len(kinds) > 1]


def test_rnn_step_nets_are_renamed_with_rename_args():
    from dpgraph import rnn_cell

    T, batch, dim, hidden = 5, 2, 4, 6
    model = ModelHelper(name="rnn")
    data, seq_lengths, h0, c0 = model.net.AddExternalInputs("input", "seq_lengths", "h0",
                                                            "c0")
    out = rnn_cell.LSTM(model, data, seq_lengths, (h0, c0), dim, hidden, scope="lstm1",
                        drop_states=True)
    out = rnn_cell.LSTM(model, out[0], seq_lengths, (h0, c0), hidden, hidden, scope="lstm2",
                        drop_states=True)
    loss = model.AveragedLoss(model.SquaredL2Distance([out[0], "target"], "dist"), "loss")
    model.AddGradientOperators([loss])
    optim = memonger.share_grad_blobs(model.net, ["loss"], set(model.param_to_grad.values()),
                                      "", share_activations=True, dont_share_blobs=set())
    assert len(_blobs(optim)) < len(_blobs(model.net.Proto()))
    renames = [a.name for op in optim.op if op.type == "RecurrentNetworkGradient"
               for a in op.arg if a.name.endswith(".rename")]
    assert renames and all(a.s.decode().startswith("__m") for op in optim.op
                           for a in op.arg if a.name.endswith(".rename"))
    rng = np.random.RandomState(0)
    workspace.FeedBlob("input", rng.rand(T, batch, dim).astype(np.float32))
    workspace.FeedBlob("seq_lengths", np.full(batch, T, np.int32))
    workspace.FeedBlob("h0", np.zeros((1, batch, hidden), np.float32))
    workspace.FeedBlob("c0", np.zeros((1, batch, hidden), np.float32))
    workspace.FeedBlob("target", rng.rand(T, batch, hidden).astype(np.float32))
    workspace.RunNetOnce(model.param_init_net)
    grads = [str(g) for g in model.param_to_grad.values()]
    workspace.RunNetOnce(model.net)
    want = [workspace.FetchBlob(b) for b in ["loss", *grads]]
    workspace.RunNetOnce(optim)
    for expected, name in zip(want, ["loss", *grads]):
        np.testing.assert_array_equal(workspace.FetchBlob(name), expected, err_msg=name)
