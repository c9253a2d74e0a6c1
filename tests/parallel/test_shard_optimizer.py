"""Sharded optimizer state: ``Parallelize(..., shard_optimizer_state=True)``.

Each parameter's update (and its optimizer state) lives on one owner device; the gradient is
summed onto the owner and the updated parameter copied back.  On CPU devices the owner's sum
is the one Caffe2's all-reduce computed (same input order) and the update is the same
arithmetic, so the parameters equal the unsharded run bitwise; on virtual GPUs too (the
pairwise tree order is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from _dpm_updates import manual_sgd
from _parallel_helpers import _set_params, bn_forward, feed_batch, mlp_forward, sparse_forward

from dpgraph import core, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.errors import NotSupportedError, ParallelizeError
from dpgraph.modeling.optimizer.base import reset_optimizer_instance_count
from dpgraph.parallel.shard import assign_owners

ITERS = 10


def _optimizer(kind: str) -> Callable[[Any], Any]:
    def build(model: Any) -> Any:
        if kind == "momentum":
            return optimizer.build_sgd(model, 0.1, momentum=0.9, nesterov=False)
        if kind == "adam":
            return optimizer.build_adam(model, 0.01)
        if kind == "adagrad":
            return optimizer.build_adagrad(model, 0.1)
        if kind == "rmsprop":
            return optimizer.build_rms_prop(model, 0.01, decay=0.9, momentum=0.5)
        if kind == "weight_decay":
            optimizer.add_weight_decay(model, 1e-2)
            return optimizer.build_sgd(model, 0.1, momentum=0.9, nesterov=True)
        if kind == "lars":  # one lr temporary reused for every param
            return optimizer.build_sgd(model, 0.1, momentum=0.9, lars=0.5)
        if kind == "clip":
            return optimizer.build_sgd(model, 0.1, max_gradient_norm=1.0)
        raise ValueError(kind)
    return build


def build(devices: Sequence[int], update: str = "momentum", gpu: bool = False,
          shard: bool = True, forward: Any = mlp_forward, **kwargs: Any) -> Any:
    workspace.ResetWorkspace()
    if gpu:
        workspace.SetVirtualGpus(max(devices) + 1)
    model = model_helper.ModelHelper(name="shard")
    if update == "manual":
        kwargs["param_update_builder_fun"] = manual_sgd
    else:
        kwargs["optimizer_builder_fun"] = _optimizer(update)
    data_parallel_model.Parallelize(model, lambda m: None, forward, devices=list(devices),
                                    cpu_device=not gpu, shard_optimizer_state=shard, **kwargs)
    return model


def run(devices: Sequence[int], update: str = "momentum", gpu: bool = False,
        shard: bool = True, iters: int = ITERS, **kwargs: Any
        ) -> tuple[Any, dict[str, dict[str, np.ndarray]]]:
    """Train ``iters`` steps on one fixed batch; every device's params by stripped name."""
    model = build(devices, update, gpu, shard, **kwargs)
    feed_batch(model, devices, gpu)
    data_parallel_model.RunInitNet(model)
    _set_params(model, devices, gpu)
    for _ in range(iters):
        feed_batch(model, devices, gpu)
        data_parallel_model.RunNet(model, 1)
    return model, params_by_device(model, devices)


def params_by_device(model: Any, devices: Sequence[int]) -> dict[str, dict[str, np.ndarray]]:
    result = {}
    for device in devices:
        prefix = f"{model._device_prefix}_{device}/"
        result[prefix] = {str(p)[len(prefix):]: workspace.FetchBlob(str(p))
                          for p in model.GetParams(prefix)}
    return result


def assert_equal_runs(ref: dict[str, dict[str, np.ndarray]],
                      got: dict[str, dict[str, np.ndarray]], bitwise: bool) -> None:
    assert sorted(ref) == sorted(got)
    for device in ref:
        for name, value in ref[device].items():
            if bitwise:
                np.testing.assert_array_equal(got[device][name], value, err_msg=name)
            else:
                np.testing.assert_allclose(got[device][name], value, rtol=0, atol=1e-6,
                                           err_msg=name)


