"""The cost model and planner of data-parallel gradient synchronisation.

:mod:`.cost_model` (alpha-beta figures per backend), :mod:`.profile` (FLOPs and gradient
timeline of a step), :mod:`.planner` (predicted step times, bucket sizes for ``"auto"``),
:mod:`.calibrate` (measurements) and :mod:`.command` (``dpgraph plan``).
"""

from dpgraph.parallel.plan.cost_model import AlphaBeta, CostModel, load
from dpgraph.parallel.plan.planner import (
    Prediction,
    best_bucket_bytes,
    predict,
    scaling_table,
)
from dpgraph.parallel.plan.profile import StepProfile, profile_from_nets, resnet50_profile

__all__ = ["AlphaBeta", "CostModel", "Prediction", "StepProfile", "best_bucket_bytes", "load",
           "predict", "profile_from_nets", "resnet50_profile", "scaling_table"]
