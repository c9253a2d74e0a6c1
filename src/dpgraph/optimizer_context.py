"""Caffe2's ``optimizer_context`` module: per-tag optimizers picked up by create_param."""

from dpgraph.modeling.optimizer_context import DEFAULT_OPTIM, OptimizerContext, UseOptimizer

__all__ = ["DEFAULT_OPTIM", "OptimizerContext", "UseOptimizer"]
