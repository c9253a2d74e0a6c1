"""Caffe2's ``predictor.predictor_exporter`` (from :mod:`dpgraph.export.predictor_exporter`)."""

from dpgraph.export.metanet import AddBlobs, AddNet, GetBlobs, GetNet, GetPlan  # noqa: F401
from dpgraph.export.predictor_exporter import *  # noqa: F403
from dpgraph.export.predictor_exporter import __all__, _global_init_net  # noqa: F401
from dpgraph.predictor import predictor_py_utils as utils  # noqa: F401
from dpgraph.proto import metanet_pb2  # noqa: F401
