"""A small Detectron-shaped detector built twice: as a dpgraph net (the ops Detectron's
builders emit, in place where Detectron works in place) and as an independent torch forward.

Body: ResNet stem (Conv 7x7/2, AffineChannel, Relu, MaxPool, StopGradient) and bottleneck
stages (ConvAffine branches, projection shortcut, Sum, Relu); FPN (lateral 1x1 convs,
UpsampleNearest top-down, Sum, 3x3 output convs); RPN on every FPN level with shared weights
(SigmoidCrossEntropyLoss, SmoothL1Loss beta=1/9); a 2-FC box head on RoIPoolF or RoIAlign
features of the finest level (SoftmaxWithLoss, SmoothL1Loss).  The Python-op data path
(anchors, proposals, labels) is replaced by fed blobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpgraph import core

A = 3  # anchors per location


@dataclass
class Spec:
    """Model size: stage widths (dim_in, dim_inner, dim_out, blocks) after a stem of
    ``stem`` channels, FPN width, head width, classes, image size, RoIs."""

    stem: int = 8
    stages: tuple = ((4, 16, 1), (8, 32, 1))
    fpn_dim: int = 16
    head_dim: int = 32
    classes: int = 5
    image: int = 32
    batch: int = 2
    rois: int = 8
    pooled: int = 2
    roi_method: str = "RoIPoolF"
    loss_scale: float = 1.0
    rpn_batch: int = 16


# --- parameters ------------------------------------------------------------------------------
def _shapes(spec: Spec) -> dict[str, tuple]:
    s: dict[str, tuple] = {"conv1_w": (spec.stem, 3, 7, 7), "res_conv1_bn_s": (spec.stem,),
                           "res_conv1_bn_b": (spec.stem,)}
    dim_in = spec.stem
    for k, (inner, out, blocks) in enumerate(spec.stages, start=2):
        for b in range(blocks):
            p = f"res{k}_{b}"
            for branch, (o, i, kk) in {"branch2a": (inner, dim_in, 1),
                                       "branch2b": (inner, inner, 3),
                                       "branch2c": (out, inner, 1)}.items():
                s[f"{p}_{branch}_w"] = (o, i, kk, kk)
                s[f"{p}_{branch}_bn_s"] = s[f"{p}_{branch}_bn_b"] = (o,)
            if dim_in != out:
                s[f"{p}_branch1_w"] = (out, dim_in, 1, 1)
                s[f"{p}_branch1_bn_s"] = s[f"{p}_branch1_bn_b"] = (out,)
            dim_in = out
    f = spec.fpn_dim
    for k, (_, out, _) in enumerate(spec.stages, start=2):
        name = f"fpn_inner_res{k}_sum" if k == len(spec.stages) + 1 else \
            f"fpn_inner_res{k}_sum_lateral"
        s[name + "_w"], s[name + "_b"] = (f, out, 1, 1), (f,)
        s[f"fpn_res{k}_sum_w"], s[f"fpn_res{k}_sum_b"] = (f, f, 3, 3), (f,)
    s.update({"conv_rpn_fpn2_w": (f, f, 3, 3), "conv_rpn_fpn2_b": (f,),
              "rpn_cls_logits_fpn2_w": (A, f, 1, 1), "rpn_cls_logits_fpn2_b": (A,),
              "rpn_bbox_pred_fpn2_w": (4 * A, f, 1, 1), "rpn_bbox_pred_fpn2_b": (4 * A,),
              "fc6_w": (spec.head_dim, f * spec.pooled ** 2), "fc6_b": (spec.head_dim,),
              "fc7_w": (spec.head_dim, spec.head_dim), "fc7_b": (spec.head_dim,),
              "cls_score_w": (spec.classes, spec.head_dim), "cls_score_b": (spec.classes,),
              "bbox_pred_w": (4 * spec.classes, spec.head_dim),
              "bbox_pred_b": (4 * spec.classes,)})
    return s


def init_params(spec: Spec, rng: np.random.Generator, detectron_init: bool = True,
                dtype: Any = np.float64) -> dict[str, np.ndarray]:
    """Detectron's initialisers (XavierFill convs, AffineChannel 1/0, GaussianFill 0.01 for
    RPN/cls, 0.001 for bbox_pred, zero biases); ``detectron_init=False`` randomises every
    value (AffineChannel and biases too), for gradient checks."""
    params = {}
    for name, shape in _shapes(spec).items():
        if not detectron_init:
            params[name] = rng.standard_normal(shape) * (0.5 if len(shape) == 1 else
                                                         1 / math.sqrt(np.prod(shape[1:])))
        elif name.endswith("_bn_s"):
            params[name] = np.ones(shape)
        elif name.endswith("_b"):
            params[name] = np.zeros(shape)
        elif name.startswith(("rpn_", "conv_rpn", "cls_score")):
            params[name] = rng.normal(0, 0.01, shape)
        elif name.startswith("bbox_pred"):
            params[name] = rng.normal(0, 0.001, shape)
        else:  # XavierFill: U(-sqrt(3 / fan_in), +sqrt(3 / fan_in))
            bound = math.sqrt(3.0 / np.prod(shape[1:]))
            params[name] = rng.uniform(-bound, bound, shape)
        params[name] = params[name].astype(dtype)
    return params


def levels(spec: Spec) -> list[int]:
    return list(range(2, len(spec.stages) + 2))


def make_inputs(spec: Spec, rng: np.random.Generator, dtype: Any = np.float64) -> dict:
    """Fed blobs standing in for Detectron's data loader and proposal Python ops."""
    feeds: dict[str, np.ndarray] = {
        "data": rng.standard_normal((spec.batch, 3, spec.image, spec.image)).astype(dtype)}
    for lvl in levels(spec):
        side = spec.image // 2 ** lvl
        shape = (spec.batch, A, side, side)
        labels = rng.choice([-1, 0, 1], size=shape, p=[0.6, 0.3, 0.1]).astype(np.int32)
        feeds[f"rpn_labels_int32_fpn{lvl}"] = labels
        inside = np.repeat((labels == 1), 4, axis=1).astype(dtype)
        feeds[f"rpn_bbox_targets_fpn{lvl}"] = rng.standard_normal(
            (spec.batch, 4 * A, side, side)).astype(dtype)
        feeds[f"rpn_bbox_inside_weights_fpn{lvl}"] = inside
        feeds[f"rpn_bbox_outside_weights_fpn{lvl}"] = (
            np.repeat(labels >= 0, 4, axis=1) / spec.rpn_batch).astype(dtype)
    r, size = spec.rois, spec.image
    x1 = rng.uniform(0, size * 0.6, r)
    y1 = rng.uniform(0, size * 0.6, r)
    w = rng.uniform(4, size * 0.4, r)
    h = rng.uniform(4, size * 0.4, r)
    feeds["rois"] = np.stack([rng.integers(0, spec.batch, r), x1, y1, x1 + w, y1 + h],
                             axis=1).astype(dtype)
    labels = rng.integers(0, spec.classes, r).astype(np.int32)
    feeds["labels_int32"] = labels
    targets = np.zeros((r, 4 * spec.classes))
    inside = np.zeros_like(targets)
    for i, c in enumerate(labels):
        if c > 0:
            targets[i, 4 * c:4 * c + 4] = rng.standard_normal(4)
            inside[i, 4 * c:4 * c + 4] = 1
    feeds["bbox_targets"] = targets.astype(dtype)
    feeds["bbox_inside_weights"] = inside.astype(dtype)
    feeds["bbox_outside_weights"] = (inside > 0).astype(dtype)
    return feeds


