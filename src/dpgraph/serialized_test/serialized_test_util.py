"""Caffe2's ``serialized_test_util``: ``given`` and SerializedTestCase."""

from dpgraph.jobs.serialized_test_util import (
    DATA_DIR,
    SerializedTestCase,
    given,
    operator_test_type,
    testWithArgs,
)

__all__ = ["DATA_DIR", "SerializedTestCase", "given", "operator_test_type", "testWithArgs"]
