"""Caffe2's ``predictor`` package: predictor_exporter, predictor_py_utils,
mobile_exporter and serde."""
