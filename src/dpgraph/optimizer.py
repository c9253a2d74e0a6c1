"""Caffe2's ``optimizer`` module (re-exported from :mod:`dpgraph.modeling.optimizer`)."""

from dpgraph.modeling.optimizer import *  # noqa: F403
from dpgraph.modeling.optimizer import (  # noqa: F401
    _LEARNING_RATE_INJECTION,
    __all__,
    _build,
    _calc_norm_ratio,
    _get_param_to_device,
    _optimizer_instance_count,
)
from dpgraph.modeling.optimizer_context import (  # noqa: F401
    DEFAULT_OPTIM,
    OptimizerContext,
    UseOptimizer,
)