# --- dpgraph net -----------------------------------------------------------------------------
def _conv_affine(net: core.Net, blob_in: str, prefix: str, kernel: int, stride: int,
                 pad: int) -> str:
    net.Conv([blob_in, prefix + "_w"], prefix, kernel=kernel, stride=stride, pad=pad)
    net.AffineChannel([prefix, prefix + "_bn_s", prefix + "_bn_b"], prefix)  # in place
    return prefix


def _body(net: core.Net, spec: Spec) -> list[str]:
    net.Conv(["data", "conv1_w"], "conv1", kernel=7, stride=2, pad=3)
    net.AffineChannel(["conv1", "res_conv1_bn_s", "res_conv1_bn_b"], "conv1")
    net.Relu("conv1", "conv1")
    net.MaxPool("conv1", "pool1", kernel=3, pad=1, stride=2)
    blob, dim_in, outputs = "pool1", spec.stem, []
    for k, (_, out, blocks) in enumerate(spec.stages, start=2):
        for b in range(blocks):
            p = f"res{k}_{b}"
            stride = 2 if (k > 2 and b == 0) else 1
            cur = _conv_affine(net, blob, p + "_branch2a", 1, stride, 0)  # STRIDE_1X1
            net.Relu(cur, cur)
            cur = _conv_affine(net, cur, p + "_branch2b", 3, 1, 1)
            net.Relu(cur, cur)
            cur = _conv_affine(net, cur, p + "_branch2c", 1, 1, 0)
            if dim_in != out:
                net.Conv([blob, p + "_branch1_w"], p + "_branch1", kernel=1, stride=stride)
                net.AffineChannel([p + "_branch1", p + "_branch1_bn_s", p + "_branch1_bn_b"],
                                  p + "_branch1_bn")
                short = p + "_branch1_bn"
            else:
                short = blob
            net.Sum([cur, short], p + "_sum")
            net.Relu(p + "_sum", p + "_sum")
            blob, dim_in = p + "_sum", out
        if k == 2:
            net.StopGradient(blob, blob)  # FREEZE_AT = 2: no gradient into res2 and below
        outputs.append(blob)
    return outputs


