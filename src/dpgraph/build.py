"""Caffe2's ``build``: the build options of this (pure-Python) build."""

from dpgraph.runtime import c_api as C

CAFFE2_NO_OPERATOR_SCHEMA = C.define_caffe2_no_operator_schema
build_options = C.get_build_options()

__all__ = ["CAFFE2_NO_OPERATOR_SCHEMA", "build_options"]
