"""Caffe2's ``scope`` module: name and device scopes."""

from dpgraph.ir.scope import (
    _NAMESCOPE_SEPARATOR,
    CurrentDeviceScope,
    CurrentNameScope,
    DeviceScope,
    EmptyDeviceScope,
    EmptyNameScope,
    NameScope,
)

__all__ = [
    "_NAMESCOPE_SEPARATOR", "CurrentDeviceScope", "CurrentNameScope", "DeviceScope",
    "EmptyDeviceScope", "EmptyNameScope", "NameScope",
]
