"""Caffe2's ``test_util``: TestCase and test helpers."""

from dpgraph.jobs.test_util import (
    TestCase,
    caffe2_flaky,
    get_default_test_flags,
    is_flaky_test_mode,
    numOps,
    rand_array,
    randBlob,
    randBlobFloat32,
    randBlobsFloat32,
    str_compare,
)

__all__ = ["TestCase", "caffe2_flaky", "get_default_test_flags", "is_flaky_test_mode",
           "numOps", "randBlob", "randBlobFloat32", "randBlobsFloat32", "rand_array",
           "str_compare"]
