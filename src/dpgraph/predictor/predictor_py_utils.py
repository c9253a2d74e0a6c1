"""Caffe2's ``predictor.predictor_py_utils`` (re-exported from :mod:`dpgraph.export.metanet`)."""

from dpgraph.export.metanet import *  # noqa: F403
from dpgraph.export.metanet import __all__, _ProtoMapGet  # noqa: F401
