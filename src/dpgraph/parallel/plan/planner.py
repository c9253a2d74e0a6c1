"""Predict data-parallel step times and choose gradient bucket sizes.

The simulation: a worker runs its forward pass, then its backward pass; each bucket (a
single gradient in the per-blob graph) becomes ready when its last gradient exists and is
reduced on one communication channel, in readiness order, as soon as the previous one is
done.  A collective that starts while the backward pass still runs takes the backend's
contention term (its CPU time on shared cores) from the compute, which moves the rest of the
backward pass later.  The step ends when both the backward pass and the last collective are
done::

    step = max(compute + contention, finish of the last collective)
    communication share = exposed communication / step, efficiency = compute / step
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dpgraph.parallel.buckets import GradInfo, assign_buckets
from dpgraph.parallel.plan.cost_model import CostModel, load
from dpgraph.parallel.plan.profile import StepProfile

MB = 1 << 20
MIN_BUCKET_BYTES = 256 << 10


@dataclass(frozen=True)
class Prediction:
    workers: int
    bucket_mb: float | None  # None: per blob
    collectives: int
    compute_s: float
    comm_s: float  # sum of collective times
    step_s: float
    contention_s: float = 0.0  # compute time lost to collectives overlapping it

    @property
    def exposed_s(self) -> float:
        return self.step_s - self.compute_s

    @property
    def comm_share(self) -> float:
        return self.exposed_s / self.step_s if self.step_s else 0.0

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s if self.step_s else 1.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exposed_s": self.exposed_s, "comm_share": self.comm_share,
                "efficiency": self.efficiency}


def bucket_sizes(sizes: Sequence[int], bucket_bytes: float | None,
                 writers: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """``(last gradient index, bytes)`` per bucket of gradients in production order: what
    :func:`dpgraph.parallel.buckets.assign_buckets` packs for one dtype (with ``writers``,
    the gradients one op writes are one unit, as ``"auto"`` packs them; -1 joins nothing)."""
    if bucket_bytes is None:
        return [(i, n) for i, n in enumerate(sizes)]
    ops = writers if writers is not None else [-1] * len(sizes)
    grads = [GradInfo(f"{i:08d}", n, "float32", i, op=op)
             for i, (n, op) in enumerate(zip(sizes, ops))]
    return [(bucket.grads[-1].order, sum(g.nbytes for g in bucket.grads))
            for bucket in assign_buckets(grads, bucket_bytes, join_same_op=writers is not None)]


def collective_time(model: CostModel, backend: str, nbytes: float, workers: int,
                    local_devices: int) -> float:
    """One bucket: reduce over local devices, then all-reduce across workers."""
    local = model.backend("local").local_reduce(nbytes, local_devices)
    return local + model.backend(backend).allreduce(nbytes, workers)


def predict(profile: StepProfile, model: CostModel, workers: int,
            bucket_bytes: float | None, backend: str = "gloo", local_devices: int = 1,
            compute_s: float | None = None, join_same_op: bool = False) -> Prediction:
    """The predicted step of one worker (``compute_s`` overrides the FLOP-based compute
    time, e.g. with a measured one-worker step; the gradient timeline is scaled to it;
    ``join_same_op``: one op's gradients share a bucket, as ``"auto"`` packs them)."""
    total_flops = profile.forward_flops + profile.backward_flops
    compute = compute_s if compute_s is not None else total_flops / model.flops_per_sec
    scale = compute / total_flops if total_flops else 0.0
    backward_start = profile.forward_flops * scale
    buckets = bucket_sizes([g.nbytes for g in profile.grads], bucket_bytes,
                           [g.op for g in profile.grads] if join_same_op else None)
    figures = model.backend(backend)
    channel, comm, stolen = 0.0, 0.0, 0.0
    for last, nbytes in buckets:
        ready = backward_start + profile.grads[last].ready_flops * scale + stolen
        cost = collective_time(model, backend, nbytes, workers, local_devices)
        start = max(channel, ready)
        channel = start + cost
        comm += cost
        if start < compute + stolen:  # overlaps the rest of the backward pass
            stolen += figures.contention(nbytes, workers)
    step = (max(compute + stolen, channel) if (workers > 1 or local_devices > 1)
            else compute)
    mb = None if bucket_bytes is None else bucket_bytes / MB
    return Prediction(workers, mb, len(buckets), compute, comm, step, stolen)


def best_bucket_bytes(profile: StepProfile, model: CostModel, workers: int,
                      backend: str = "gloo", local_devices: int = 1,
                      compute_s: float | None = None) -> float:
    """The bucket size (from 256 KB to all gradients, in steps of 2^(1/4)) with the
    shortest predicted step; among sizes within 0.2% of it, the one with the least total
    collective time (fewer, larger collectives cost less CPU)."""
    total = max(profile.grad_bytes, MIN_BUCKET_BYTES)
    candidates: list[tuple[float, float, float]] = []
    size = float(MIN_BUCKET_BYTES)
    while size <= total * 1.19:
        guess = predict(profile, model, workers, size, backend, local_devices, compute_s,
                        join_same_op=True)
        candidates.append((guess.step_s, guess.comm_s, size))
        size *= 2 ** 0.25
    best_step = min(step for step, _, _ in candidates)
    near = [c for c in candidates if c[0] <= best_step * 1.002]
    return min(near, key=lambda c: (c[1], c[2]))[2]


def sqrt_rule_bytes(total_bytes: float, model: CostModel, backend: str, workers: int,
                    local_devices: int) -> float:
    """Bucket size without a compute timeline: ``k`` buckets cost ``k * a + B * b`` of
    exposed time (latency and contention of every collective plus the last bucket, which
    cannot overlap), minimal at ``B = sqrt(N a / b)``."""
    latency = collective_time(model, backend, 0.0, workers, local_devices)
    beta = collective_time(model, backend, 1.0, workers, local_devices) - latency
    alpha = latency + model.backend(backend).contention(0.0, workers)
    if alpha <= 0 or beta <= 0 or total_bytes <= 0:
        return max(total_bytes, MIN_BUCKET_BYTES)
    best = math.sqrt(total_bytes * alpha / beta)
    # two significant binary digits: a figure every rank computes identically
    exponent = math.floor(math.log2(best))
    rounded = round(best / 2 ** (exponent - 1)) * 2 ** (exponent - 1)
    return float(min(max(rounded, MIN_BUCKET_BYTES), max(total_bytes, MIN_BUCKET_BYTES)))


def backend_of(config: Any) -> tuple[str, int]:
    """``(backend, workers)`` for a ParallelConfig: the cross-host engine and shard count,
    or ``("local", 1)`` on one host."""
    rendezvous = config.rendezvous
    if rendezvous is None or not rendezvous.is_multi_host:
        return "local", 1
    engine = rendezvous.engine.lower()
    return ("gloo" if engine == "gloo" else "nccl" if "nccl" in engine else "gloo",
            rendezvous.num_shards)


def auto_bucket_bytes(state: Any, grads: Sequence[Any]) -> float:
    """``gradient_bucket_mb="auto"``: the square-root rule on the cost model (file in
    ``$DPGRAPH_COST_MODEL`` or the defaults) for this configuration."""
    model = load()
    backend, workers = backend_of(state.config)
    total = float(sum(g.nbytes for g in grads))
    return sqrt_rule_bytes(total, model, backend, workers, len(state.devices))


def scaling_table(profile: StepProfile, model: CostModel, workers: Sequence[int],
                  bucket_bytes: float | str | None, backend: str = "gloo",
                  local_devices: int = 1) -> list[dict[str, Any]]:
    """Per worker count: the per-blob and the bucketed prediction (``"auto"``: the best
    size for that count)."""
    rows = []
    for count in workers:
        per_blob = predict(profile, model, count, None, backend, local_devices)
        size = (best_bucket_bytes(profile, model, count, backend, local_devices)
                if isinstance(bucket_bytes, str) else bucket_bytes)
        bucketed = predict(profile, model, count, size, backend, local_devices,
                           join_same_op=isinstance(bucket_bytes, str))
        rows.append({"workers": count, "per_blob": per_blob.to_json(),
                     "bucketed": bucketed.to_json()})
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The scaling table as aligned text."""
    head = (f"{'workers':>7} | {'per-blob step':>13} {'comm':>6} {'eff':>6} | "
            f"{'bucket MB':>9} {'n':>4} {'step':>9} {'comm':>6} {'eff':>6}")
    lines = [head, "-" * len(head)]
    for row in rows:
        a, b = row["per_blob"], row["bucketed"]
        lines.append(
            f"{row['workers']:>7} | {a['step_s'] * 1e3:>10.1f} ms {a['comm_share']:>6.1%} "
            f"{a['efficiency']:>6.1%} | {b['bucket_mb']:>9.2f} {b['collectives']:>4} "
            f"{b['step_s'] * 1e3:>6.1f} ms {b['comm_share']:>6.1%} {b['efficiency']:>6.1%}")
    return "\n".join(lines)
