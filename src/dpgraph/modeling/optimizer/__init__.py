"""Caffe2's ``optimizer`` module: optimizers and the ``build_*`` helpers."""

from dpgraph.modeling.optimizer.adaptive import (
    AdagradOptimizer,
    AdamOptimizer,
    FtrlOptimizer,
    RmsPropOptimizer,
    YellowFinOptimizer,
)
from dpgraph.modeling.optimizer.base import (
    _LEARNING_RATE_INJECTION,
    FP16_ENGINES,
    ITERATION_MUTEX_LR_NAME,
    ITERATION_MUTEX_NAME,
    OPTIMIZER_ITERATION_LR_NAME,
    OPTIMIZER_ITERATION_NAME,
    AuxOptimizerParams,
    BuildUniqueMutexIter,
    Optimizer,
    _optimizer_instance_count,
    reset_optimizer_instance_count,
)
from dpgraph.modeling.optimizer.build import (
    _build,
    _calc_norm_ratio,
    _get_param_to_device,
    add_weight_decay,
    build_adadelta,
    build_adagrad,
    build_adam,
    build_decay_adagrad,
    build_fp16_sgd,
    build_ftrl,
    build_gftrl,
    build_multi_precision_sgd,
    build_rms_prop,
    build_sgd,
    build_storm,
    build_wngrad,
    build_yellowfin,
    get_lr_injection,
    get_param_device,
    set_lr_injection,
)
from dpgraph.modeling.optimizer.final import (
    AdadeltaOptimizer,
    DecayAdagradOptimizer,
    GFtrlOptimizer,
    StormOptimizer,
    WngradOptimizer,
)
from dpgraph.modeling.optimizer.sgd import (
    FP16SgdOptimizer,
    MultiPrecisionSgdOptimizer,
    SgdOptimizer,
    WeightDecayBuilder,
)

__all__ = [
    "AdadeltaOptimizer", "DecayAdagradOptimizer", "GFtrlOptimizer", "StormOptimizer",
    "WngradOptimizer", "build_adadelta", "build_decay_adagrad", "build_gftrl", "build_storm",
    "build_wngrad", "FP16_ENGINES",
    "AdagradOptimizer", "AdamOptimizer", "AuxOptimizerParams", "BuildUniqueMutexIter",
    "FP16SgdOptimizer", "FtrlOptimizer", "ITERATION_MUTEX_NAME", "MultiPrecisionSgdOptimizer",
    "ITERATION_MUTEX_LR_NAME", "OPTIMIZER_ITERATION_LR_NAME", "OPTIMIZER_ITERATION_NAME",
    "Optimizer", "RmsPropOptimizer", "SgdOptimizer",
    "WeightDecayBuilder", "YellowFinOptimizer", "_LEARNING_RATE_INJECTION", "_build",
    "_calc_norm_ratio", "_get_param_to_device", "_optimizer_instance_count", "add_weight_decay",
    "build_adagrad", "build_adam", "build_fp16_sgd", "build_ftrl", "build_multi_precision_sgd",
    "build_rms_prop", "build_sgd", "build_yellowfin", "get_lr_injection", "get_param_device",
    "reset_optimizer_instance_count", "set_lr_injection",
]