# --- numbers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("devices,gpu", [([0, 1], False), ([0, 1, 2], False),
                                         ([0, 1, 2, 3], False), ([0, 1, 2, 3], True)])
@pytest.mark.parametrize("update", ["momentum", "adam"])
def test_equal_to_unsharded_run(devices: list[int], gpu: bool, update: str) -> None:
    _, ref = run(devices, update, gpu, shard=False)
    _, got = run(devices, update, gpu, shard=True)
    assert_equal_runs(ref, got, bitwise=True)


@pytest.mark.parametrize("update", ["adagrad", "rmsprop", "weight_decay", "lars", "manual"])
def test_other_updates_equal_to_unsharded(update: str) -> None:
    _, ref = run([0, 1, 2], update, shard=False, iters=4)
    _, got = run([0, 1, 2], update, shard=True, iters=4)
    assert_equal_runs(ref, got, bitwise=True)


@pytest.mark.parametrize("extra,gpu", [
    ({"gradient_bucket_mb": 0.0001}, False),
    ({"gradient_bucket_mb": 0.0001}, True),
    ({"use_nccl": True}, True),
    ({"accumulate_steps": 2}, False),
    ({"gradient_dtype": "float16"}, False),
    ({"optimize_gradient_memory": True}, False),
    ({"dynamic_memory_management": True}, False),
    ({"forward": bn_forward, "combine_spatial_bn": True}, True),
])
def test_combinations_equal_to_unsharded(extra: dict[str, Any], gpu: bool) -> None:
    devices = [0, 1, 2, 3]
    _, ref = run(devices, "adam", gpu, shard=False, iters=4, **extra)
    _, got = run(devices, "adam", gpu, shard=True, iters=4, **extra)
    assert_equal_runs(ref, got, bitwise="gradient_dtype" not in extra)


def test_sparse_gradients_keep_the_replicated_update() -> None:
    _, ref = run([0, 1], "momentum", True, shard=False, iters=3, forward=sparse_forward)
    model, got = run([0, 1], "momentum", True, shard=True, iters=3, forward=sparse_forward)
    assert_equal_runs(ref, got, bitwise=True)
    assert "emb" not in model._shard_plan.owner and "fc_w" in model._shard_plan.owner


# --- memory: each device holds its shard of the state ------------------------------------------
STATE_SUFFIXES = {"momentum": ("_momentum",), "adam": ("_first_moment", "_second_moment")}


@pytest.mark.parametrize("update", ["momentum", "adam"])
def test_each_device_holds_only_its_shard_of_state(update: str) -> None:
    devices = [0, 1, 2, 3]
    model, _ = run(devices, update, iters=1)
    plan = model._shard_plan
    blobs = set(workspace.Blobs())
    suffixes = STATE_SUFFIXES[update]
    for device in devices:
        prefix = f"cpu_{device}/"
        held = sorted(b[len(prefix):] for b in blobs
                      if b.startswith(prefix) and b.endswith(suffixes))
        owned = sorted(p + s for p, r in plan.owner.items() if plan.device_of(r) == device
                       for s in suffixes)
        assert held == owned, device
    assert set(plan.state) == {p + s for p in plan.owner for s in suffixes}
    assert sum(plan.rank_bytes()) == sum(plan.nbytes.values())


def test_unsharded_keeps_full_state_everywhere() -> None:
    model, _ = run([0, 1], "momentum", shard=False, iters=1)
    assert not hasattr(model, "_shard_plan")
    for device in (0, 1):
        assert workspace.HasBlob(f"cpu_{device}/fc1_w_momentum")


# --- structure -----------------------------------------------------------------------------------
def test_assignment_is_deterministic_and_balanced() -> None:
    sizes = [(f"p{i}", (i * 7919) % 1000 + 1) for i in range(200)]
    owners = assign_owners(sizes, 8)
    assert owners == assign_owners(list(reversed(sizes)), 8)
    loads = [sum(n for p, n in sizes if owners[p] == r) for r in range(8)]
    assert max(loads) <= 1.01 * sum(loads) / 8
    assert assign_owners([("a", 4), ("b", 4), ("c", 8)], 2) == {"c": 0, "a": 1, "b": 1}


