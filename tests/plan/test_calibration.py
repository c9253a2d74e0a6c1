"""Calibration that measures what a step sees: median times over the bucket sizes, the
relative least-squares fit, and the contention term (the transport's CPU time taken from
the overlapped compute) in the cost model and the planner."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from dpgraph.errors import ParallelizeError
from dpgraph.parallel.plan import AlphaBeta, CostModel, load, predict
from dpgraph.parallel.plan.calibrate import PROBE_BYTES, contention_share, fit, probe_world
from dpgraph.parallel.plan.planner import MB, sqrt_rule_bytes
from dpgraph.parallel.plan.profile import GradTiming, StepProfile


def test_contention_formula_and_json_round_trip(tmp_path: Path) -> None:
    figures = AlphaBeta(1e-4, 1e-9, cpu_alpha=2e-5, cpu_beta=3e-10)
    assert figures.contention(1e6, 3) == pytest.approx(4 * 2e-5 + 4 / 3 * 1e6 * 3e-10)
    assert figures.contention(1e6, 1) == 0.0
    assert AlphaBeta(1e-4, 1e-9).contention(1e6, 4) == 0.0  # default: own cores
    path = tmp_path / "cost.json"
    CostModel({"gloo": figures}).save(path)
    assert load(path).backend("gloo") == figures
    path.write_text('{"backends": {"gloo": {"alpha": 1e-4, "beta": 1e-9}}}')  # older files
    assert load(path).backend("gloo") == AlphaBeta(1e-4, 1e-9)
    path.write_text('{"backends": {"gloo": [1, 2]}}')
    with pytest.raises(ParallelizeError, match="cpu_alpha"):
        load(path)
    # overriding alpha or bandwidth keeps the measured contention
    changed = CostModel({"gloo": figures}).with_overrides("gloo", alpha=5e-4)
    assert changed.backend("gloo") == AlphaBeta(5e-4, 1e-9, 2e-5, 3e-10)


def test_fit_keeps_the_small_sizes() -> None:
    sizes = [4e3, 6.4e4, 2.56e5, 1e6, 4e6]
    exact = [2 * 1e-4 + n * 1e-9 for n in sizes]
    figures = fit(sizes, exact, steps=2, volume=1)
    assert figures.alpha == pytest.approx(1e-4, rel=1e-6)
    assert figures.beta == pytest.approx(1e-9, rel=1e-6)
    # one slow large size (a loopback cliff) must not wipe out the latency term
    noisy = exact[:-1] + [exact[-1] * 1.8]
    bent = fit(sizes, noisy, steps=2, volume=1)
    assert bent.alpha > 0.5e-4 and bent.beta > 1e-9
    slow_small = [exact[0] * 10] + exact[1:]  # one latency-bound size hit by noise
    steady = fit(sizes, slow_small, steps=2, volume=1)
    assert steady.alpha == pytest.approx(1e-4, rel=0.05)
    assert steady.beta == pytest.approx(1e-9, rel=0.05)
    flat = fit(sizes, [1e-3] * len(sizes), steps=2, volume=1)  # no slower when larger
    assert flat.beta == pytest.approx(1e-3 / 4e6) and flat.alpha > 0


class _FakeWorld:
    """Two identical ranks: an all-reduce burns ``cpu + n * cpu_per_byte`` seconds of CPU
    on its own thread, then sleeps until ``alpha + n * beta``; the sum over ranks doubles
    the buffer."""

    size = 2

    def __init__(self, alpha: float, beta: float, cpu: float, cpu_per_byte: float) -> None:
        self.alpha, self.beta = alpha, beta
        self.cpu, self.cpu_per_byte = cpu, cpu_per_byte

    def allreduce(self, buffers: list[np.ndarray]) -> list[np.ndarray]:
        buffer = buffers[0]
        if buffer.dtype == np.float64:  # the agreement step
            buffer *= self.size
            return buffers
        start = time.perf_counter()
        burn = self.cpu + buffer.nbytes * self.cpu_per_byte
        end = time.thread_time() + burn
        while time.thread_time() < end:
            pass
        time.sleep(max(self.alpha + buffer.nbytes * self.beta - (time.perf_counter() - start),
                       0.0))
        return buffers


def _compute() -> None:
    time.sleep(0.004)  # no CPU of its own: the burn is the all-reduce thread's


def test_contention_share() -> None:
    assert contention_share(2, cpus=2) == 1.0  # every core computes
    assert contention_share(3, cpus=2) == 1.0
    assert contention_share(2, cpus=4) == 0.0  # a free core per rank
    assert contention_share(2, cpus=3) == 0.5


def test_probe_world_measures_latency_bandwidth_and_contention() -> None:
    assert max(PROBE_BYTES) >= 2 * MB  # covers the bucket sizes a step uses
    world = _FakeWorld(alpha=2e-3, beta=1e-9, cpu=0.5e-3, cpu_per_byte=0.25e-9)
    figures = probe_world(world, sizes=(4 << 10, 1 << 20, 4 << 20), repeats=3,
                          local_ranks=4096, compute=_compute)
    # p = 2: t = 2 alpha' + n beta', so alpha' ~ 1 ms and beta' ~ 1 ns/B (sleeps overshoot)
    assert figures.alpha == pytest.approx(1e-3, rel=0.5)
    assert figures.beta == pytest.approx(1e-9, rel=0.5)
    # CPU beside compute: 0.5 ms at 4 KiB, 1 ms at 2 MiB: cpu_alpha 0.25 ms, 0.25 ns/B (plus
    # the CPU of starting the thread that issues the all-reduce)
    assert 0.2e-3 <= figures.cpu_alpha <= 0.6e-3
    assert figures.cpu_beta == pytest.approx(0.25e-9, rel=0.5)
    alone = probe_world(world, sizes=(4 << 10, 1 << 20), repeats=2, local_ranks=0)
    assert alone.cpu_alpha == alone.cpu_beta == 0.0  # the ranks' cores are free


class _PeerWorld(_FakeWorld):
    """Two ranks whose hosts differ: the peer's contention share is ``peer_share``."""

    def __init__(self, peer_share: float) -> None:
        super().__init__(alpha=1e-3, beta=1e-9, cpu=0.5e-3, cpu_per_byte=0.25e-9)
        self.peer_share = peer_share

    def allreduce(self, buffers: list[np.ndarray]) -> list[np.ndarray]:
        if buffers[0].dtype == np.float64 and buffers[0].size == 1:  # the shares
            buffers[0] += self.peer_share
            return buffers
        return super().allreduce(buffers)


