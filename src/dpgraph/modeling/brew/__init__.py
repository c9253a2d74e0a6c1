"""brew: layer helpers that create parameters and ops on a ModelHelper.

``dpgraph.brew`` (the Caffe2-named facade) is the :data:`brew` HelperWrapper instance::

    from dpgraph import brew
    fc1 = brew.fc(model, "data", "fc1", dim_in=4, dim_out=8)
    with brew.arg_scope([brew.conv], stride=2):
        brew.conv(model, "x", "y", 3, 16, kernel=3)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpgraph.modeling.brew import (
    algebra,
    array_helpers,
    control_ops,
    conv,
    db_input,
    dropout,
    elementwise_linear,
    fc,
    nonlinearity,
    normalization,
    pooling,
    train,
)
from dpgraph.modeling.brew.arg_scope import arg_scope, get_current_scope
from dpgraph.modeling.brew.wrapper import HelperWrapper

_HELPERS: list[Callable[..., Any]] = [
    arg_scope,
    fc.fc, fc.packed_fc, fc.fc_decomp, fc.fc_sparse, fc.fc_prune,
    dropout.dropout,
    pooling.max_pool, pooling.average_pool, pooling.max_pool_with_index,
    normalization.lrn, normalization.softmax, normalization.instance_norm,
    normalization.spatial_bn, normalization.spatial_gn, normalization.layer_norm,
    normalization.moments_with_running_stats,
    nonlinearity.relu, nonlinearity.prelu, nonlinearity.tanh, nonlinearity.sigmoid,
    array_helpers.concat, array_helpers.depth_concat,
    algebra.sum, algebra.reduce_sum, algebra.sub, algebra.arg_min, algebra.transpose,
    algebra.mat_mul, algebra.batch_mat_mul,
    train.iter, train.accuracy, train.add_weight_decay,
    conv.conv, conv.conv_nd, conv.conv_transpose, conv.group_conv,
    conv.group_conv_deprecated,
    db_input.image_input, db_input.video_input, db_input.db_input,
    elementwise_linear.elementwise_linear,
    control_ops.cond, control_ops.loop,
]


def default_registry() -> dict[str, Callable[..., Any]]:
    """``{name: helper}`` of every built-in helper."""
    return {helper.__name__: helper for helper in _HELPERS}


#: The shared helper wrapper that ``dpgraph.brew`` stands for.
brew = HelperWrapper(None, default_registry())

__all__ = ["HelperWrapper", "arg_scope", "brew", "default_registry", "get_current_scope"]