def test_graph_structure_on_cpu() -> None:
    model = build([0, 1, 2], "momentum")
    plan = model._shard_plan
    ops = list(model.net.Proto().op)
    updates = [op for op in ops if op.type == "MomentumSGDUpdate"]
    assert len(updates) == len(plan.owner)  # one per param, not per device
    for op in updates:
        param = op.input[3]
        name = param.split("/", 1)[1]
        assert param == f"cpu_{plan.device_of(plan.owner[name])}/{name}"
    sums = [op for op in ops if op.type == "Sum" and op.name == "dpm"]
    for op in sums:  # the gradient copies, summed onto the owner only (no Copy of grads)
        name = op.output[0].split("/", 1)[1]
        owner = plan.device_of(plan.owner[plan.grads[name]])
        assert list(op.input) == [f"cpu_{d}/{name}" for d in (0, 1, 2)]
        assert op.output[0] == f"cpu_{owner}/{name}"
    copies = [op for op in ops if op.type == "Copy"]
    assert not [op for op in copies if op.output[0].endswith("_grad")]
    # every param comes back from its owner to the two other devices, after its update
    assert sorted((op.input[0], op.output[0]) for op in copies) == sorted(
        (f"cpu_{plan.device_of(r)}/{p}", f"cpu_{d}/{p}") for p, r in plan.owner.items()
        for d in (0, 1, 2) if d != plan.device_of(r))
    # state init ops exist only for the owner; the shared iteration counter stays
    init = [op for op in model.param_init_net.Proto().op if op.output[0].endswith("_momentum")]
    assert sorted(op.output[0] for op in init) == sorted(
        f"cpu_{plan.device_of(r)}/{p}_momentum" for p, r in plan.owner.items())
    assert [op.type for op in ops].count("AtomicIter") == 1


def test_graph_structure_on_gpus_with_nccl() -> None:
    model = build([0, 1, 2, 3], "adam", gpu=True, use_nccl=True)
    plan = model._shard_plan
    ops = list(model.net.Proto().op)
    reduces = [op for op in ops if op.type == "NCCLReduce"]
    assert len(reduces) == len(plan.grads)
    for op in reduces:
        owner = plan.device_of(plan.owner[plan.grads[op.output[0].split("/", 1)[1]]])
        assert op.output[0] == op.input[owner] == f"gpu_{owner}/" + op.output[0].split("/", 1)[1]
        assert op.device_option.device_id == owner
    assert len([op for op in ops if op.type == "NCCLBroadcast"]) == len(plan.owner)
    assert not [op for op in ops if op.type == "NCCLAllreduce"]
    lrs = {op.output[0] for op in ops if op.type == "LearningRate"}
    assert sorted(lr.rsplit("_", 1)[1] for lr in lrs) == [f"gpu{d}" for d in range(4)]


def test_graph_structure_across_hosts() -> None:
    """Rank 1 of 2 hosts x 2 devices (built, not run): one Reduce per gradient to the
    owner's host, updates and state only for this host's params, one Broadcast per param
    from the owner's host with the owner's copy first."""
    rdv = {"kv_handler": "store", "shard_id": 1, "num_shards": 2, "engine": "GLOO"}
    model = build([0, 1], "momentum", rendezvous=rdv)
    plan = model._shard_plan
    assert plan.ranks == 4 and plan.host == 1
    ops = list(model.net.Proto().op)
    reduces = [op for op in ops if op.type == "Reduce"]
    assert sorted(op.name for op in reduces) == sorted(plan.grads)
    assert not [op for op in ops if op.type == "Allreduce"]
    for op in reduces:
        root = [a.i for a in op.arg if a.name == "root"]
        assert root == [plan.host_of(plan.owner[plan.grads[op.name]])]
        assert op.input[0].startswith("shard_reduce_") and list(op.input[1:]) == [
            f"cpu_0/{op.name}", f"cpu_1/{op.name}"]
    mine = {p for p, r in plan.owner.items() if plan.host_of(r) == 1}
    updates = [op.input[3] for op in ops if op.type == "MomentumSGDUpdate"]
    assert sorted(updates) == sorted(f"cpu_{plan.local_owner(p)}/{p}" for p in mine)
    broadcasts = [op for op in ops if op.type == "Broadcast"]
    assert [op.name for op in broadcasts] == sorted(plan.owner)
    for op in broadcasts:
        rank = plan.owner[op.name]
        assert [a.i for a in op.arg if a.name == "root"] == [plan.host_of(rank)]
        assert op.input[1] == f"cpu_{plan.device_of(rank)}/{op.name}"
    init = [op.output[0] for op in model.param_init_net.Proto().op
            if op.output and op.output[0].endswith("_momentum")]
    assert sorted(init) == sorted(f"cpu_{plan.local_owner(p)}/{p}_momentum" for p in mine)


