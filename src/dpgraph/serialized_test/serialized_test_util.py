"""Caffe2's ``serialized_test_util``: ``given`` and SerializedTestCase (plus the output
context Caffe2's operator_test/conftest.py configures: ``-G``, ``-O``, ``-D``, ``-C``)."""

from dpgraph.jobs.serialized_test_util import (
    DATA_DIR,
    DATA_SUFFIX,
    SerializedTestCase,
    _output_context,
    given,
    operator_test_type,
    testWithArgs,
)

__all__ = ["DATA_DIR", "DATA_SUFFIX", "SerializedTestCase", "_output_context", "given",
           "operator_test_type", "testWithArgs"]
