"""The fast op-creation paths give exactly what the plain ones give: ops built in place,
arguments encoded in place, shared creation-stack entries, read-only net access."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dpgraph.core import BlobReference, CreateOperator, DeviceOption, DeviceScope, NameScope, Net
from dpgraph.errors import ArgumentError, NetError
from dpgraph.ir import net as net_module
from dpgraph.ir.arguments import MakeArgument
from dpgraph.ir.net import operator_tracebacks, shared_creation_stack
from dpgraph.proto import caffe2_pb2


def test_net_op_equals_create_operator_bytes() -> None:
    """``net.<Op>`` (built in place) and ``CreateOperator`` + ``extend_ops`` agree."""
    in_place, copied = Net("in_place"), Net("copied")
    with DeviceScope(DeviceOption(1, 3)), NameScope("gpu_3"):
        in_place.Conv(["x", "w"], "y", kernel=3, pad=1, order="NCHW", exhaustive_search=False,
                      scale=0.5, shape=[1, 2], names=["a", b"b"], engine="CUDNN",
                      random_seed=7, skipped=None)
        copied.extend_ops([CreateOperator(
            "Conv", ["x", "w"], "y", kernel=3, pad=1, order="NCHW", exhaustive_search=False,
            scale=0.5, shape=[1, 2], names=["a", b"b"], engine="CUDNN", random_seed=7,
            skipped=None)])
    assert in_place.Proto().op[0].SerializeToString() == \
        copied.Proto().op[0].SerializeToString()
    assert list(in_place.Proto().external_input) == ["gpu_3/x", "gpu_3/w"]


def test_outputs_are_new_references_bound_to_the_net() -> None:
    net = Net("refs")
    given = BlobReference("z")
    given.meta["k"] = 1
    out = net.Relu("x", given)
    assert out == "z" and out is not given and out.Net() is net and out.meta == {}
    first, second = net.Split("z", ["a", BlobReference("b")], split=[1, 1])
    assert (first, second) == ("a", "b") and first.Net() is net and second.Net() is net


def test_repeated_undefined_input_is_declared_once() -> None:
    net = Net("twice")
    net.Sum(["x", "x", BlobReference("y")], "s")
    assert list(net.Proto().external_input) == ["x", "y"]
    net.Relu("s", "s")
    assert list(net.Proto().external_input) == ["x", "y"]


def test_failed_op_leaves_no_op_and_no_external_input() -> None:
    net = Net("atomic")
    net.Relu("a", "b")
    before = net.Proto().SerializeToString()
    with pytest.raises(ArgumentError):
        net.Relu(["c", "d"], "e", bad=object())
    undefined_own = BlobReference("ghost", net)
    with pytest.raises(NetError, match="claims to come from this net"):
        net.Sum(["c", undefined_own], "f")
    assert net.Proto().SerializeToString() == before
    assert not net.BlobIsDefined("e") and not net.BlobIsDefined("f")


def test_add_op_builds_in_place_and_keeps_lookup_tables() -> None:
    net = Net("add_op")
    net.Relu("x", "y")
    assert net.BlobIsDefined("y")
    op = net.add_op(type="Copy", name="", input=["y"], output=["z"],
                    device_option=DeviceOption(0, 0), arg=[MakeArgument("k", 2)])
    assert op is net.Proto().op[1] or op == net.Proto().op[1]
    assert net.BlobIsDefined("z")
    expected = caffe2_pb2.OperatorDef(type="Copy", name="", input=["y"], output=["z"],
                                      device_option=DeviceOption(0, 0),
                                      arg=[MakeArgument("k", 2)])
    assert net.Proto().op[1].SerializeToString() == expected.SerializeToString()


def test_proto_for_reading_is_the_live_proto() -> None:
    net = Net("read")
    net.Relu("x", "y")
    assert net.proto_for_reading() is net.Proto()
    assert net.proto_for_reading().op[0].type == "Relu"
    net.Relu("y", "w")  # the tables stayed valid: the new output is known at once
    assert net.BlobIsDefined("w") and len(net.proto_for_reading().op) == 2


def _plain_stack(frame: object) -> list[tuple[str, int, str]]:
    result = []
    while frame is not None:
        code = frame.f_code  # type: ignore[attr-defined]
        result.append((code.co_filename, frame.f_lineno, code.co_name))  # type: ignore
        frame = frame.f_back  # type: ignore[attr-defined]
    return result


def test_creation_stacks_name_every_frame_and_line() -> None:
    """Stacks share their per-site entries; each still shows the exact line of every
    frame (two call sites in one function, the same site in a loop)."""
    net = Net("stacks")
    expected = []
    for _ in range(2):
        net.Relu("x", "y"); expected.append(_plain_stack(sys._getframe()))  # noqa: E702
        net.Relu("y", "z"); expected.append(_plain_stack(sys._getframe()))  # noqa: E702
    stacks = operator_tracebacks[net.Name()]
    assert [stacks[i] for i in range(4)] == expected
    assert stacks[0] is not stacks[2] and stacks[0][0] is stacks[2][0]


@pytest.mark.parametrize("value", [
    1.5, -0.0, 0.0, float("nan"), 3, True, "s", b"b", [1, 2], (3, 4), [True, 2], [1.0, 2.5],
    [np.float32(1.5), 2.0], [np.int64(3), 4], [np.bool_(True)], np.array([1, 2]),
    ["a", b"b"], [], np.float64(0.25), np.int32(5),
])
def test_argument_fast_paths_match_the_general_encoder(value: object) -> None:
    """The exact-type shortcuts encode as the isinstance chain does (numpy scalars as the
    Python numbers they hold)."""
    def general(item: object) -> object:
        if isinstance(item, np.ndarray):
            item = item.flatten().tolist()
        if isinstance(item, (list, tuple)):
            return [v.item() if isinstance(v, np.generic) else v for v in item]
        return item.item() if isinstance(item, np.generic) else item

    converted = general(value)
    assert MakeArgument("k", value).SerializeToString() == \
        MakeArgument("k", converted).SerializeToString()


def test_mixed_list_error_names_python_types() -> None:
    with pytest.raises(ArgumentError, match="mixing int, str"):
        MakeArgument("k", [np.int64(1), "a"])


def test_caffe2_debug_is_read_live_for_every_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CAFFE2_DEBUG`` (read through ``os.environ``'s own dict) records the creation stack
    in ``debug_info`` from the next op on, and stops when unset or empty."""
    net = Net("debug_env")
    monkeypatch.delenv("CAFFE2_DEBUG", raising=False)
    net.Relu("x", "a")
    monkeypatch.setenv("CAFFE2_DEBUG", "1")
    net.Relu("a", "b")
    monkeypatch.setenv("CAFFE2_DEBUG", "")
    net.Relu("b", "c")
    monkeypatch.delenv("CAFFE2_DEBUG")
    net.Relu("c", "d")
    infos = [op.debug_info for op in net.Proto().op]
    assert infos[0] == infos[2] == infos[3] == ""
    assert "test_caffe2_debug_is_read_live_for_every_op" in infos[1]
    assert CreateOperator("Relu", "x", "y", debug_info="given").debug_info == "given"


