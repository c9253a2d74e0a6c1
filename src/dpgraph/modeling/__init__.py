"""Model building: ModelHelper, brew helpers, parameter initialisers and optimizers."""

from dpgraph.modeling.initializers import (
    ExternalInitializer,
    Initializer,
    PseudoFP16Initializer,
    ReversePseudoFP16Initializer,
    update_initializer,
)
from dpgraph.modeling.parameter_info import ParameterInfo, ParameterTags

__all__ = [
    "ExternalInitializer", "Initializer", "ParameterInfo", "ParameterTags",
    "PseudoFP16Initializer", "ReversePseudoFP16Initializer", "update_initializer",
]
