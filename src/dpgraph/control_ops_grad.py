"""Caffe2's ``control_ops_grad``: gradients of the Do, If and While ops."""

from dpgraph.jobs.control_ops_grad import (
    dedupe_g_output,
    disambiguate_grad_if_op_output,
    gen_do_gradient,
    gen_if_gradient,
    gen_while_gradient,
    getNetArgument,
)

__all__ = ["dedupe_g_output", "disambiguate_grad_if_op_output", "gen_do_gradient",
           "gen_if_gradient", "gen_while_gradient", "getNetArgument"]
