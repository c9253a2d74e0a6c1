"""Caffe2's ``predictor_constants``: ``predictor_constants``, an empty PredictorConsts whose
fields read as the constants (``predictor_constants.PREDICT_NET_TYPE``)."""

from dpgraph.export.predictor_exporter import predictor_constants

__all__ = ["predictor_constants"]
