"""Caffe2's ``model_helper`` module."""

from dpgraph.modeling.model_helper import (
    ExtractPredictorNet,
    ModelHelper,
    _known_working_ops,
)
from dpgraph.modeling.parameter_info import ParameterInfo, ParameterTags

__all__ = ["ExtractPredictorNet", "ModelHelper", "ParameterInfo", "ParameterTags",
           "_known_working_ops"]