def test_ranks_on_hosts_with_other_core_counts_probe_alike() -> None:
    """Each rank's share of contention comes from its own host; they agree on one (the
    mean) before probing, so both run the same collectives and get the same figures."""
    sizes = (4 << 10, 1 << 20)
    busy = probe_world(_PeerWorld(peer_share=0.0), sizes, repeats=2, local_ranks=4096,
                       compute=_compute)  # this host has no free core, the peer's has
    free = probe_world(_PeerWorld(peer_share=1.0), sizes, repeats=2, local_ranks=0,
                       compute=_compute)
    assert busy.cpu_beta > 0 and free.cpu_beta > 0  # both probed the contention


def test_a_one_rank_world_costs_nothing() -> None:
    assert fit([4096, 1 << 20], [1e-4, 2e-3], steps=0, volume=0.0) == AlphaBeta(0.0, 0.0)


def _profile() -> StepProfile:
    grads = (GradTiming("late_big", 4 * MB, 1e9), GradTiming("last", 4096, 2e9))
    return StepProfile("two", 1e9, 2e9, grads)


def test_prediction_adds_the_contention_of_overlapped_collectives() -> None:
    plain = CostModel({"gloo": AlphaBeta(1e-5, 1e-10)}, flops_per_sec=1e11)  # 30 ms compute
    shared = CostModel({"gloo": AlphaBeta(1e-5, 1e-10, 1e-3, 1e-9)}, flops_per_sec=1e11)
    base = predict(_profile(), plain, 2, None)
    slow = predict(_profile(), shared, 2, None)
    assert base.contention_s == 0.0
    # the 4 MiB gradient overlaps the backward pass; the last one runs after it
    lost = shared.backend("gloo").contention(4 * MB, 2)
    assert slow.contention_s == pytest.approx(lost)
    assert slow.step_s == pytest.approx(base.step_s + lost, rel=1e-6)
    assert slow.to_json()["contention_s"] == pytest.approx(lost)
    assert predict(_profile(), shared, 1, None).step_s == base.compute_s


def test_sqrt_rule_counts_contention_per_collective() -> None:
    plain = CostModel({"gloo": AlphaBeta(1e-4, 1e-9)})
    shared = CostModel({"gloo": AlphaBeta(1e-4, 1e-9, cpu_alpha=3e-4)})
    small = sqrt_rule_bytes(100 * MB, plain, "gloo", 2, 1)
    large = sqrt_rule_bytes(100 * MB, shared, "gloo", 2, 1)
    assert large == pytest.approx(2 * small, rel=0.26)  # 4x the per-collective cost