def _fpn(net: core.Net, spec: Spec, body: list[str]) -> list[str]:
    lv = levels(spec)
    top = lv[-1]
    inner = f"fpn_inner_res{top}_sum"
    net.Conv([body[-1], inner + "_w", inner + "_b"], inner, kernel=1)
    inners = {top: inner}
    for lvl in reversed(lv[:-1]):
        lateral = f"fpn_inner_res{lvl}_sum_lateral"
        net.Conv([body[lvl - 2], lateral + "_w", lateral + "_b"], lateral, kernel=1)
        net.UpsampleNearest(inners[lvl + 1], f"fpn_inner_res{lvl}_sum_topdown", scale=2)
        net.Sum([lateral, f"fpn_inner_res{lvl}_sum_topdown"], f"fpn_inner_res{lvl}_sum")
        inners[lvl] = f"fpn_inner_res{lvl}_sum"
    outs = []
    for lvl in lv:
        name = f"fpn_res{lvl}_sum"
        net.Conv([inners[lvl], name + "_w", name + "_b"], name, kernel=3, pad=1)
        outs.append(name)
    return outs


def _rpn(net: core.Net, spec: Spec, fpn: list[str]) -> list[str]:
    losses = []
    for lvl, blob in zip(levels(spec), fpn):
        s = f"fpn{lvl}"
        net.Conv([blob, "conv_rpn_fpn2_w", "conv_rpn_fpn2_b"], "conv_rpn_" + s, kernel=3,
                 pad=1)
        net.Relu("conv_rpn_" + s, "conv_rpn_" + s)
        net.Conv(["conv_rpn_" + s, "rpn_cls_logits_fpn2_w", "rpn_cls_logits_fpn2_b"],
                 "rpn_cls_logits_" + s, kernel=1)
        net.Conv(["conv_rpn_" + s, "rpn_bbox_pred_fpn2_w", "rpn_bbox_pred_fpn2_b"],
                 "rpn_bbox_pred_" + s, kernel=1)
        net.SigmoidCrossEntropyLoss(["rpn_cls_logits_" + s, "rpn_labels_int32_" + s],
                                    "loss_rpn_cls_" + s, normalize=0,
                                    scale=spec.loss_scale / spec.rpn_batch / spec.batch)
        net.SmoothL1Loss(["rpn_bbox_pred_" + s, "rpn_bbox_targets_" + s,
                          "rpn_bbox_inside_weights_" + s, "rpn_bbox_outside_weights_" + s],
                         "loss_rpn_bbox_" + s, beta=1.0 / 9, scale=spec.loss_scale)
        losses += ["loss_rpn_cls_" + s, "loss_rpn_bbox_" + s]
    return losses


def _head(net: core.Net, spec: Spec, fpn: list[str]) -> list[str]:
    scale = 1.0 / 2 ** levels(spec)[0]
    if spec.roi_method == "RoIPoolF":
        net.RoIPoolF([fpn[0], "rois"], ["roi_feat", "_argmax_roi_feat"], pooled_h=spec.pooled,
                     pooled_w=spec.pooled, spatial_scale=scale)
    else:
        net.RoIAlign([fpn[0], "rois"], "roi_feat", pooled_h=spec.pooled, pooled_w=spec.pooled,
                     spatial_scale=scale, sampling_ratio=2)
    net.FC(["roi_feat", "fc6_w", "fc6_b"], "fc6")
    net.Relu("fc6", "fc6")
    net.FC(["fc6", "fc7_w", "fc7_b"], "fc7")
    net.Relu("fc7", "fc7")
    net.FC(["fc7", "cls_score_w", "cls_score_b"], "cls_score")
    net.SoftmaxWithLoss(["cls_score", "labels_int32"], ["cls_prob", "loss_cls"],
                        scale=spec.loss_scale)
    net.FC(["fc7", "bbox_pred_w", "bbox_pred_b"], "bbox_pred")
    net.SmoothL1Loss(["bbox_pred", "bbox_targets", "bbox_inside_weights",
                      "bbox_outside_weights"], "loss_bbox", scale=spec.loss_scale)
    return ["loss_cls", "loss_bbox"]


