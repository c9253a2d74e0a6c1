"""Regenerate ``parallel_mlp_4devices.dot``: a 2-layer MLP Parallelized on 4 CPU devices.

Run from the repository root: ``python docs/images/parallel_mlp_4devices.py``
(add ``svg`` as an argument to also write the .svg when Graphviz's ``dot`` is installed).
"""

from __future__ import annotations

import sys
from typing import Any

from dpgraph import brew, data_parallel_model, workspace
from dpgraph.export import render
from dpgraph.model_helper import ModelHelper


def forward(model: Any, loss_scale: float) -> list[Any]:
    hidden = brew.fc(model, "data", "fc1", dim_in=8, dim_out=16)
    hidden = brew.relu(model, hidden, hidden)
    out = brew.fc(model, hidden, "fc2", dim_in=16, dim_out=4)
    dist = model.net.SquaredL2Distance([out, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def update(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        model.net.WeightedSum([param, one, model.param_to_grad[param], lr], param)


def main() -> None:
    workspace.ResetWorkspace()
    model = ModelHelper(name="mlp_4cpu")
    data_parallel_model.Parallelize(model, lambda m: None, forward,
                                    param_update_builder_fun=update,
                                    devices=[0, 1, 2, 3], cpu_device=True)
    render(model.net, "docs/images/parallel_mlp_4devices.dot")
    if "svg" in sys.argv[1:]:
        render(model.net, "docs/images/parallel_mlp_4devices.svg")


if __name__ == "__main__":
    main()
