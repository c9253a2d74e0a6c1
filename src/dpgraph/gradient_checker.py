"""Caffe2's ``gradient_checker``: numeric gradient checks of ops and nets."""

from dpgraph.jobs.gradient_checker import (
    GradientChecker,
    NetGradientChecker,
    getGradientForOp,
)

__all__ = ["GradientChecker", "NetGradientChecker", "getGradientForOp"]