def build_forward(spec: Spec, name: str = "mini_detectron") -> tuple[core.Net, list[str]]:
    """(forward net, loss blob names)."""
    net = core.Net(name)
    fpn = _fpn(net, spec, _body(net, spec))
    return net, _rpn(net, spec, fpn) + _head(net, spec, fpn)


def trainable(spec: Spec) -> list[str]:
    """Parameters that receive gradients: everything above the frozen res2 except the
    AffineChannel scales and biases (AffineChannel has no parameter gradients unless
    is_learnable=1, which Detectron never sets: they stay the frozen BN statistics)."""
    frozen = ("conv1_w", "res_conv1_bn", "res2_")
    return [p for p in _shapes(spec)
            if not p.startswith(frozen) and not p.endswith(("_bn_s", "_bn_b"))]


def param_names(spec: Spec) -> list[str]:
    return list(_shapes(spec))


# --- torch reference -------------------------------------------------------------------------
def _c_round(t: Any) -> Any:
    import torch

    return torch.sign(t) * torch.floor(torch.abs(t) + 0.5)


def _roi_pool_torch(feat: Any, rois: np.ndarray, scale: float, pooled: int) -> Any:
    """Fast R-CNN max pooling written with torch slices (windows as Caffe2 computes them)."""
    import torch

    out = []
    f32 = np.float32
    h, w = feat.shape[2], feat.shape[3]
    for roi in rois:
        b = int(roi[0])
        sw, sh, ew, eh = (int(_c_round(torch.tensor(float(f32(v) * f32(scale))))) for v in roi[1:])
        rw, rh = max(ew - sw + 1, 1), max(eh - sh + 1, 1)
        bh, bw = f32(rh) / f32(pooled), f32(rw) / f32(pooled)
        cells = []
        for i in range(pooled):
            row = []
            for j in range(pooled):
                h0 = min(max(int(math.floor(f32(i) * bh)) + sh, 0), h)
                h1 = min(max(int(math.ceil(f32(i + 1) * bh)) + sh, 0), h)
                w0 = min(max(int(math.floor(f32(j) * bw)) + sw, 0), w)
                w1 = min(max(int(math.ceil(f32(j + 1) * bw)) + sw, 0), w)
                if h1 <= h0 or w1 <= w0:
                    row.append(torch.zeros(feat.shape[1], dtype=feat.dtype))
                else:
                    row.append(feat[b, :, h0:h1, w0:w1].amax(dim=(1, 2)))
            cells.append(torch.stack(row, dim=-1))
        out.append(torch.stack(cells, dim=-2))
    return torch.stack(out)


def torch_forward(spec: Spec, params: dict[str, Any], feeds: dict[str, np.ndarray]) -> dict:
    """The same model in torch (float64): every named activation and loss."""
    import torch

    t = {k: torch.as_tensor(v) for k, v in feeds.items()}
    acts: dict[str, Any] = {}
    body = _torch_body(spec, params, t, acts)
    fpn = _torch_fpn_rpn(spec, params, t, body, acts)
    _torch_head(spec, params, t, feeds["rois"], fpn[0], acts)
    return acts


def _torch_affine(params: dict[str, Any], x: Any, prefix: str) -> Any:
    return x * params[prefix + "_s"][None, :, None, None] + \
        params[prefix + "_b"][None, :, None, None]


def _torch_body(spec: Spec, params: dict[str, Any], t: dict[str, Any],
                acts: dict[str, Any]) -> list[Any]:
    """The ResNet body: the output of every stage (stage 2 detached, as StopGradient)."""
    import torch.nn.functional as F

    def affine(x: Any, prefix: str) -> Any:
        return _torch_affine(params, x, prefix)

    x = affine(F.conv2d(t["data"], params["conv1_w"], stride=2, padding=3), "res_conv1_bn")
    x = F.max_pool2d(F.relu(x), 3, stride=2, padding=1)
    acts["pool1"] = x
    dim_in, body = spec.stem, []
    for k, (_, out, blocks) in enumerate(spec.stages, start=2):
        for b in range(blocks):
            p = f"res{k}_{b}"
            stride = 2 if (k > 2 and b == 0) else 1
            cur = F.relu(affine(F.conv2d(x, params[p + "_branch2a_w"], stride=stride),
                                p + "_branch2a_bn"))
            cur = F.relu(affine(F.conv2d(cur, params[p + "_branch2b_w"], padding=1),
                                p + "_branch2b_bn"))
            cur = affine(F.conv2d(cur, params[p + "_branch2c_w"]), p + "_branch2c_bn")
            short = x if dim_in == out else affine(
                F.conv2d(x, params[p + "_branch1_w"], stride=stride), p + "_branch1_bn")
            x = F.relu(cur + short)
            dim_in = out
            acts[p + "_sum"] = x
        if k == 2:
            x = x.detach()
        body.append(x)
    return body


