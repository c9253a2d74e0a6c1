"""``Python`` / ``PythonGradient`` ops: ``net.Python(f, grad_f)`` and
``core.CreatePythonOperator`` with Caffe2's tensor views and gradient wiring."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import ArgumentError, GradientError
from dpgraph.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    workspace.ResetWorkspace()
    yield
    workspace.SetVirtualGpus(0)
    workspace.ResetWorkspace()


def double(inputs, outputs) -> None:
    outputs[0].reshape(inputs[0].shape)
    outputs[0].data[...] = inputs[0].data * 2


def double_grad(inputs, outputs) -> None:
    grad_output = inputs[2]  # [inputs, outputs, output gradients]
    outputs[0].reshape(grad_output.shape)
    outputs[0].data[...] = grad_output.data * 2


def test_forward_and_gradient() -> None:
    net = core.Net("py")
    y = net.Python(double, double_grad)(["x"], ["y"])
    loss = net.AveragedLoss(y, "loss")
    grads = net.AddGradientOperators([loss])
    grad_op = net.Proto().op[-1]
    assert grad_op.type == "PythonGradient" and grad_op.is_gradient_op
    assert list(grad_op.input) == ["x", "y", "y_grad"] and list(grad_op.output) == ["x_grad"]
    token = [a.s for a in net.Proto().op[0].arg if a.name == "token"]
    assert token and [a.s for a in grad_op.arg if a.name == "token"] == token
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), 2 * x)
    assert workspace.FetchBlob("y").dtype == np.float32
    np.testing.assert_allclose(workspace.FetchBlob(grads["x"]), np.full((2, 3), 2 / 6))


def test_gradient_index_subsets() -> None:
    def f(inputs, outputs) -> None:
        outputs[0].feed(inputs[0].data + inputs[1].data)
        outputs[1].feed(np.zeros(1, np.float32))

    def grad_f(inputs, outputs) -> None:
        # inputs: a, b, out, aux, out_grad; outputs: b_grad only
        outputs[0].feed(inputs[4].data * 3)

    net = core.Net("subset")
    out, _ = net.Python(f, grad_f, grad_output_indices=[0], grad_input_indices=[1])(
        ["a", "b"], ["out", "aux"])
    net.AddGradientOperators({out: None})
    grad_op = net.Proto().op[-1]
    assert list(grad_op.input) == ["a", "b", "out", "aux", "out_autogen_grad"]
    assert list(grad_op.output) == ["b_grad"]
    workspace.FeedBlob("a", np.ones(3, np.float32))
    workspace.FeedBlob("b", np.ones(3, np.float32))
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("b_grad"), np.full(3, 3.0))
    assert not workspace.HasBlob("a_grad")

    plain = core.Net("no_subset")
    out2, _ = plain.Python(f, grad_f)(["a", "b"], ["out2", "aux2"])
    with pytest.raises(GradientError):  # 'aux2' has no gradient: name the indices
        plain.AddGradientOperators({out2: None})


class Counter:
    """A stateful Python op (``python_func_type``)."""

    def __init__(self, f) -> None:
        self.calls = 0

    def forward(self, inputs, outputs) -> None:
        self.calls += 1
        outputs[0].feed(np.array([self.calls], np.int64))


def make_adder(amount):
    def f(inputs, outputs) -> None:
        outputs[0].feed(inputs[0].data + amount)
    return f


def test_stateful_builder_and_workspace_forms() -> None:
    net = core.Net("forms")
    net.Python(None, python_func_type=Counter)([], ["calls"])
    net.Python((make_adder, [5.0], {}))(["x"], ["x5"])
    seen = []
    net.Python(lambda i, o, ws: seen.append(ws), pass_workspace=True)([], [])
    built = [a for a in net.Proto().op[1].arg if a.name == "pickled_builder"]
    assert built and built[0].s
    workspace.FeedBlob("x", np.zeros(2, np.float32))
    workspace.CreateNet(net)
    workspace.RunNet(net, 3)
    np.testing.assert_array_equal(workspace.FetchBlob("calls"), [3])
    np.testing.assert_array_equal(workspace.FetchBlob("x5"), [5.0, 5.0])
    assert len(seen) == 3 and seen[0] is not None


def test_create_python_operator_int32_outputs_and_errors() -> None:
    def labels(inputs, outputs) -> None:
        value = inputs[0].data.astype(np.int32)
        assert isinstance(inputs[0].shape, tuple)
        outputs[0].init(list(value.shape), caffe2_pb2.TensorProto.INT32)
        outputs[0].data[...] = value

    op = core.CreatePythonOperator(labels, ["f"], ["i"])
    assert op.type == "Python"
    workspace.FeedBlob("f", np.array([1.7, 2.2], np.float32))
    workspace.RunOperatorOnce(op)
    result = workspace.FetchBlob("i")
    assert result.dtype == np.int32 and result.tolist() == [1, 2]

    untouched = core.CreatePythonOperator(lambda i, o: o[0].data, [], ["never"])
    with pytest.raises(ArgumentError, match="reshape"):
        workspace.RunOperatorOnce(untouched)
    stale = core.CreateOperator("Python", [], ["z"], token="python_op_unknown")
    with pytest.raises(ArgumentError, match="token"):
        workspace.RunOperatorOnce(stale)
    with pytest.raises(ArgumentError, match="builder tuple"):
        core.Net("bad").Python((make_adder, [1.0]))


def test_python_op_on_virtual_gpus_in_named_scopes() -> None:
    workspace.SetVirtualGpus(2)
    net = core.Net("gpu_py")
    for gpu in range(2):
        with core.NameScope(f"gpu_{gpu}"), core.DeviceScope(
                core.DeviceOption(caffe2_pb2.CUDA, gpu)):
            net.Python(double)(["x"], ["y"])
            workspace.FeedBlob(core.ScopedName("x"), np.full(2, gpu + 1, np.float32))
    workspace.RunNetOnce(net)
    assert [op.device_option.device_id for op in net.Proto().op] == [0, 1]
    np.testing.assert_array_equal(workspace.FetchBlob("gpu_1/y"), [4.0, 4.0])


@pytest.mark.parametrize("net_type", ["simple", "dag"])
def test_python_op_may_call_the_workspace_api(net_type: str) -> None:
    def f(inputs, outputs) -> None:
        other = workspace.FetchBlob("other")
        workspace.FeedBlob("side", other * 3)
        outputs[0].feed(inputs[0].data + other)

    workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.FeedBlob("other", np.full(2, 2.0, np.float32))
    net = core.Net("uses_workspace")
    net.Proto().type = net_type
    net.Python(f)(["x"], ["y"])
    net.Relu("y", "z")
    workspace.CreateNet(net)
    workspace.RunNet(net, 2)
    np.testing.assert_array_equal(workspace.FetchBlob("z"), [3.0, 3.0])
    np.testing.assert_array_equal(workspace.FetchBlob("side"), [6.0, 6.0])


def test_pass_workspace_gets_caffe2_workspace_object() -> None:
    values = np.arange(3, dtype=np.float32)
    fetched = []
    ws = workspace.C.Workspace()
    net = core.Net("ws_view")
    net.GivenTensorFill([], ["internal"], values=values, shape=values.shape)
    net.Python(lambda i, o, w: fetched.append(w.blobs["internal"].fetch()),
               pass_workspace=True)([], [])
    ws.run(net)
    np.testing.assert_array_equal(fetched[0], values)
