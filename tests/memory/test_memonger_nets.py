"""memonger passes on real nets: optimised nets compute the same losses and gradients,
with fewer blobs, keeping the blobs the caller needs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpgraph import brew, core, memonger, model_helper, workspace
from dpgraph.errors import MemongerError
from dpgraph.proto import caffe2_pb2


def count_blobs(proto: caffe2_pb2.NetDef) -> int:
    return len({b for op in proto.op for b in list(op.input) + list(op.output)})


def has_blob(proto: caffe2_pb2.NetDef, name: str) -> bool:
    return any(name in op.input or name in op.output for op in proto.op)


def _feed(prefix: str, batch: int, dim_in: int, dim_out: int, seed: int = 0) -> None:
    rs = np.random.RandomState(seed)
    workspace.FeedBlob(prefix + "data", rs.randn(batch, dim_in).astype(np.float32))
    workspace.FeedBlob(prefix + "label",
                       rs.randint(0, dim_out, size=(batch,)).astype(np.int32))


def _simple_model(dim_in: int, dim_out: int) -> tuple[Any, dict]:
    m = model_helper.ModelHelper()
    fc1 = brew.fc(m, "data", "fc1", dim_in=dim_in, dim_out=dim_out)
    fc2 = brew.fc(m, fc1, "fc2", dim_in=dim_out, dim_out=dim_out)
    fc3 = brew.fc(m, fc2, "fc3", dim_in=dim_out, dim_out=dim_out)
    fc3.Relu([], fc3)
    pred = brew.softmax(m, fc3, "pred")
    xent = m.net.LabelCrossEntropy([pred, "label"], "xent")
    m.net.AveragedLoss(xent, "loss")
    grads = m.AddGradientOperators(["loss"])
    return m, grads


def _run(proto: Any, fetch: list[str]) -> list[np.ndarray]:
    workspace.RunNetOnce(proto)
    return [workspace.FetchBlob(b).copy() for b in fetch]


@pytest.mark.parametrize("algo", list(memonger.AssignmentAlgorithm))
@pytest.mark.parametrize("dims", [(3, 4, 5), (1, 1, 1), (10, 2, 7)])
def test_simple_memonger(dims: tuple[int, int, int], algo: Any) -> None:
    dim_in, dim_out, batch = dims
    m, grads = _simple_model(dim_in, dim_out)
    grad = str(grads["fc1_w"])
    static = [o for op in m.param_init_net.Proto().op for o in op.output]
    static += ["data", "label", "loss", grad]
    optimization = memonger.optimize_interference(m.Proto(), static, algo=algo)
    _feed("", batch, dim_in, dim_out)
    workspace.RunNetOnce(m.param_init_net)
    loss, g = _run(m.net, ["loss", grad])
    assert count_blobs(optimization.net) < count_blobs(m.Proto())
    loss2, g2 = _run(optimization.net, ["loss", grad])
    np.testing.assert_almost_equal(loss, loss2)
    np.testing.assert_almost_equal(g, g2)
    stats = memonger.compute_statistics(optimization.assignments)
    assert stats.optimized_nbytes < stats.baseline_nbytes
    sizes = memonger.collect_blob_sizes(m.Proto())
    sized = memonger.optimize_interference(m.Proto(), static, blob_sizes=sizes, algo=algo)
    loss3, g3 = _run(sized.net, ["loss", grad])
    np.testing.assert_almost_equal(loss, loss3)
    np.testing.assert_almost_equal(g, g3)
    stats = memonger.compute_statistics(sized.assignments)
    assert stats.optimized_nbytes <= stats.baseline_nbytes
    for blob in static:
        assert not any(blob in [b for b, _ in a[1:]] for a in sized.assignments)


def test_optimize_interference_longest_path_ordering() -> None:
    m, grads = _simple_model(4, 3)
    grad = str(grads["fc1_w"])
    static = [o for op in m.param_init_net.Proto().op for o in op.output]
    static += ["data", "label", "loss", grad]
    opt = memonger.optimize_interference(
        m.Proto(), static, ordering_function=memonger.topological_sort_traversal_longest_path)
    _feed("", 5, 4, 3)
    workspace.RunNetOnce(m.param_init_net)
    expected = _run(m.net, ["loss", grad])
    for want, got in zip(expected, _run(opt.net, ["loss", grad])):
        np.testing.assert_almost_equal(want, got)


def test_fast_memonger() -> None:
    m, grads = _simple_model(4, 5)
    grad = str(grads["fc1_w"])
    static = [o for op in m.param_init_net.Proto().op for o in op.output]
    static += ["data", "label", "loss", grad]
    optimized = memonger.optimize_inference_fast(m.Proto(), static)
    assert count_blobs(optimized) < count_blobs(m.Proto())
    _feed("", 6, 4, 5)
    workspace.RunNetOnce(m.param_init_net)
    expected = _run(m.net, ["loss", grad])
    for want, got in zip(expected, _run(optimized, ["loss", grad])):
        np.testing.assert_almost_equal(want, got)


def test_fast_memonger_unique_outputs() -> None:
    m = model_helper.ModelHelper()
    fcs = [brew.fc(m, f"data{i}", f"fc{i}", dim_in=2, dim_out=2) for i in range(2)]
    sums = [brew.sum(m, [x, y], f"sum_{i}_{j}") for i, x in enumerate(fcs)
            for j, y in enumerate(fcs)]
    concat, _ = m.net.Concat(sums, ["concated", "split_info"], axis=1)
    brew.relu(m, concat, "merged")
    static = [o for op in m.param_init_net.Proto().op for o in op.output]
    static += ["merged", "data0", "data1"]
    optimized = memonger.optimize_inference_fast(m.Proto(), static)
    for op in optimized.op:
        assert len(op.output) == len(set(op.output))
    assert count_blobs(optimized) < count_blobs(m.Proto())
    for i in range(2):
        workspace.FeedBlob(f"data{i}", np.random.RandomState(i).randn(3, 2).astype(np.float32))
    workspace.RunNetOnce(m.param_init_net)
    (want,) = _run(m.net, ["merged"])
    (got,) = _run(optimized, ["merged"])
    np.testing.assert_array_equal(want, got)


def _five_fc(dim_in: int, dim_out: int, tree: bool = False) -> tuple[Any, dict, list[str]]:
    m = model_helper.ModelHelper()
    with core.NameScope("name_x"):
        fc = brew.fc(m, "data", "fc1", dim_in=dim_in, dim_out=dim_out)
        for k in range(2, 6):
            fc = brew.fc(m, fc, f"fc{k}", dim_in=dim_out, dim_out=dim_out)
        fc4 = core.BlobReference("name_x/fc4")
        fc.Relu([], fc)
        sm = brew.softmax(m, fc, "sm")
        xent = m.net.LabelCrossEntropy([sm, "label"], "xent")
        losses = [m.net.AveragedLoss(xent, "loss1" if tree else "loss")]
        if tree:
            fc6 = brew.fc(m, fc4, "fc6", dim_in=dim_out, dim_out=dim_out)
            fc6.Relu([], fc6)
            sm2 = brew.softmax(m, fc6, "sm2")
            xent2 = m.net.LabelCrossEntropy([sm2, "label"], "xent2")
            losses.append(m.net.AveragedLoss(xent2, "loss2"))
    names = [str(loss) for loss in losses]
    grads = m.AddGradientOperators(names)
    return m, grads, names


@pytest.mark.parametrize("dims", [(4, 4, 5), (2, 3, 1)])
def test_gradient_optim(dims: tuple[int, int, int]) -> None:
    dim_in, dim_out, batch = dims
    m, grads, losses = _five_fc(dim_in, dim_out)
    grad = str(grads["name_x/fc1_w"])
    before = count_blobs(m.net.Proto())
    param_grads = set(m.param_to_grad.values())
    optim = memonger.share_grad_blobs(m.net, losses, param_grads, "name_x/",
                                      share_activations=False)
    assert count_blobs(optim) < before
    with_acts = memonger.share_grad_blobs(m.net, losses, param_grads, "name_x/",
                                          share_activations=True, dont_share_blobs={grad})
    assert count_blobs(with_acts) <= count_blobs(optim)
    assert has_blob(optim, "name_x/fc5") and has_blob(with_acts, "name_x/fc5")
    assert any(b.startswith("name_x/__m") and b.endswith("_shared")
               for op in optim.op for b in op.output)
    _feed("name_x/", batch, dim_in, dim_out)
    workspace.RunNetOnce(m.param_init_net)
    loss, g = _run(m.net, ["name_x/loss", grad])
    loss1, g1 = _run(optim, ["name_x/loss", grad])
    np.testing.assert_array_equal(loss, loss1)
    np.testing.assert_array_equal(g, g1)
    workspace.FeedBlob(grad, np.array([0.0], dtype=np.float32))
    loss2, g2 = _run(with_acts, ["name_x/loss", grad])
    np.testing.assert_array_equal(loss, loss2)
    np.testing.assert_array_equal(g, g2)


def test_gradient_optim_tree() -> None:
    m, grads, losses = _five_fc(4, 4, tree=True)
    grad = str(grads["name_x/fc1_w"])
    before = count_blobs(m.net.Proto())
    optim = memonger.share_grad_blobs(
        m.net, losses, set(m.param_to_grad.values()), "name_x", share_activations=True,
        dont_share_blobs={"name_x/fc6", "name_x/fc5", grad})
    assert count_blobs(optim) < before
    assert has_blob(optim, "name_x/fc6")
    assert all(b.startswith("name_x/") for op in optim.op for b in op.output
               if "__m" in b)
    _feed("name_x/", 5, 4, 4)
    workspace.RunNetOnce(m.param_init_net)
    expected = _run(m.net, losses + [grad])
    for want, got in zip(expected, _run(optim, losses + [grad])):
        np.testing.assert_array_equal(want, got)


def test_share_grad_blobs_repeated_names_do_not_collide() -> None:
    m, _, losses = _five_fc(3, 3)
    param_grads = set(m.param_to_grad.values())
    once = memonger.share_grad_blobs(m.net, losses, param_grads, "name_x/")
    twice = memonger.share_grad_blobs(core.Net(once), losses, param_grads, "name_x/",
                                      share_activations=True)
    assert memonger.verify_graph_equality(m.net.Proto(), twice)


def test_share_grad_blobs_respects_pinned_blobs() -> None:
    m, grads, losses = _five_fc(3, 3)
    m.net.Print("name_x/fc3_grad", [])          # side effects pin the blob
    m.net.AddExternalOutput(m.net.GetBlobRef("name_x/fc2_grad"))  # external outputs are pinned too
    optim = memonger.share_grad_blobs(m.net, losses, set(m.param_to_grad.values()),
                                      "name_x/", share_activations=True,
                                      dont_share_blobs={"name_x/fc4_grad"})
    for kept in ("name_x/fc3_grad", "name_x/fc2_grad", "name_x/fc4_grad", "name_x/data",
                 "name_x/fc1_w", str(grads["name_x/fc1_w"]), "name_x/loss"):
        assert has_blob(optim, kept), kept
    assert count_blobs(optim) < count_blobs(m.net.Proto())


def test_share_grad_blobs_does_not_modify_input_net() -> None:
    m, _, losses = _five_fc(3, 3)
    before = m.net.Proto().SerializeToString()
    memonger.share_grad_blobs(m.net, losses, set(m.param_to_grad.values()), "name_x/",
                              share_activations=True)
    assert m.net.Proto().SerializeToString() == before


def _daggy(extra: bool) -> tuple[Any, int]:
    m = model_helper.ModelHelper()
    m.Proto().type = "dag"
    m.Proto().num_workers = 4
    with core.NameScope("name_x"):
        fc1 = brew.fc(m, "data", "fc1", dim_in=4, dim_out=4)
        fc2 = brew.fc(m, fc1, "fc2", dim_in=4, dim_out=4)
        a = brew.fc(m, fc2, "fc3", dim_in=4, dim_out=4)
        a = brew.fc(m, a, "fc4", dim_in=4, dim_out=4)
        a = brew.fc(m, a, "fc5", dim_in=4, dim_out=4)
        b = brew.fc(m, fc2, "fc3b", dim_in=4, dim_out=4)
        b = brew.fc(m, b, "fc4b", dim_in=4, dim_out=4)
        b = brew.fc(m, b, "fc5b", dim_in=4, dim_out=4)
        if extra:
            c = brew.fc(m, fc1, "fc3c", dim_in=4, dim_out=4)
            c = brew.fc(m, c, "fc4c", dim_in=4, dim_out=4)
            b = brew.sum(m, [b, c], "fc5bc")
        total = brew.sum(m, [a, b], "fc5sum")
        sm = brew.softmax(m, total, "sm")
        xent = m.net.LabelCrossEntropy([sm, "label"], "xent")
        m.net.AveragedLoss(xent, "loss")
    return m, count_blobs(m.net.Proto())


@pytest.mark.parametrize("extra", [False, True])
def test_forward_optim_tree_daggy(extra: bool) -> None:
    m, before = _daggy(extra)
    _feed("name_x/", 4, 4, 4)
    workspace.RunNetOnce(m.param_init_net)
    (loss,) = _run(m.net, ["name_x/loss"])
    optim = memonger.optimize_inference_for_dag(m.net, ["name_x/data"], "name_x")
    assert memonger.verify_graph_equality(m.net.Proto(), optim)
    assert count_blobs(optim) < before
    (loss1,) = _run(optim, ["name_x/loss"])
    np.testing.assert_array_equal(loss, loss1)
    with_param = memonger.optimize_inference_for_dag(
        m.net, ["name_x/data", "name_x/fc1_w"], "name_x")
    assert count_blobs(with_param) == count_blobs(optim)


def test_forward_optim_dag_adds_no_dependencies() -> None:
    """Two independent branches never share a buffer (they may run in parallel)."""
    m, _ = _daggy(False)
    optim = memonger.optimize_inference_for_dag(m.net, ["name_x/data"], "name_x")
    renamed = {}
    for orig, new in zip(m.net.Proto().op, optim.op):
        for x, y in zip(orig.output, new.output):
            renamed.setdefault(y, set()).add(x)
    for group in renamed.values():
        has_a = any(n.endswith(("fc3", "fc4")) for n in group)
        has_b = any(n.endswith(("fc3b", "fc4b")) for n in group)
        assert not (has_a and has_b), group


def test_release_blobs_when_used() -> None:
    m, grads = _simple_model(4, 3)
    grad = str(grads["fc1_w"])
    keep = {grad, "loss"}
    freed = memonger.release_blobs_when_used(m.Proto(), keep)
    frees = [op for op in freed.op if op.type == "Free"]
    freed_names = {op.input[0] for op in frees}
    assert all(list(op.input) == list(op.output) for op in frees)
    assert "fc1" in freed_names and "fc2_grad" in freed_names
    assert not freed_names & ({"data", "label", "fc1_w", "fc1_b"} | keep)
    # each Free comes right after the last op touching the blob
    for i, op in enumerate(freed.op):
        if op.type == "Free":
            b = op.input[0]
            assert not any(b in o.input or b in o.output for o in freed.op[i + 1:])
    _feed("", 5, 4, 3)
    workspace.RunNetOnce(m.param_init_net)
    expected = _run(m.net, ["loss", grad])
    for want, got in zip(expected, _run(freed, ["loss", grad])):
        np.testing.assert_array_equal(want, got)
    only_grads = memonger.release_blobs_when_used(m.Proto(), keep,
                                                  selector_fun=lambda b: "grad" in b)
    assert all("grad" in op.input[0] for op in only_grads.op if op.type == "Free")


def test_release_keeps_alias_blobs() -> None:
    net = core.Net("alias")
    net.Relu("x", "y")
    net.Alias("y", "y_alias")
    net.Relu("y_alias", "z")
    net.Relu("z", "w")
    freed = memonger.release_blobs_when_used(net.Proto(), set())
    names = {op.input[0] for op in freed.op if op.type == "Free"}
    assert names == {"z", "y_alias"}  # an Alias's input is never freed, its output is


def test_memonger_error_is_typed() -> None:
    with pytest.raises(MemongerError):
        memonger.share_grad_blobs(object(), [], set(), "x/")


def test_blobs_touched_by_collectives_are_never_shared() -> None:
    m, _, losses = _five_fc(3, 3)
    proto = m.net.Proto()
    proto.op.add(type="Allreduce", input=["cw", "name_x/fc3_grad"], output=["name_x/fc3_grad"])
    for optimized in (
        memonger.share_grad_blobs(m.net, losses, set(m.param_to_grad.values()), "name_x/",
                                  share_activations=True),
        memonger.optimize_inference_fast(proto, []),
        memonger.release_blobs_when_used(proto, set()),
    ):
        assert has_blob(optimized, "name_x/fc3_grad")
        assert not any(op.type == "Free" and op.input[0] == "name_x/fc3_grad"
                       for op in optimized.op)