def test_caffe2_debug_follows_a_replaced_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAFFE2_DEBUG", raising=False)
    monkeypatch.setattr(os, "environ", {"CAFFE2_DEBUG": "1"})
    assert CreateOperator("Relu", "x", "y").debug_info
    monkeypatch.setattr(os, "environ", {})
    assert not CreateOperator("Relu", "x", "y").debug_info


def test_append_op_fills_in_place_and_declares_new_inputs_once() -> None:
    net = Net("append_op")
    net.Relu("x", "y")

    def fill(op: caffe2_pb2.OperatorDef) -> None:
        op.type = "Sum"
        op.input.extend(["y", "u", "u", "v"])
        op.output.append("y")

    op = net.append_op(fill, ["y", "u", "u", "v"], ["y"])
    assert op == net.Proto().op[1] and op.type == "Sum"
    assert list(net.Proto().external_input) == ["x", "u", "v"]
    net._CheckLookupTables()

    def own_output(op: caffe2_pb2.OperatorDef) -> None:
        op.type = "Relu"
        op.input.append("w")
        op.output.append("w")

    net.append_op(own_output, ["w"], ["w"])  # an in-place op's input is not yet defined
    assert list(net.Proto().external_input) == ["x", "u", "v", "w"]

    def broken(op: caffe2_pb2.OperatorDef) -> None:
        op.type = "Relu"
        raise ValueError("no")

    before = net.Proto().SerializeToString()
    with pytest.raises(ValueError):
        net.append_op(broken, ["q"], ["r"])
    assert net.Proto().SerializeToString() == before
    assert not net.BlobIsDefined("q") and not net.BlobIsDefined("r")


def _make_relu(net: Net, expected: list[Any], name: str) -> None:
    net.Relu("x", name); expected.append(_plain_stack(sys._getframe()))  # noqa: E702


def test_shared_creation_stack_records_the_same_stacks() -> None:
    """Inside ``shared_creation_stack`` (nested too) ops record exactly the stacks a full
    walk gives, also from other lines of the root frame."""
    net = Net("shared_root")
    expected: list[Any] = []
    _make_relu(net, expected, "a")
    with shared_creation_stack():
        _make_relu(net, expected, "b")
        net.Relu("x", "c"); expected.append(_plain_stack(sys._getframe()))  # noqa: E702
        with shared_creation_stack():
            _make_relu(net, expected, "d")
        _make_relu(net, expected, "e")
    _make_relu(net, expected, "f")
    stacks = operator_tracebacks[net.Name()]
    assert [stacks[i] for i in range(6)] == expected
    assert not getattr(net_module._ROOTS, "stack", [])


