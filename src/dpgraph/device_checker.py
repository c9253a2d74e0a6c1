"""Caffe2's ``device_checker``: DeviceChecker."""

from dpgraph.jobs.device_checker import DeviceChecker

__all__ = ["DeviceChecker"]
