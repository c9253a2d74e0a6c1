"""Run every recorded Caffe2 operator case whose op dpgraph implements.

Prints ``golden: N passed, M failed, K skipped of 152`` at the end of the session.  The
cases of REQUIRED must run and pass; any other implemented op must pass its cases too.
"""

from __future__ import annotations

import numpy as np
import pytest
from _golden import KERNELS, case_names, load_case

from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.testing import run_op

REQUIRED = frozenset({
    "activation_ops_test.test_relu", "activation_ops_test.test_elu",
    "activation_ops_test.test_leaky_relu", "adagrad_test.test_adagrad",
    "adagrad_test.test_sparse_adagrad_empty", "affine_channel_op_test.test_affine_channel_2d",
    "channel_backprop_stats_op_test.testChannelBackpropStats",
    "channel_stats_op_test.testChannelStats", "channel_stats_op_test.test_channel_stats_2d",
    "channel_stats_op_test.test_channel_stats_3d", "clip_op_test.test_clip",
    "concat_split_op_test.test_concat", "concat_split_op_test.test_split",
    "conv_test.test_1x1_conv", "dropout_op_test.test_dropout_is_test",
    "fc_operator_test.test_fc", "gather_ops_test.test_gather_ops",
    "group_norm_op_test.test_group_norm_2d", "hyperbolic_ops_test.test_tanh",
    "learning_rate_op_test.test_alter_learning_rate_op", "loss_ops_test.test_averaged_loss",
    "matmul_op_test.test_matmul", "mean_op_test.test_mean",
    "momentum_sgd_test.test_momentum_sgd", "momentum_sgd_test.test_sparse_momentum_sgd",
    "reduce_ops_test.test_reduce_front_sum", "reduce_ops_test.test_reduce_mean",
    "reduction_ops_test.test_elementwise_sum", "reduction_ops_test.test_elementwise_sqrsum",
    "softmax_ops_test.test_softmax", "softmax_ops_test.test_softmax_grad",
    "softmax_ops_test.test_softmax_with_loss", "sparse_ops_test.testScatterAssign",
    "sparse_ops_test.testScatterWeightedSum", "spatial_bn_op_test.test_spatialbn_test_mode_3d",
    "transpose_op_test.test_transpose", "utility_ops_test.test_sum",
    "utility_ops_test.test_elementwise_max", "utility_ops_test.test_elementwise_max_grad",
    "utility_ops_test.test_elementwise_min", "utility_ops_test.test_elementwise_min_grad",
    "utility_ops_test.test_slice", "weighted_sum_test.test_weighted_sum",
})


def assert_output_matches(name: str, got: object, expected: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
    if expected.dtype.kind in "fc":
        np.testing.assert_allclose(got.astype(expected.dtype), expected, rtol=1e-4, atol=1e-4,
                                   err_msg=name)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=name)


def run_case(case_name: str) -> None:
    case = load_case(case_name)
    op = case.op()
    schema = OPERATORS.get(op.type)
    if schema is None or schema.kernel is None:
        if case_name in REQUIRED:
            pytest.fail(f"{case_name}: required op {op.type} is not implemented")
        pytest.skip(f"op {op.type} not implemented")
    data = case.data()
    inputs = [data[f"input_{k}"] for k in range(case.num_inputs)]
    outputs = run_op(op, inputs)
    for k in range(case.num_outputs):
        assert_output_matches(f"{case_name} output {k} ({op.output[k]})",
                              outputs[k], data[f"output_{k}"])


@pytest.mark.parametrize("case_name", case_names() or ["<golden data absent>"])
def test_golden_case(case_name: str) -> None:
    KERNELS.run(run_case, case_name)