def test_shared_creation_stack_in_a_generator_or_thread_walks_every_frame() -> None:
    net = Net("shared_root_gen")
    expected: list[Any] = []

    def builder() -> Iterator[None]:
        with shared_creation_stack():  # a generator may resume under other callers
            yield
            _make_relu(net, expected, "g")
            yield

    def resume(gen: Iterator[None]) -> None:
        next(gen)

    gen = builder()
    next(gen)
    resume(gen)  # a different caller than the first next()
    results: list[Any] = []

    def other_thread() -> None:
        _make_relu(net, results, "t")

    with shared_creation_stack():
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    stacks = operator_tracebacks[net.Name()]
    assert [stacks[0], stacks[1]] == [expected[0], results[0]]


def test_parallelize_records_full_creation_stacks() -> None:
    """The pass driver runs builders in a shared_creation_stack: their ops' stacks still
    reach the outermost frame."""
    from dpgraph import brew, data_parallel_model, model_helper

    expected: list[Any] = []
    seen = expected.append

    def forward(model: Any, loss_scale: float) -> list[Any]:
        out = brew.fc(model, "data", "fc", 4, 2)
        loss = model.net.AveragedLoss(out, "l"); seen(_plain_stack(sys._getframe()))  # noqa: E702
        return [loss]

    model = model_helper.ModelHelper(name="stacks_parallel")
    data_parallel_model.Parallelize(model, lambda m: None, forward, devices=[0, 1],
                                    cpu_device=True, optimize_gradient_memory=False,
                                    param_update_builder_fun=None,
                                    optimizer_builder_fun=None)
    stacks = operator_tracebacks[model.net.Name()]
    losses = [i for i, op in enumerate(model.net.Proto().op) if op.type == "AveragedLoss"]
    assert [stacks[i] for i in losses] == expected
    assert len(expected) == 2 and len(expected[0]) > 8


def test_op_methods_found_directly_behave_like_getattr() -> None:
    """After first use ``net.<Op>`` is a class attribute; registration is still checked on
    every access, instance attributes still win, the class itself has no such attribute."""
    from dpgraph.errors import UnknownOperatorError
    from dpgraph.ir.registry import OPERATORS, OpSchema

    OPERATORS.add(OpSchema(type="TestOnlyCachedOp"))
    try:
        net = Net("op_methods")
        net.TestOnlyCachedOp("x", "y")
        assert "TestOnlyCachedOp" in vars(Net)  # installed by the first access
        net.TestOnlyCachedOp("y", "z")
        assert [op.type for op in net.Proto().op] == ["TestOnlyCachedOp"] * 2
        assert not hasattr(Net, "TestOnlyCachedOp") and hasattr(net, "TestOnlyCachedOp")
        other = Net("op_methods_other")
        other.__dict__["TestOnlyCachedOp"] = "mine"
        assert other.TestOnlyCachedOp == "mine"
    finally:
        del OPERATORS._schemas["TestOnlyCachedOp"]
    with pytest.raises(UnknownOperatorError, match="TestOnlyCachedOp is not a registered"):
        net.TestOnlyCachedOp("z", "w")
    assert not hasattr(net, "TestOnlyCachedOp")
    with pytest.raises(AttributeError):
        net._private_name  # noqa: B018


class _NameRef(BlobReference):
    pass


class _Names(list):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize("blobs", [
    "x", b"x", BlobReference("s/x"), _NameRef("r"), ["x", b"y", BlobReference("z")],
    ("x", "y"), [], _Names(["x", _NameRef("q")]), ["x", 3], 3, None, {"x"},
])
def test_rectified_names_equal_rectify_input_output(blobs: object) -> None:
    from dpgraph.ir.operator import RectifyInputOutput, rectified_names

    with NameScope("scope"):
        try:
            expected: object = [str(r) for r in RectifyInputOutput(blobs)]
        except Exception as error:  # noqa: BLE001 - the same error type is expected
            with pytest.raises(type(error)):
                rectified_names(blobs)
            return
        assert rectified_names(blobs) == expected


def test_add_gradient_operators_checks_ys_against_outputs_and_external_inputs() -> None:
    from dpgraph.errors import GradientError

    net = Net("grad_ys")
    net.FC(["x", "w", "b"], "y")
    loss = net.AveragedLoss("y", "loss")
    with pytest.raises(GradientError, match=r"\['nowhere'\] is neither the output"):
        net.AddGradientOperators(["nowhere"])
    net.Proto().external_input.append("fed_loss")  # raw edit: the tables are refreshed
    with pytest.raises(GradientError, match=r"\['also_nowhere'\] is neither"):
        net.AddGradientOperators({"fed_loss": None, "also_nowhere": None})
    grads = net.AddGradientOperators([loss])
    assert str(grads["w"]) == "w_grad" and net.BlobIsDefined("w_grad")
    net._CheckLookupTables()
