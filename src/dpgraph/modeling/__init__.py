"""Model building: ModelHelper, brew helpers, parameter initialisers and optimizers."""

from dpgraph.modeling.initializers import (
    ExternalInitializer,
    Initializer,
    PseudoFP16Initializer,
    ReversePseudoFP16Initializer,
    update_initializer,
)
from dpgraph.modeling.optimizer_context import DEFAULT_OPTIM, OptimizerContext, UseOptimizer
from dpgraph.modeling.parameter_info import ParameterInfo, ParameterTags
from dpgraph.modeling.parameter_sharing import ParameterSharing, parameter_sharing_context

__all__ = [
    "DEFAULT_OPTIM", "ExternalInitializer", "Initializer", "OptimizerContext", "ParameterInfo",
    "ParameterSharing", "ParameterTags", "PseudoFP16Initializer", "ReversePseudoFP16Initializer",
    "UseOptimizer", "parameter_sharing_context", "update_initializer",
]
