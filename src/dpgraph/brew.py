"""Caffe2's ``brew`` module: this module object is replaced by the shared HelperWrapper,
so ``brew.fc(model, ...)``, ``brew.arg_scope``, ``brew.Register`` and ``brew.has_helper``
work as in Caffe2."""

import sys

from dpgraph.modeling.brew import brew as _brew

_brew.__dict__["wrapped"] = sys.modules[__name__]
sys.modules[__name__] = _brew  # type: ignore[assignment]
