"""The pass driver: contracts, publishing, verification, restore on failure; the
multi-host passes are called directly (no hook registry)."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import pytest
from _parallel_helpers import build, manual_sgd, mlp_forward

from dpgraph import data_parallel_model, model_helper
from dpgraph.errors import VerificationError
from dpgraph.parallel import pipeline
from dpgraph.parallel.config import make_config
from dpgraph.parallel.passes import parallel_pass, run_passes
from dpgraph.parallel.state import ParallelState


def _config(**kwargs):
    kwargs.setdefault("param_update_builder_fun", manual_sgd)
    return make_config(devices=[0, 1], cpu_device=True, input_builder_fun=lambda m: None,
                       forward_pass_builder_fun=mlp_forward, **kwargs)


def _with(extra, where: str = "_reduce_gradients"):
    """The Parallelize pipeline with ``extra`` inserted before the pass ``where``."""
    passes = list(pipeline.passes_for(_config()))
    index = [p.name for p in passes].index(where)
    return passes[:index] + [extra] + passes[index:]


def test_every_parallelize_pass_declares_its_contract() -> None:
    for pass_ in pipeline.BUILD_PASSES + pipeline.TRAINING_PASSES:
        assert pass_.reads or pass_.writes, pass_.name
        assert pass_.run.__doc__ or pass_.writes, pass_.name


def test_added_pass_runs_in_order_and_sees_the_state() -> None:
    seen = []

    @parallel_pass(reads=("grad_names",), writes=("net",))
    def record(state: ParallelState) -> None:
        seen.append(list(state.grad_names))
        state.model.net.Proto().arg.add(name="recorded", i=len(state.grad_names))

    model = model_helper.ModelHelper(name="extra_pass")
    state = run_passes(model, _config(), _with(record))
    assert seen == [["fc1_w_grad", "fc1_b_grad", "fc2_w_grad", "fc2_b_grad"]]
    assert [a.i for a in model.net.Proto().arg if a.name == "recorded"] == [4]
    assert model._grad_names == state.grad_names


def test_disabled_pass_is_skipped() -> None:
    @parallel_pass(writes=("net",), enabled=lambda config: config.use_nccl)
    def never(state: ParallelState) -> None:
        raise AssertionError("must not run on CPU without NCCL")

    run_passes(model_helper.ModelHelper(name="skip"), _config(), _with(never))


def test_undeclared_write_fails_in_debug_mode_and_restores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPGRAPH_DEBUG", raising=False)

    @parallel_pass(reads=("grad_names",), writes=())
    def sneaky(state: ParallelState) -> None:
        state.sync_names = ["extra"]  # harmless: register_blobs_to_sync sets it later

    model = model_helper.ModelHelper(name="sneaky")
    before = model.net.Proto().SerializeToString()
    with pytest.raises(AssertionError, match=r"sneaky changed \['sync_names'\]"):
        run_passes(model, dataclasses.replace(_config(), verify=True), _with(sneaky))
    assert model.net.Proto().SerializeToString() == before
    assert not hasattr(model, "_device_grouped_blobs")
    run_passes(model_helper.ModelHelper(name="lenient"), _config(verify=False), _with(sneaky))


def test_debug_mode_verifies_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    @parallel_pass(writes=("net",))
    def dangling(state: ParallelState) -> None:
        state.model.net.Proto().op.add(type="Relu", input=["nowhere"], output=["x"])

    monkeypatch.setenv("DPGRAPH_DEBUG", "1")
    model = model_helper.ModelHelper(name="dangling")
    with pytest.raises(VerificationError, match="'nowhere' is not an external input"):
        run_passes(model, _config(), _with(dangling))
    assert len(model.net.Proto().op) == 0
    monkeypatch.setenv("DPGRAPH_DEBUG", "0")
    run_passes(model_helper.ModelHelper(name="dangling2"), _config(), _with(dangling))


def test_user_code_passes_see_published_attributes() -> None:
    seen = {}

    def post_sync(model) -> None:
        seen.setdefault("grads", list(model._grad_names))
        seen.setdefault("devices", list(model._devices))

    build([0, 1], post_sync_builder_fun=post_sync)
    assert seen == {"grads": ["fc1_w_grad", "fc1_b_grad", "fc2_w_grad", "fc2_b_grad"],
                    "devices": [0, 1]}


def test_multi_host_passes_are_called_directly() -> None:
    model = model_helper.ModelHelper(name="multi_host")
    rendezvous = {"kv_handler": "store", "shard_id": 1, "num_shards": 2, "engine": "GLOO"}
    data_parallel_model.Parallelize_CPU(model, lambda m: None, mlp_forward,
                                        param_update_builder_fun=manual_sgd, devices=[0, 1],
                                        rendezvous=rendezvous, barrier_net_timeout_sec=42)
    ops = model.net.Proto().op
    allreduce = [op.name for op in ops if op.type == "Allreduce"]
    assert allreduce == ["fc2_b_grad", "fc2_w_grad", "fc1_b_grad", "fc1_w_grad"]
    assert not [op for op in ops if op.type == "Sum"]  # no local path
    broadcasts = [op.name for op in model.param_init_net.Proto().op if op.type == "Broadcast"]
    assert broadcasts == ["ITER", "ONE", "fc1_b", "fc1_w", "fc2_b", "fc2_w"]
    barrier = model._barrier_init_net.Proto().op[0]
    assert [a.i for a in barrier.arg if a.name == "timeout_ms"] == [42000]
    loss_scale = [op for op in ops if op.type == "Scale"][0]
    assert [a.f for a in loss_scale.arg if a.name == "scale"] == [0.25]  # 1/(2 dev * 2 hosts)
    assert model.net.Proto().num_workers == 2 * 4 + 8
    data_parallel_model.AddDistributedBlobSync(model, ["cpu_0/x"])
    assert model.net.Proto().op[-1].type == "Allreduce"
    assert list(model.net.Proto().op[-1].output) == ["cpu_0/x"]


def test_collector_restored_and_build_objects_promoted_without_a_scan() -> None:
    assert gc.isenabled()
    build([0, 1])
    gc.collect()
    build([0, 1, 2, 3])
    assert gc.isenabled()
    # the build's objects went to the oldest generation and the young count restarted at
    # zero (without that: a young collection at the next allocation scans them all and
    # leaves its survivors in generation 1)
    young, middle, _ = gc.get_count()
    assert young < 50 and middle == 0
    assert len(gc.get_objects(0)) < 50 and len(gc.get_objects(1)) < 50
    assert gc.get_freeze_count() == 0


def test_objects_the_program_froze_stay_frozen() -> None:
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        build([0, 1])
        assert gc.isenabled()
        # still frozen (some frozen objects may have been freed meanwhile), none added
        assert frozen - 1000 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_collector_left_off_when_the_program_turned_it_off() -> None:
    gc.disable()
    try:
        build([0, 1])
        assert not gc.isenabled()
    finally:
        gc.enable()


def _traced_build(name: str, shared: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from dpgraph import optimizer
    from dpgraph.ir import net as net_module

    if not shared:  # every stack walked to the outermost frame
        monkeypatch.setattr(net_module.shared_creation_stack, "__enter__",
                            lambda self: setattr(self, "_frame", None))
    model = model_helper.ModelHelper(name=name)
    data_parallel_model.Parallelize(
        model, lambda m: None, mlp_forward, devices=[0, 1, 2], cpu_device=True,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9))
    monkeypatch.undo()
    return [net_module.operator_tracebacks[net.Name()] for net in
            (model.net, model.param_init_net)]


def test_shared_creation_stacks_equal_full_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Builder, backward and optimizer ops record the same stacks with the pass driver's and
    the optimizer's shared roots as with full walks."""
    runs = [_traced_build(f"traced_{shared}", shared, monkeypatch) for shared in (True, False)]
    assert runs[0] == runs[1]
    updates = runs[0][0]
    assert updates and all(len(stack) > 8 for stack in updates.values())