def test_buckets_hold_one_owners_gradients() -> None:
    model = build([0, 1], "momentum", gradient_bucket_mb=1)
    plan = model._shard_plan
    owners = [{plan.owner[plan.grads[g]] for g in bucket} for bucket in model._gradient_buckets]
    assert all(len(o) == 1 for o in owners) and len(owners) == len(set(plan.owner.values()))


def test_default_keeps_caffe2s_graph() -> None:
    """shard_optimizer_state=False adds nothing (test_snapshots.py pins Caffe2's bytes)."""
    def ops(shard: bool | None) -> list[Any]:
        reset_optimizer_instance_count()
        workspace.ResetWorkspace()
        model = model_helper.ModelHelper(name="shard")
        extra = {} if shard is None else {"shard_optimizer_state": shard}
        data_parallel_model.Parallelize(model, lambda m: None, mlp_forward, devices=[0, 1],
                                        cpu_device=True,
                                        optimizer_builder_fun=_optimizer("momentum"), **extra)
        assert not hasattr(model, "_shard_plan")
        return [list(net.Proto().op) for net in (model.net, model.param_init_net)]

    assert ops(False) == ops(None)


# --- lifecycle -----------------------------------------------------------------------------------
def test_checkpoint_params_are_complete_and_device_count_independent() -> None:
    model, _ = run([0, 1, 2, 3], "adam", iters=2)
    names = {str(b) for b in data_parallel_model.GetCheckpointParams(model)}
    params = {f"cpu_0/{p}" for p in model._shard_plan.owner}
    state = {f"cpu_0/{s}" for s in model._shard_plan.state}
    assert params | state <= names and "optimizer_iteration" in names
    for name in state:  # gathered onto the master under Caffe2's names
        stripped = name.split("/", 1)[1]
        owner = model._shard_plan.device_of(model._shard_plan.owner[model._shard_plan.state[
            stripped]])
        np.testing.assert_array_equal(workspace.FetchBlob(name),
                                      workspace.FetchBlob(f"cpu_{owner}/{stripped}"))
    # the next RunNet releases the gathered copies again
    feed_batch(model, [0, 1, 2, 3], False)
    data_parallel_model.RunNet(model, 1)
    plan = model._shard_plan
    assert not [n for n in state if plan.device_of(plan.owner[plan.state[n[6:]]]) != 0
                and workspace.HasBlob(n)]


def _checkpoint_run(devices: Sequence[int], path: str | None, load: str | None,
                    iters: int, first_step: int = 0, gpu: bool = False
                    ) -> dict[str, dict[str, np.ndarray]]:
    from dpgraph.checkpoint import load_model_checkpoint, read_checkpoint, save_model_checkpoint

    model = build(devices, "adam", gpu)
    feed_batch(model, devices, gpu)
    data_parallel_model.RunInitNet(model)
    _set_params(model, devices, gpu)
    if load is not None:
        load_model_checkpoint(model, load)
        saved = read_checkpoint(load)
        plan = model._shard_plan
        for name, param in plan.state.items():  # each owner holds the saved state
            owner = plan.blob(plan.device_of(plan.owner[param]), name)
            master = f"{model._device_prefix}_0/{name}"
            np.testing.assert_array_equal(workspace.FetchBlob(owner), saved[master])
            assert saved[master].any(), name
    for step in range(first_step, first_step + iters):
        feed_batch(model, devices, gpu, seed=step)
        data_parallel_model.RunNet(model, 1)
    if path is not None:
        save_model_checkpoint(model, path)
    return params_by_device(model, devices)


