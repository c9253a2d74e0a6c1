"""Caffe2's ``modeling.gradient_clipping``: clip dense gradients in place, by norm or value.

By norm, per gradient ``g`` of ``param``::

    n = LpNorm(g, p)            (p = 1, or 2 followed by Pow(exponent=0.5))
    [m = the same norm of param, when use_parameter_norm; with compute_norm_ratio
     also Div([n, m]) -> <param>_norm_ratio]
    ClipTensorByScaling([g, n(, m)], [g], threshold=clip_threshold)

so g is scaled down to norm ``clip_threshold`` (times ‖param‖ with use_parameter_norm). By
value: ``Clip(g, g, min=clip_min, max=clip_max)``. Sparse gradients are left alone.
"""

from __future__ import annotations

from typing import Any

import dpgraph.ops.lp_norm  # noqa: F401 - registers LpNorm
from dpgraph.errors import ModelConfigError
from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.device import CPU, DeviceOption
from dpgraph.ir.scope import DeviceScope
from dpgraph.modeling.net_modifier import NetModifier
from dpgraph.modeling.optimizer.build import get_param_device


class GradientClipping(NetModifier):
    L1_NORM = "l1_norm"
    L2_NORM = "l2_norm"
    BY_NORM = "by_norm"
    BY_VALUE = "by_value"
    GRAD_CLIP_METHODS = [BY_NORM, BY_VALUE]
    CLIP_GRADIENT_NORM_TYPES = [L2_NORM, L1_NORM]

    def __init__(self, grad_clip_method: str, clip_norm_type: str = "l2_norm",
                 clip_threshold: float = 0.1, use_parameter_norm: bool = False,
                 compute_norm_ratio: bool = False, clip_max: float = 1, clip_min: float = -1,
                 blobs_to_include: Any = None, blobs_to_exclude: Any = None) -> None:
        """``grad_clip_method`` is "by_norm" (``clip_norm_type`` "l2_norm" or "l1_norm",
        ``clip_threshold``, ``use_parameter_norm``, ``compute_norm_ratio``) or "by_value"
        (``clip_min``/``clip_max``); ``blobs_to_include`` / ``blobs_to_exclude`` pick the
        params (default: every param of the grad map)."""
        if grad_clip_method not in self.GRAD_CLIP_METHODS:
            raise ModelConfigError(
                f"This method of clipping, {grad_clip_method}, has not been implemented; "
                f"use one of {self.GRAD_CLIP_METHODS}")
        if clip_norm_type not in self.CLIP_GRADIENT_NORM_TYPES:
            raise ModelConfigError(
                f"This method of clipping, {clip_norm_type}, has not been implemented; use "
                f"one of {self.CLIP_GRADIENT_NORM_TYPES}")
        self.grad_clip_method = grad_clip_method
        self.clip_norm_type = clip_norm_type
        self.clip_threshold = float(clip_threshold)
        self.use_parameter_norm = use_parameter_norm
        self.compute_norm_ratio = compute_norm_ratio
        self.clip_max = float(clip_max)
        self.clip_min = float(clip_min)
        self.blobs_to_include = blobs_to_include
        self.blobs_to_exclude = blobs_to_exclude

    def _selected(self, net: Any, grad_map: Any) -> dict[Any, Any]:
        if self.blobs_to_include is None:
            selected = dict(grad_map)
        else:
            selected = {}
            for blob in self.blobs_to_include:
                param = BlobReference(blob)
                if not net.BlobIsDefined(param):
                    raise ModelConfigError(
                        f"param {param} is not defined in net {net.Name()}: "
                        "blobs_to_include must name params of the net")
                selected[param] = grad_map[param]
        for blob in self.blobs_to_exclude or ():
            selected.pop(blob, None)
        return selected

    def _norm(self, net: Any, blob: Any, p: int) -> Any:
        norm = net.LpNorm([blob], net.NextScopedBlob(prefix=f"{blob}_l{p}_norm"), p=p)
        return net.Pow([norm], exponent=0.5) if p == 2 else norm

    def _clip_by_norm(self, net: Any, param: Any, grad: Any) -> None:
        p = 2 if self.clip_norm_type == self.L2_NORM else 1
        grad_norm = self._norm(net, grad, p)
        inputs = [grad, grad_norm]
        if self.use_parameter_norm:
            param_norm = self._norm(net, param, p)
            inputs.append(param_norm)
            if self.compute_norm_ratio:
                net.Div([grad_norm, param_norm],
                        [net.NextScopedBlob(prefix=f"{param}_norm_ratio")])
        net.ClipTensorByScaling(inputs, [grad], threshold=self.clip_threshold)

    def modify_net(self, net: Any, init_net: Any = None, grad_map: Any = None,
                   blob_to_device: Any = None, modify_output_record: bool = False) -> None:
        if grad_map is None:
            raise ModelConfigError("GradientClipping needs grad_map (param -> gradient)")
        for param, grad in self._selected(net, grad_map).items():
            if isinstance(grad, GradientSlice):  # sparse gradients are not clipped
                continue
            device = get_param_device(str(param), grad_map[str(param)],
                                      param_to_device=blob_to_device,
                                      default_device=DeviceOption(CPU))
            with DeviceScope(device):
                if self.grad_clip_method == self.BY_NORM:
                    self._clip_by_norm(net, param, grad)
                else:
                    net.Clip([grad], [grad], max=self.clip_max, min=self.clip_min)
