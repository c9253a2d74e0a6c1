"""Caffe2's ``serialized_test`` package (see :mod:`.serialized_test_util`)."""