def _torch_fpn_rpn(spec: Spec, params: dict[str, Any], t: dict[str, Any], body: list[Any],
                   acts: dict[str, Any]) -> list[Any]:
    """The FPN levels (returned) and the shared-weight RPN's logits and losses per level."""
    import torch.nn.functional as F

    lv = levels(spec)
    inner = {lv[-1]: F.conv2d(body[-1], params[f"fpn_inner_res{lv[-1]}_sum_w"],
                              params[f"fpn_inner_res{lv[-1]}_sum_b"])}
    for lvl in reversed(lv[:-1]):
        lat = F.conv2d(body[lvl - 2], params[f"fpn_inner_res{lvl}_sum_lateral_w"],
                       params[f"fpn_inner_res{lvl}_sum_lateral_b"])
        inner[lvl] = lat + F.interpolate(inner[lvl + 1], scale_factor=2, mode="nearest")
    fpn = [F.conv2d(inner[lvl], params[f"fpn_res{lvl}_sum_w"], params[f"fpn_res{lvl}_sum_b"],
                    padding=1) for lvl in lv]
    for lvl, f in zip(lv, fpn):
        acts[f"fpn_res{lvl}_sum"] = f
        s = f"fpn{lvl}"
        conv = F.relu(F.conv2d(f, params["conv_rpn_fpn2_w"], params["conv_rpn_fpn2_b"],
                               padding=1))
        logits = F.conv2d(conv, params["rpn_cls_logits_fpn2_w"], params["rpn_cls_logits_fpn2_b"])
        bbox = F.conv2d(conv, params["rpn_bbox_pred_fpn2_w"], params["rpn_bbox_pred_fpn2_b"])
        labels = t["rpn_labels_int32_" + s].to(logits.dtype)
        valid = (labels != -1).to(logits.dtype)
        xent = F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0), reduction="none")
        acts["loss_rpn_cls_" + s] = (xent * valid).sum() * spec.loss_scale / spec.rpn_batch \
            / spec.batch
        acts["loss_rpn_bbox_" + s] = _smooth_l1_torch(
            bbox, t["rpn_bbox_targets_" + s], t["rpn_bbox_inside_weights_" + s],
            t["rpn_bbox_outside_weights_" + s], 1.0 / 9) * spec.loss_scale
        acts["rpn_cls_logits_" + s] = logits
    return fpn


def _torch_head(spec: Spec, params: dict[str, Any], t: dict[str, Any], rois: np.ndarray,
                finest: Any, acts: dict[str, Any]) -> None:
    """RoIPoolF on the finest FPN level, the 2-FC head and its classification/box losses."""
    import torch.nn.functional as F

    if spec.roi_method != "RoIPoolF":
        raise ValueError("the torch reference pools with RoIPoolF only")
    feat = _roi_pool_torch(finest, rois, 1.0 / 2 ** levels(spec)[0], spec.pooled)
    acts["roi_feat"] = feat
    fc6 = F.relu(F.linear(feat.reshape(feat.shape[0], -1), params["fc6_w"], params["fc6_b"]))
    fc7 = F.relu(F.linear(fc6, params["fc7_w"], params["fc7_b"]))
    acts["fc7"] = fc7
    cls = F.linear(fc7, params["cls_score_w"], params["cls_score_b"])
    acts["cls_score"] = cls
    acts["loss_cls"] = F.cross_entropy(cls, t["labels_int32"].long()) * spec.loss_scale
    bbox = F.linear(fc7, params["bbox_pred_w"], params["bbox_pred_b"])
    acts["loss_bbox"] = _smooth_l1_torch(bbox, t["bbox_targets"], t["bbox_inside_weights"],
                                         t["bbox_outside_weights"], 1.0) * spec.loss_scale


def _smooth_l1_torch(pred: Any, target: Any, inside: Any, outside: Any, beta: float) -> Any:
    import torch

    d = inside * (pred - target)
    ad = torch.abs(d)
    per = torch.where(ad < beta, 0.5 * d * d / beta, ad - 0.5 * beta)
    return (outside * per).sum() / pred.shape[0]
