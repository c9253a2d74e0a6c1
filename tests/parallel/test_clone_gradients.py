"""The backward pass by cloning: the first device's gradients renamed for every device whose
forward block is the first's renamed, byte-identical to the full backward pass; any other
device (an extra op, other losses) makes the full pass run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from _parallel_helpers import bn_forward, build, mlp_forward, sparse_forward
from _snapshots import clean_state

from dpgraph import scope
from dpgraph.parallel import clone_gradients, replicate
from dpgraph.proto import caffe2_pb2


def _state(model: Any) -> dict[str, Any]:
    return {
        "net": model.net.Proto().SerializeToString(),
        "init": model.param_init_net.Proto().SerializeToString(),
        "param_to_grad": [(str(k), str(v)) for k, v in model.param_to_grad.items()],
        "grad_map": [(str(k), type(v).__name__, str(v)) for k, v in model.grad_map.items()],
    }


def _cloned_and_full(monkeypatch: pytest.MonkeyPatch, devices: list[int],
                     **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(state with gradient cloning, state with the full pass, backward passes run when
    cloning)."""
    passes = []
    real = clone_gradients.GetBackwardPass

    def counted(*args: Any) -> Any:
        passes.append(1)
        return real(*args)

    monkeypatch.setattr(clone_gradients, "GetBackwardPass", counted)
    states = []
    for clone_from in (2, 10**6):
        monkeypatch.setattr(replicate, "CLONE_MIN_DEVICES", clone_from)
        with clean_state():
            states.append(_state(build(devices, **kwargs)))
    return states[0], states[1], len(passes)


@pytest.mark.parametrize("devices, kwargs", [
    ([0, 1], {}),
    ([1, 0], {"gpu": True, "update": "momentum"}),
    ([0, 1, 2, 3], {"gpu": True, "forward": sparse_forward, "update": "sgd"}),
    ([2, 0, 1], {"forward": bn_forward, "update": "momentum"}),
])
def test_cloned_gradients_equal_the_full_pass(monkeypatch: pytest.MonkeyPatch,
                                             devices: list[int], kwargs: dict) -> None:
    cloned, full, passes = _cloned_and_full(monkeypatch, devices, **kwargs)
    assert cloned == full
    assert passes == 1  # the first device's block only


def _differs_on(device: int) -> Callable[..., Any]:
    def forward(model: Any, loss_scale: float) -> list[Any]:
        hidden = mlp_forward(model, loss_scale)
        if scope.CurrentDeviceScope().device_id == device:
            return [model.net.Relu(hidden[0], "extra")]
        return hidden

    return forward


@pytest.mark.parametrize("devices, odd", [([0, 1], 1), ([0, 1, 2], 2), ([0, 1, 2, 3], 3)])
def test_a_device_with_other_forward_ops_runs_the_full_pass(
        monkeypatch: pytest.MonkeyPatch, devices: list[int], odd: int) -> None:
    cloned, full, passes = _cloned_and_full(monkeypatch, devices, forward=_differs_on(odd))
    assert cloned == full
    assert passes == 0
    relu_grads = [op for op in caffe2_pb2.NetDef.FromString(full["net"]).op
                  if op.type == "ReluGradient" and op.input[0] == f"cpu_{odd}/extra"]
    assert len(relu_grads) == 1  # the odd device's own forward op has its gradient


def test_a_device_with_other_losses_runs_the_full_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def forward(model: Any, loss_scale: float) -> list[Any]:
        losses = mlp_forward(model, loss_scale)
        if scope.CurrentDeviceScope().device_id == 2:
            return losses + [model.net.Scale("loss", "second", scale=2.0)]
        return losses

    cloned, full, passes = _cloned_and_full(monkeypatch, [0, 1, 2], forward=forward)
    assert cloned == full
    assert passes == 0


def _op(**args: Any) -> caffe2_pb2.OperatorDef:
    op = caffe2_pb2.OperatorDef(type="X", input=["cpu_0/a", "_cpu_0/a_grad_autosplit_0"],
                                output=["cpu_0/a_grad"], control_input=["cpu_0/c"])
    for name, value in args.items():
        if name == "debug_info":
            op.debug_info = value
            continue
        arg = op.arg.add(name=name)
        if isinstance(value, caffe2_pb2.NetDef):
            arg.n.CopyFrom(value)
        elif isinstance(value, list):
            arg.strings.extend(value)
        else:
            arg.s = value
    return op


def test_renamable_rejects_names_renaming_would_miss() -> None:
    from dpgraph.parallel.clone import plans_of

    def renamable(op: caffe2_pb2.OperatorDef) -> bool:
        option = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU, device_id=0)
        return clone_gradients._renamable(plans_of([op], option), "cpu_0/")

    assert renamable(_op(order=b"NCHW", tags=[b"x", b"y"], blob=b"cpu_1/a"))
    assert renamable(_op(step=caffe2_pb2.NetDef(name="inner", external_input=["ONE"])))
    assert not renamable(_op(blob=b"cpu_0/a"))
    assert not renamable(_op(blobs=[b"ONE", b"cpu_0/a"]))
    assert not renamable(_op(debug_info="made from cpu_0/a"))
    inner = caffe2_pb2.NetDef(name="inner")
    inner.op.add(type="Relu", input=["cpu_0/a"], output=["cpu_0/b"])
    assert not renamable(_op(step=inner))