@pytest.mark.parametrize("gpu", [False, True])
def test_save_on_four_resume_on_two_equals_uninterrupted(tmp_path: Any, gpu: bool) -> None:
    ref = _checkpoint_run([0, 1], None, None, 6, gpu=gpu)
    path = str(tmp_path / "ckpt.pb")
    _checkpoint_run([0, 1, 2, 3], path, None, 3, gpu=gpu)
    got = _checkpoint_run([0, 1], None, path, 3, first_step=3, gpu=gpu)
    assert_equal_runs(ref, got, bitwise=False)
    # resumed state is sharded again: each device keeps only what it owns
    held = {n for n in workspace.Blobs() if n.endswith("_moment")}
    plan = build([0, 1], "adam", gpu)._shard_plan
    assert held == {plan.blob(plan.device_of(plan.owner[p]), s) for s, p in plan.state.items()}


def test_predictor_export_sees_complete_params() -> None:
    from dpgraph.parallel.predictor import ExtractPredictorNet

    model, got = run([0, 1, 2], "adam", iters=3)
    _, ref = run([0, 1, 2], "adam", shard=False, iters=3)
    for device in got:  # every device holds every updated param
        for name, value in ref["cpu_0/"].items():
            np.testing.assert_array_equal(got[device][name], value)
    predict, blobs = ExtractPredictorNet(model, ["data"], ["fc2"], device=core.DeviceOption(
        0, 0))
    assert {str(b) for b in blobs} >= {f"cpu_0/{p}" for p in model._shard_plan.owner}


# --- bad input -----------------------------------------------------------------------------------
def _refused(error: type[Exception], match: str, **kwargs: Any) -> None:
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="shard")
    before = (model.net.Proto().SerializeToString(),
              model.param_init_net.Proto().SerializeToString(), sorted(vars(model)))
    with pytest.raises(error, match=match):
        data_parallel_model.Parallelize(model, lambda m: None, mlp_forward, devices=[0, 1],
                                        cpu_device=True, **kwargs)
    assert (model.net.Proto().SerializeToString(),
            model.param_init_net.Proto().SerializeToString(), sorted(vars(model))) == before


def test_global_norm_clipping_is_refused_and_model_unchanged() -> None:
    _refused(ParallelizeError, "touches several parameters.*max_gradient_norm",
             optimizer_builder_fun=_optimizer("clip"), shard_optimizer_state=True)


def test_update_writing_a_shared_blob_is_refused() -> None:
    def update(model: Any) -> None:
        manual_sgd(model)
        for param in model.GetParams():  # a per-param result into one shared blob
            model.net.Copy(model.param_to_grad[param], "LR")

    _refused(ParallelizeError, "every device shares", param_update_builder_fun=update,
             shard_optimizer_state=True)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"shared_model": True}, NotSupportedError, "shared_model"),
    ({"rendezvous": {"kv_handler": "store", "shard_id": 0, "num_shards": 2,
                     "engine": "NCCL"}}, NotSupportedError, "needs engine='GLOO'"),
    ({"shard_optimizer_state": 1}, ParallelizeError, "must be a bool"),
])
def test_bad_combinations_refused(kwargs: dict[str, Any], error: type[Exception],
                                  match: str) -> None:
    kwargs = {"shard_optimizer_state": True, **kwargs}
    _refused(error, match, param_update_builder_fun=manual_sgd, **kwargs)


def test_forward_only_refused() -> None:
    _refused(ParallelizeError, "needs a training model", shard_optimizer_state=True)


def test_bmuf_refused() -> None:
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="shard")
    with pytest.raises(NotSupportedError, match="BMUF"):
        data_parallel_model.Parallelize_BMUF(model, lambda m: None, mlp_forward, manual_sgd,
                                             devices=[0, 1], cpu_device=True,
                                             shard_optimizer_state=True)
    assert not model.net.Proto().op
