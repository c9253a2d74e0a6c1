"""Caffe2's ``crf_predict`` module: Viterbi re-ranking of CRF predictions with ops."""

from dpgraph.modeling.crf import CRFWithLoss, apply_crf, crf_update_predictions

__all__ = ["CRFWithLoss", "apply_crf", "crf_update_predictions"]
