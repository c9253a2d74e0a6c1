"""Validation errors are typed (ParallelizeError, an AssertionError) and name the culprit;
Parallelize is transactional: on any error the model is exactly as before."""

from __future__ import annotations

import pytest
from _parallel_helpers import manual_sgd, mlp_forward, optimizer_fun

from dpgraph import brew, core, data_parallel_model, model_helper, workspace
from dpgraph.errors import ParallelizeError
from dpgraph.proto import caffe2_pb2


def fingerprint(model) -> dict:
    info = {str(k): (str(v.grad) if v.grad is not None else None)
            for k, v in model._parameters_info.items()}
    return {
        "net": model.net.Proto().SerializeToString(),
        "init": model.param_init_net.Proto().SerializeToString(),
        "attrs": sorted(vars(model)),
        "params": [str(p) for p in model.params],
        "computed": [str(p) for p in model._computed_params],
        "param_to_grad": {str(k): str(v) for k, v in model.param_to_grad.items()},
        "weights": [str(w) for w in model.weights],
        "biases": [str(b) for b in model.biases],
        "info": info,
        "gradient_ops_added": model.gradient_ops_added,
    }


def prepared_model():
    """A model with something in it already (a non-data-parallel param)."""
    model = model_helper.ModelHelper(name="txn")
    brew.fc(model, "shared_in", "shared_fc", 2, 2)
    return model


def run_failing(model, **kwargs):
    kwargs.setdefault("forward_pass_builder_fun", mlp_forward)
    kwargs.setdefault("param_update_builder_fun", manual_sgd)
    before = fingerprint(model)
    net_proto, init_proto = model.net.Proto(), model.param_init_net.Proto()
    params_list = model.params
    with pytest.raises(Exception) as info:
        data_parallel_model.Parallelize(model, lambda m: None, devices=kwargs.pop("devices",
                                        [0, 1]), **kwargs)
    assert fingerprint(model) == before
    assert model.net.Proto() is net_proto and model.param_init_net.Proto() is init_proto
    assert model.params is params_list
    return info.value


def test_device_scope_active() -> None:
    model = prepared_model()
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        error = run_failing(model, cpu_device=True)
    assert isinstance(error, ParallelizeError) and isinstance(error, AssertionError)
    assert "device-scope" in str(error) and "gpu_1" in str(error)


def test_cpu_device_scope_is_allowed() -> None:
    model = model_helper.ModelHelper(name="txn_ok")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
        data_parallel_model.Parallelize_CPU(model, lambda m: None, mlp_forward,
                                            param_update_builder_fun=manual_sgd,
                                            devices=[0, 1])
    assert model._devices == [0, 1]


def test_both_update_builders() -> None:
    error = run_failing(prepared_model(), cpu_device=True,
                        optimizer_builder_fun=lambda m: None)
    assert isinstance(error, ParallelizeError)
    assert "param_update_builder_fun" in str(error)


@pytest.mark.parametrize("bad", ["blob", "strings"])
def test_losses_not_a_list_of_blobs(bad: str) -> None:
    def forward(model, loss_scale):
        losses = mlp_forward(model, loss_scale)
        return losses[0] if bad == "blob" else [str(losses[0])]

    error = run_failing(prepared_model(), cpu_device=True, forward_pass_builder_fun=forward)
    assert isinstance(error, ParallelizeError)
    assert "list of loss blobs" in str(error) and "device 0" in str(error)


def test_duplicate_params() -> None:
    def forward(model, loss_scale):
        losses = mlp_forward(model, loss_scale)
        model.params.append(model.params[-1])
        return losses

    error = run_failing(prepared_model(), cpu_device=True, forward_pass_builder_fun=forward)
    assert isinstance(error, ParallelizeError)
    assert "Duplicate entries in params" in str(error) and "cpu_0/fc2_b" in str(error)


