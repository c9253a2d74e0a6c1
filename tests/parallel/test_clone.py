"""Parallelize by cloning: devices after the second are copies of the first renamed, exactly
what their builders would have made; any difference between the first two builds falls
back to running every device's builders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _parallel_helpers import build, mlp_forward, sparse_forward
from _snapshots import clean_state

from dpgraph import brew, core, model_helper, workspace
from dpgraph.parallel import replicate


@pytest.fixture(autouse=True)
def clone_builders(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests exercise builder cloning, which is opt-in (Caffe2 calls the builders
    once per device; see replicate.CLONE_BUILDERS)."""
    monkeypatch.setattr(replicate, "CLONE_BUILDERS", True)


def _counting(forward: Callable[..., Any]) -> tuple[Callable[..., Any], list[str]]:
    scopes: list[str] = []

    def counted(model: Any, loss_scale: float) -> Any:
        from dpgraph import scope

        scopes.append(scope.CurrentNameScope())
        return forward(model, loss_scale)

    return counted, scopes


def _state(model: Any) -> dict[str, Any]:
    """Everything a replica build leaves on the model."""
    return {
        "net": model.net.Proto().SerializeToString(),
        "init": model.param_init_net.Proto().SerializeToString(),
        "params": [str(p) for p in model.params],
        "weights": [str(p) for p in model.weights],
        "biases": [str(p) for p in model.biases],
        "computed": [str(p) for p in model._computed_params],
        "infos": [(k, v.name, v.shape, str(v.grad)) for k, v in model._parameters_info.items()],
        "param_to_grad": {str(k): str(v) for k, v in model.param_to_grad.items()},
        "grad_map": [(str(k), str(v)) for k, v in model.grad_map.items()],
        "grad_types": sorted({type(v).__name__ for v in model.grad_map.values()}),
        "losses": {d: [str(b) for b in v] for d, v in model._losses_by_gpu.items()},
        "grouped": {k: {d: str(b) for d, b in v.items()}
                    for k, v in model._device_grouped_blobs.items()},
        "registered": sorted(model.net._registered_blob_names),
    }


@pytest.mark.parametrize("gpu, devices, kwargs", [
    (False, [0, 1, 2, 3], {}),
    (True, [3, 1, 0, 2, 5], {"update": "momentum"}),
    (True, [0, 1, 2, 3], {"forward": sparse_forward, "update": "sgd"}),
    (False, [2, 0, 1], {"shared_model": True}),
])
def test_cloned_replicas_equal_built_ones(monkeypatch: pytest.MonkeyPatch, gpu: bool,
                                          devices: list[int], kwargs: dict) -> None:
    forward = kwargs.pop("forward", mlp_forward)
    states, calls = [], []
    for clone_from in (replicate.CLONE_MIN_DEVICES, 10**6):
        monkeypatch.setattr(replicate, "CLONE_MIN_DEVICES", clone_from)
        counted, scopes = _counting(forward)
        with clean_state():  # the same process-wide name counters for both builds
            states.append(_state(build(devices, gpu=gpu, forward=counted, **kwargs)))
        calls.append(scopes)
    cloned, built = states
    assert cloned == built
    prefix = "gpu" if gpu else "cpu"
    assert calls == [[f"{prefix}_{d}/" for d in devices[:2]],
                     [f"{prefix}_{d}/" for d in devices]]


def _every_device_builds(forward: Callable[..., Any], devices: list[int],
                         **kwargs: Any) -> Any:
    counted, scopes = _counting(forward)
    model = build(devices, forward=counted, **kwargs)
    assert scopes == [f"cpu_{d}/" for d in devices]
    return model


def test_device_dependent_builder_builds_every_device() -> None:
    """The second device's build differs from the first's renamed: no cloning."""
    def forward(model: Any, loss_scale: float) -> list[Any]:
        losses = mlp_forward(model, loss_scale)
        from dpgraph import scope

        if scope.CurrentDeviceScope().device_id == 1:
            model.net.Copy("relu1", "extra_on_device_1")
        return losses

    model = _every_device_builds(forward, [0, 1, 2, 3])
    outputs = {o for op in model.net.Proto().op for o in op.output}
    assert "cpu_1/extra_on_device_1" in outputs
    assert not {"cpu_2/extra_on_device_1", "cpu_3/extra_on_device_1"} & outputs


def test_scope_dependent_names_build_every_device() -> None:
    """Names that carry the device id outside the name scope are not renamed: no cloning."""
    def forward(model: Any, loss_scale: float) -> list[Any]:
        from dpgraph import scope

        device = scope.CurrentDeviceScope().device_id
        model.net.ConstantFill([], core.BlobReference(f"marker_gpu{device}"), shape=[1])
        return mlp_forward(model, loss_scale)

    model = _every_device_builds(forward, [0, 1, 2])
    outputs = {o for op in model.net.Proto().op for o in op.output}
    assert {"marker_gpu0", "marker_gpu1", "marker_gpu2"} <= outputs


def test_builder_touching_the_workspace_builds_every_device() -> None:
    def forward(model: Any, loss_scale: float) -> list[Any]:
        from dpgraph import scope

        workspace.FeedBlob(scope.CurrentNameScope() + "fed", np.ones(1, np.float32))
        return mlp_forward(model, loss_scale)

    _every_device_builds(forward, [0, 1, 2])
    assert all(workspace.HasBlob(f"cpu_{d}/fed") for d in range(3))


