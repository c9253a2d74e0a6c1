"""Divergence study (issue 22, item 5), run by hand, prints JSON:

    python tests/detectron/divergence_study.py [--image 64] [--steps 6] [--lrs 0.02,0.0025]

Builds the Detectron-shaped model of ``_mini_detectron`` at ResNet-50-FPN widths and depths
(stem 64; stages of 3, 4, 6, 3 bottlenecks to 2048 channels; FPN 256; 2 x 1024 FC head; 81
classes) with Detectron's initialisers and no pretrained weights, and reports

* activation scales (standard deviation) per stage at initialisation, float32, next to an
  independent torch forward of the same model, and
* the summed loss over a few SGD steps (momentum 0.9, weight decay 1e-4, Detectron's
  warm-up factor 1/3) at each learning rate, in dpgraph and in torch from the same start.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _mini_detectron as mini  # noqa: E402

from dpgraph import workspace  # noqa: E402

R50 = dict(stem=64, stages=((64, 256, 3), (128, 512, 4), (256, 1024, 6), (512, 2048, 3)),
           fpn_dim=256, head_dim=1024, classes=81, pooled=7, rpn_batch=256)
SCALES = ("pool1", "res2_2_sum", "res3_3_sum", "res4_5_sum", "res5_2_sum", "fpn_res2_sum",
          "fpn_res5_sum", "rpn_cls_logits_fpn2", "fc7", "cls_score")


def dpgraph_step(spec: mini.Spec, params: dict, feeds: dict) -> tuple[dict, float, dict]:
    workspace.ResetWorkspace()
    net, losses = mini.build_forward(spec)
    net.AddGradientOperators(losses)
    for name, value in {**params, **feeds}.items():
        workspace.FeedBlob(name, value)
    workspace.RunNetOnce(net)
    acts = {k: workspace.FetchBlob(k) for k in SCALES}
    loss = float(sum(float(workspace.FetchBlob(k)) for k in losses))
    grads = {k: workspace.FetchBlob(k + "_grad") for k in mini.trainable(spec)}
    return acts, loss, grads


def torch_step(spec: mini.Spec, params: dict, feeds: dict) -> tuple[dict, float, dict]:
    import torch

    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    acts = mini.torch_forward(spec, tparams, feeds)
    total = sum(v for k, v in acts.items() if k.startswith("loss_"))
    total.backward()
    grads = {k: tparams[k].grad.numpy() for k in mini.trainable(spec)}
    shown = {k: acts[k].detach().numpy() for k in SCALES if k in acts}
    return shown, float(total.detach()), grads


def train(spec: mini.Spec, params: dict, feeds: dict, lr: float, steps: int,
          step_fn) -> list[float]:
    params = {k: v.copy() for k, v in params.items()}
    velocity = {k: np.zeros_like(v) for k, v in params.items()}
    losses = []
    for it in range(steps):
        _, loss, grads = step_fn(spec, params, feeds)
        losses.append(loss)
        if not np.isfinite(loss):
            break
        rate = lr * (1 / 3 + (1 - 1 / 3) * it / 500)  # Detectron's linear warm-up
        for k, g in grads.items():
            decay = 1e-4 * params[k] if not k.endswith("_b") else 0.0
            velocity[k] = (0.9 * velocity[k] + rate * (g + decay)).astype(params[k].dtype)
            params[k] = params[k] - velocity[k]
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lrs", default="0.02,0.005,0.0025")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    dtype = np.dtype(args.dtype)
    spec = mini.Spec(image=args.image, rois=16, **R50)
    rng = np.random.default_rng(0)
    params = mini.init_params(spec, rng, detectron_init=True, dtype=dtype)
    feeds = mini.make_inputs(spec, rng, dtype=dtype)
    feeds["data"] *= 50.0  # Detectron feeds mean-subtracted pixels (std ~ 50-60), not N(0, 1)
    start = time.perf_counter()
    ours, loss0, _ = dpgraph_step(spec, params, feeds)
    seconds = time.perf_counter() - start
    ref, ref_loss0, _ = torch_step(spec, params, feeds)
    report = {
        "image": args.image, "dtype": args.dtype, "seconds_per_dpgraph_step": round(seconds, 2),
        "initial_loss": {"dpgraph": loss0, "torch": ref_loss0},
        "activation_std": {k: {"dpgraph": float(np.std(ours[k])),
                               "torch": float(np.std(ref[k])) if k in ref else None}
                           for k in SCALES},
        "training": {},
    }
    for lr in (float(v) for v in args.lrs.split(",")):
        report["training"][str(lr)] = {
            "dpgraph": train(spec, params, feeds, lr, args.steps, dpgraph_step),
            "torch": train(spec, params, feeds, lr, args.steps, torch_step)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
