"""Sparse (GradientSlice) gradients and pass-through accumulation."""

from __future__ import annotations

from _autodiff_testops import assert_ops, op

from dpgraph.autodiff import GetBackwardPass
from dpgraph.ir.blob import BlobReference, GradientSlice


def test_gather_gradient_is_a_slice_of_indices_and_output_gradient() -> None:
    grad_ops, grad_map = GetBackwardPass([op("Gather", ["data", "idx"], "out")],
                                         {"out": "out_grad"})
    assert grad_ops == []
    grad = grad_map["data"]
    assert isinstance(grad, GradientSlice)
    assert type(grad.indices) is BlobReference and type(grad.values) is BlobReference
    assert grad == GradientSlice("idx", "out_grad")
    assert "idx" not in grad_map


def test_two_gathers_concat_indices_and_values() -> None:
    ops = [op("Gather", ["x2", "x1"], "x4"), op("Gather", ["x2", "x3"], "x5"),
           op("Direct", ["x4", "x5"], "y")]
    grad_ops, grad_map = GetBackwardPass(ops, {"y": "y_grad"})
    assert_ops(grad_ops, [
        ("DirectGradient", "y_grad", ["x4_grad", "x5_grad"]),
        ("Concat", ["x3", "x1"], ["x2_grad_indices_concat", "x2_grad_indices_concat_split"]),
        ("Concat", ["x5_grad", "x4_grad"],
         ["x2_grad_values_concat", "x2_grad_values_concat_split"]),
    ])
    assert all([(a.name, a.i) for a in o.arg] == [("axis", 0)] for o in grad_ops[1:])
    assert all(list(o.device_option.extra_info) == ["is_auto_gen_sum_ops:1"]
               for o in grad_ops[1:])
    assert grad_map["x2"] == GradientSlice("x2_grad_indices_concat", "x2_grad_values_concat")


def test_one_op_making_indices_and_values_is_renamed_apart() -> None:
    ops = [op("TestSparseHash", ["x1", "x4"], "y1"), op("TestSparseHash", ["x2", "x4"], "y2"),
           op("Direct", ["y1", "y2"], "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [
        ("DirectGradient", "out_grad", ["y1_grad", "y2_grad"]),
        ("TestSparseHashGradient", ["y2_grad", "x2"],
         ["_x4_grad_indices_autosplit_0", "_x4_grad_values_autosplit_0"]),
        ("TestSparseHashGradient", ["y1_grad", "x1"],
         ["_x4_grad_indices_autosplit_1", "_x4_grad_values_autosplit_1"]),
        ("Concat", ["_x4_grad_indices_autosplit_0", "_x4_grad_indices_autosplit_1"],
         ["x4_grad_indices_concat", "x4_grad_indices_concat_split"]),
        ("Concat", ["_x4_grad_values_autosplit_0", "_x4_grad_values_autosplit_1"],
         ["x4_grad_values_concat", "x4_grad_values_concat_split"]),
    ])
    assert grad_map["x4"] == GradientSlice("x4_grad_indices_concat", "x4_grad_values_concat")


def test_sparse_lengths_sum_slice_mixes_pass_through_indices() -> None:
    ops = [op("SparseLengthsSum", ["emb", "ids", "lengths"], "s1"),
           op("SparseLengthsSum", ["emb", "ids2", "lengths"], "s2"),
           op("Direct", ["s1", "s2"], "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    concat_indices, concat_values = grad_ops[-2:]
    assert list(concat_indices.input) == ["ids2", "ids"]
    assert list(concat_values.input) == ["_emb_grad_values_autosplit_0",
                                         "_emb_grad_values_autosplit_1"]
    assert grad_map["emb"] == GradientSlice("emb_grad_indices_concat", "emb_grad_values_concat")


def test_ensure_dense_turns_accumulated_slices_dense() -> None:
    ops = [op("EnsureDense", "x0", "x2"), op("Gather", ["x2", "x1"], "x4"),
           op("Gather", ["x2", "x3"], "x5"), op("DotProduct", ["x4", "x5"], "x6")]
    grad_ops, grad_map = GetBackwardPass(ops, ["x6"])
    last = grad_ops[-1]
    assert last.type == "SparseToDense"
    assert list(last.input[:2]) == ["x2_grad_indices_concat", "x2_grad_values_concat"]
    assert grad_map["x0"] == last.output[0]
