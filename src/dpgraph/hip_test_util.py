"""Caffe2's ``hip_test_util``: whether a hypothesis test runs on HIP devices."""

from dpgraph.jobs.hypothesis_test_util import run_in_hip

__all__ = ["run_in_hip"]
