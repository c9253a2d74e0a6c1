"""The hand-written parameter update of Caffe2's data_parallel_model tests, shared by the
Parallelize, BMUF, export and memory test tiers."""

from __future__ import annotations

from typing import Any

from dpgraph import brew, core


def manual_sgd(model: Any, base_lr: float = -0.1) -> None:
    """Per-device plain SGD with a fixed LR: Iter, LearningRate and WeightedSum per param
    (ScatterWeightedSum for a sparse gradient), as Caffe2's DPM tests build it."""
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=base_lr, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        grad = model.param_to_grad[param]
        if isinstance(grad, core.GradientSlice):
            model.net.ScatterWeightedSum([param, one, grad.indices, grad.values, lr], param)
        else:
            model.net.WeightedSum([param, one, grad, lr], param)
