"""Caffe2's ``operator_test`` package: the helper modules its operator tests import
(``caffe2.python.operator_test.<helper>``); the tests themselves are Caffe2's."""
