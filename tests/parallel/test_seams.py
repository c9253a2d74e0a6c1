"""The multi-host seam: with num_shards > 1, Parallelize hands the cross-host passes to the
registered DistributedHooks (one place), and nothing else changes."""

from __future__ import annotations

import pytest
from _parallel_helpers import manual_sgd, mlp_forward

from dpgraph import data_parallel_model, model_helper
from dpgraph.parallel import distributed


class RecordingHooks:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def allreduce(self, state, blob_names, net) -> None:
        self.calls.append(("allreduce", tuple(blob_names), net is state.model.net))

    def broadcast_computed_params(self, state) -> None:
        self.calls.append(("broadcast_computed_params",))

    def sync_params(self, state, init_net, net, names, max_concurrent_distributed_ops) -> None:
        self.calls.append(("sync_params", tuple(names), max_concurrent_distributed_ops))

    def add_barrier(self, state, timeout_sec) -> None:
        self.calls.append(("add_barrier", timeout_sec))

    def add_blob_sync(self, model, blobs) -> None:
        self.calls.append(("add_blob_sync", tuple(blobs)))

    def synchronize(self, model, timeout_sec) -> None:
        self.calls.append(("synchronize", timeout_sec))


@pytest.fixture
def hooks(monkeypatch):
    recording = RecordingHooks()
    monkeypatch.setattr(distributed, "_HOOKS", [recording])
    return recording


def test_multi_host_passes_go_through_the_hooks(hooks) -> None:
    model = model_helper.ModelHelper(name="multi_host")
    rendezvous = {"kv_handler": "store", "shard_id": 1, "num_shards": 2, "engine": "GLOO"}
    data_parallel_model.Parallelize_CPU(model, lambda m: None, mlp_forward,
                                        param_update_builder_fun=manual_sgd, devices=[0, 1],
                                        rendezvous=rendezvous, barrier_net_timeout_sec=42)
    assert hooks.calls == [
        ("broadcast_computed_params",),
        ("allreduce", ("fc2_b_grad", "fc2_w_grad", "fc1_b_grad", "fc1_w_grad"), True),
        ("sync_params", ("ITER", "ONE", "fc1_b", "fc1_w", "fc2_b", "fc2_w"), 1),
        ("add_barrier", 42),
    ]
    loss_scale = [op for op in model.net.Proto().op if op.type == "Scale"][0]
    assert [a.f for a in loss_scale.arg if a.name == "scale"] == [0.25]  # 1/(2 dev * 2 hosts)
    assert model.net.Proto().num_workers == 2 * 4 + 8
    assert not [op for op in model.net.Proto().op if op.type == "Sum"]  # no local path
    data_parallel_model.AddDistributedBlobSync(model, ["cpu_0/x"])
    with pytest.warns(DeprecationWarning, match="deprecated"):
        data_parallel_model.Synchronize(model, timeout_sec=7)
    assert hooks.calls[-2:] == [("add_blob_sync", ("cpu_0/x",)), ("synchronize", 7)]
