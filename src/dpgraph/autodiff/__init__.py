"""Autodiff over NetDefs: Caffe2's gradient registry and backward pass.

``GetBackwardPass(ops, ys)`` returns the gradient ops and ``{blob: gradient}``;
``Net.AddGradientOperators`` appends them to a net.  Gradient makers live with their op
families; Python makers can be added through ``GradientRegistry.RegisterGradient``.
"""

from dpgraph.autodiff.accumulate import GradGenMeta, SparseGradGenMeta
from dpgraph.autodiff.backward import IR, GetBackwardPass
from dpgraph.autodiff.registry import GRADIENT_REGISTRY, GradientRegistry
from dpgraph.autodiff.ssa import OpSSA

__all__ = [
    "GRADIENT_REGISTRY", "GetBackwardPass", "GradGenMeta", "GradientRegistry", "IR", "OpSSA",
    "SparseGradGenMeta",
]

from dpgraph.ir.registry import NET_EXTENSIONS  # noqa: E402

# Net.AddGradientOperators (in the ir layer, below autodiff) finds the backward pass here.
NET_EXTENSIONS.register("backward_pass", GetBackwardPass)