def test_builder_setting_model_attributes_builds_every_device() -> None:
    def forward(model: Any, loss_scale: float) -> list[Any]:
        model.per_device_losses = getattr(model, "per_device_losses", 0) + 1
        return mlp_forward(model, loss_scale)

    model = _every_device_builds(forward, [0, 1, 2])
    assert model.per_device_losses == 3


def test_python_ops_build_every_device() -> None:
    def forward(model: Any, loss_scale: float) -> list[Any]:
        hidden = brew.fc(model, "data", "fc1", 6, 3)
        doubled = model.net.Python(lambda i, o: o[0].feed(2 * i[0].data))([hidden], ["dbl"])
        dist = model.net.SquaredL2Distance([doubled, "label"], "dist")
        return [model.net.Scale(model.net.AveragedLoss(dist, "loss"), "ls", scale=loss_scale)]

    model = _every_device_builds(forward, [0, 1, 2])
    tokens = [a.s for op in model.net.Proto().op if op.type == "Python" for a in op.arg
              if a.name == "token"]
    assert len(set(tokens)) == 3  # one registered function per device, as Caffe2 makes


def test_unscoped_shared_inputs_are_declared_once() -> None:
    def forward(model: Any, loss_scale: float) -> list[Any]:
        losses = mlp_forward(model, loss_scale)
        model.net.Add([losses[0], core.BlobReference("global_offset")], "offset_loss",
                      broadcast=1)
        return losses

    counted, scopes = _counting(forward)
    model = build([0, 1, 2, 3], forward=counted)
    assert len(scopes) == 2
    inputs = list(model.net.Proto().external_input)
    assert inputs.count("global_offset") == 1
    assert inputs.index("global_offset") < inputs.index("cpu_1/data")


def test_gradient_of_a_blob_every_device_reads_is_not_cloned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An unscoped blob read by every device gets one gradient summed over the devices:
    the backward pass is not per device, so it runs whole."""
    def forward(model: Any, loss_scale: float) -> list[Any]:
        losses = mlp_forward(model, loss_scale)
        scaled = model.net.Mul([losses[0], core.BlobReference("global_scale")], "scaled",
                               broadcast=1)
        return [scaled]

    states = []
    for clone_from in (replicate.CLONE_MIN_DEVICES, 10**6):
        monkeypatch.setattr(replicate, "CLONE_MIN_DEVICES", clone_from)
        with clean_state():
            model = build([0, 1, 2], forward=forward)
            states.append(_state(model))
    assert states[0] == states[1]
    sums = [op for op in model.net.Proto().op if op.output[0].startswith("global_scale_grad")]
    assert sums  # accumulated over the devices


def test_cloned_params_are_shared_objects_like_built_ones() -> None:
    model = build([0, 1, 2])
    weights = {str(w): w for w in model.weights}
    for param in model.params:
        if str(param) in weights:
            assert weights[str(param)] is param
    info = model._parameters_info["cpu_2/fc1_w"]
    assert info.blob is model.params[model.params.index("cpu_2/fc1_w")]
    assert info.blob.Net() is model.param_init_net


def test_clone_failure_restores_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpgraph.parallel import clone

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("replay failed")

    model = model_helper.ModelHelper(name="restore")
    before = model.net.Proto().SerializeToString()
    monkeypatch.setattr(clone, "apply", broken)
    with pytest.raises(RuntimeError, match="replay failed"):
        _build_into(model, [0, 1, 2])
    assert model.net.Proto().SerializeToString() == before
    assert model.params == []


def _build_into(model: Any, devices: list[int]) -> None:
    from _dpm_updates import manual_sgd

    from dpgraph import data_parallel_model

    data_parallel_model.Parallelize(model, lambda m: None, mlp_forward,
                                    param_update_builder_fun=manual_sgd, devices=devices,
                                    cpu_device=True)


def test_renamer_moves_scoped_names_split_gradients_control_inputs_and_devices() -> None:
    from dpgraph.parallel.clone import Renamer, plans_of
    from dpgraph.proto import caffe2_pb2

    renamer = Renamer("gpu", 0, 12, caffe2_pb2.CUDA)
    assert renamer.name("gpu_0/fc_w") == "gpu_12/fc_w"
    assert renamer.name("_gpu_0/relu_grad_autosplit_0") == "_gpu_12/relu_grad_autosplit_0"
    assert renamer.name("gpu_01/x") == "gpu_01/x" and renamer.name("ONE") == "ONE"
    summed = caffe2_pb2.OperatorDef(type="Sum", input=["gpu_0/a", "ONE"], output=["gpu_0/a"],
                                    control_input=["gpu_0/c"])
    summed.device_option.device_type = caffe2_pb2.CUDA
    summed.device_option.device_id = 0
    summed.device_option.extra_info.append("is_auto_gen_sum_ops:1")
    pinned = caffe2_pb2.OperatorDef(type="Copy", input=["gpu_0/a"], output=["cpu_0/a"])
    pinned.device_option.device_type = caffe2_pb2.CPU
    pinned.device_option.device_id = 0
    targets = [caffe2_pb2.OperatorDef(), caffe2_pb2.OperatorDef()]
    renamer.ops_into(plans_of([summed, pinned], renamer.first_option), targets)
    moved, kept = targets
    assert (list(moved.input), list(moved.output), list(moved.control_input)) == (
        ["gpu_12/a", "ONE"], ["gpu_12/a"], ["gpu_12/c"])
    assert moved.device_option.device_id == 12
    assert list(moved.device_option.extra_info) == ["is_auto_gen_sum_ops:1"]
    assert kept.device_option.device_type == caffe2_pb2.CPU  # another device: not moved
    assert kept.device_option.device_id == 0 and list(kept.output) == ["cpu_0/a"]