def test_param_missing_from_init_net() -> None:
    def forward(model, loss_scale):
        losses = mlp_forward(model, loss_scale)
        model.AddParameter(core.ScopedBlobReference("orphan"))
        return losses

    error = run_failing(prepared_model(), cpu_device=True, forward_pass_builder_fun=forward,
                        param_update_builder_fun=None, optimizer_builder_fun=optimizer_fun("sgd"))
    assert isinstance(error, ParallelizeError)
    assert "Some params not instantiated in param init net" in str(error)
    assert "orphan" in str(error)


def test_op_touching_another_devices_blob() -> None:
    workspace.SetVirtualGpus(2)

    def forward(model, loss_scale):
        losses = mlp_forward(model, loss_scale)
        if core.ScopedName("x") == "gpu_1/x":
            model.net.Relu(core.BlobReference("gpu_0/relu1"), "stolen")
        return losses

    error = run_failing(prepared_model(), forward_pass_builder_fun=forward)
    assert isinstance(error, ParallelizeError)
    assert "gpu_0/relu1" in str(error) and "Relu" in str(error) and "gpu_1/" in str(error)


def test_error_inside_optimizer_builder_restores_everything() -> None:
    def optimizer(model):
        model.param_init_net.ConstantFill([], "half_built", shape=[1], value=1.0)
        model.net.Copy(model.param_to_grad[model.params[-1]], "half_built_copy")
        raise RuntimeError("boom")

    model = prepared_model()
    error = run_failing(model, cpu_device=True, param_update_builder_fun=None,
                        optimizer_builder_fun=optimizer)
    assert str(error) == "boom"
    # the model still works afterwards
    data_parallel_model.Parallelize_CPU(model, lambda m: None, mlp_forward,
                                        param_update_builder_fun=manual_sgd, devices=[0, 1])
    assert model._grad_names[-1] == "fc2_b_grad"


def test_error_in_net_transformer_after_gradients() -> None:
    def transformer(model, *args):
        raise ValueError("no")

    error = run_failing(prepared_model(), cpu_device=True, net_transformer_fun=transformer)
    assert isinstance(error, ValueError)


def test_shared_model_on_gpu_refused() -> None:
    error = run_failing(prepared_model(), shared_model=True)
    assert isinstance(error, ParallelizeError) and "CPU" in str(error)


def test_sparse_gradient_on_cpu() -> None:
    from _parallel_helpers import sparse_forward

    error = run_failing(prepared_model(), cpu_device=True, forward_pass_builder_fun=sparse_forward)
    assert isinstance(error, AssertionError)
    assert "Synchronizing gradient slices not supported" in str(error)


def test_memory_flags_together_refused() -> None:
    error = run_failing(prepared_model(), cpu_device=True, optimize_gradient_memory=True,
                        dynamic_memory_management=True)
    assert isinstance(error, ParallelizeError) and "memonger" in str(error)


def test_single_shard_rendezvous_is_single_host() -> None:
    model = model_helper.ModelHelper(name="one_shard")
    rendezvous = {"kv_handler": None, "shard_id": 0, "num_shards": 1, "engine": "GLOO"}
    data_parallel_model.Parallelize_CPU(model, lambda m: None, mlp_forward,
                                        param_update_builder_fun=manual_sgd, devices=[0, 1],
                                        rendezvous=rendezvous)
    assert model._rendezvous is rendezvous
    assert model.net.Proto().num_workers == 2 * 4 + 8


def test_init_blob_scoped_twice_is_a_typed_error() -> None:
    """str(param) + '_momentum' under the device NameScope names 'cpu_1/cpu_1/...': there is
    no per-device group to broadcast (Caffe2 raised a KeyError here)."""
    def update(model):
        manual_sgd(model)
        for param in model.GetParams():
            model.param_init_net.ConstantFill([param], str(param) + "_momentum", value=0.0)

    error = run_failing(prepared_model(), cpu_device=True, param_update_builder_fun=update)
    assert isinstance(error, ParallelizeError)
    assert "cpu_0/cpu_0/" in str(error) and "device 1" in str(error)
    assert "param + '_suffix'" in str(error)
