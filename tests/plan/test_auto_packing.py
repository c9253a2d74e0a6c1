"""``"auto"`` keeps the gradients one op writes in one bucket (no collective without
overlap to gain), in the bucketing pass and in the planner's mirror of it."""

from __future__ import annotations

from dpgraph.parallel.buckets import GradInfo, assign_buckets
from dpgraph.parallel.plan import AlphaBeta, CostModel, predict
from dpgraph.parallel.plan.planner import bucket_sizes
from dpgraph.parallel.plan.profile import GradTiming, StepProfile


def _grads() -> list[GradInfo]:
    # FCGradient of fc2 writes fc2_w and fc2_b (op 14), that of fc1 writes fc1_w, fc1_b (16)
    sizes = [("fc2_w", 10_240, 14), ("fc2_b", 40, 14), ("fc1_b", 1024, 16),
             ("fc1_w", 2 << 20, 16), ("conv2_w", 18_432, 19), ("conv2_b", 128, 19)]
    return [GradInfo(name, nbytes, "float32", order, op=op)
            for order, (name, nbytes, op) in enumerate(sizes)]


def test_one_ops_gradients_share_an_auto_bucket() -> None:
    split = assign_buckets(_grads(), 1 << 20)
    assert [[g.name for g in b.grads] for b in split] == [
        ["fc2_w", "fc2_b", "fc1_b"], ["fc1_w"], ["conv2_w", "conv2_b"]]
    joined = assign_buckets(_grads(), 1 << 20, join_same_op=True)
    assert [[g.name for g in b.grads] for b in joined] == [
        ["fc2_w", "fc2_b"], ["fc1_b", "fc1_w"], ["conv2_w", "conv2_b"]]
    roomy = assign_buckets(_grads(), 2.5 * (1 << 20), join_same_op=True)
    assert [[g.name for g in b.grads] for b in roomy] == [
        ["fc2_w", "fc2_b", "fc1_b", "fc1_w", "conv2_w", "conv2_b"]]
    # the op's unit decides, whatever the order of its gradients
    flipped = [GradInfo(g.name, g.nbytes, g.dtype, {2: 3, 3: 2}.get(g.order, g.order), op=g.op)
               for g in _grads()]
    assert [[g.name for g in b.grads] for b in assign_buckets(
        flipped, 1 << 20, join_same_op=True)] == [
        ["fc2_w", "fc2_b"], ["fc1_w", "fc1_b"], ["conv2_w", "conv2_b"]]
    # gradients of unknown writers keep the size limit
    unknown = [GradInfo(g.name, g.nbytes, g.dtype, g.order) for g in _grads()]
    assert len(assign_buckets(unknown, 1 << 20, join_same_op=True)) == 3


def test_planner_mirrors_the_joined_packing() -> None:
    sizes = [g.nbytes for g in _grads()]
    writers = [g.op for g in _grads()]
    assert bucket_sizes(sizes, 1 << 20) == [(2, 11_304), (3, 2 << 20), (5, 18_560)]
    assert bucket_sizes(sizes, 1 << 20, writers) == [(1, 10_280), (3, 1024 + (2 << 20)),
                                                     (5, 18_560)]
    assert bucket_sizes(sizes, 4 << 20, writers) == [(5, sum(sizes))]
    assert bucket_sizes(sizes, 1 << 20, [-1] * len(sizes)) == bucket_sizes(sizes, 1 << 20)
    grads = tuple(GradTiming(name, 60_000, ready, op) for name, ready, op in (
        ("a_w", 1e8, 1), ("a_b", 1e8, 1), ("b_w", 2e8, 0), ("b_b", 2e8, 0)))
    profile = StepProfile("pairs", 1e9, 2e9, grads)
    model = CostModel({"gloo": AlphaBeta(1e-3, 1e-10, cpu_alpha=1e-3)}, flops_per_sec=1e11)
    split = predict(profile, model, 2, 100_000)  # every gradient alone
    joined = predict(profile, model, 2, 100_000, join_same_op=True)  # one bucket per op
    assert (split.collectives, joined.collectives) == (4, 2)
    assert joined.contention_s < split.contention_s  # fewer overlapped collectives
