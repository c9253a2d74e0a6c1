"""Name and device scopes."""

from __future__ import annotations

import threading

import pytest

from dpgraph import scope
from dpgraph.core import DeviceOption
from dpgraph.errors import ScopeError
from dpgraph.proto import caffe2_pb2


def test_name_scope_nesting_and_reset() -> None:
    assert scope.CurrentNameScope() == ""
    with scope.NameScope("gpu_0"):
        assert scope.CurrentNameScope() == "gpu_0/"
        with scope.NameScope("sub"):
            assert scope.CurrentNameScope() == "gpu_0/sub/"
            with scope.NameScope("x", reset=True):
                assert scope.CurrentNameScope() == "x/"
            with scope.NameScope("", reset=True):
                assert scope.CurrentNameScope() == ""
            with scope.NameScope(None, reset=True):
                assert scope.CurrentNameScope() == ""
        with scope.NameScope(""):
            assert scope.CurrentNameScope() == "gpu_0/"
    assert scope.CurrentNameScope() == ""


def test_name_scope_does_not_normalise_trailing_slash() -> None:
    with scope.NameScope("a/"):
        assert scope.CurrentNameScope() == "a//"


def test_name_scope_restored_on_exception() -> None:
    with pytest.raises(RuntimeError), scope.NameScope("boom"):
        raise RuntimeError
    assert scope.CurrentNameScope() == ""


def test_name_scope_rejects_non_string() -> None:
    with pytest.raises(ScopeError), scope.NameScope(3):  # type: ignore[arg-type]
        pass
    with pytest.raises(AssertionError), scope.NameScope(3):  # type: ignore[arg-type]
        pass


def test_device_scope_inherits_node_name_and_merges_extra_info() -> None:
    outer = DeviceOption(caffe2_pb2.CPU, node_name="node1", extra_info=["b"])
    with scope.DeviceScope(outer):
        inner = DeviceOption(caffe2_pb2.CUDA, 1, extra_info=["a"])
        with scope.DeviceScope(inner):
            current = scope.CurrentDeviceScope()
            assert current is not None
            assert (current.device_type, current.device_id) == (caffe2_pb2.CUDA, 1)
            assert current.node_name == "node1"
            assert list(current.extra_info) == ["a", "b"]
        with scope.DeviceScope(DeviceOption(caffe2_pb2.CUDA, 2), node_name="n2"):
            assert scope.CurrentDeviceScope().node_name == "n2"  # type: ignore[union-attr]
        with scope.EmptyDeviceScope():
            assert scope.CurrentDeviceScope() is None
    assert scope.CurrentDeviceScope() is None


def test_device_scope_requires_device_option_or_node_name() -> None:
    with pytest.raises(ScopeError), scope.DeviceScope(None):
        pass
    with pytest.raises(ScopeError), scope.DeviceScope("gpu"):  # type: ignore[arg-type]
        pass
    with scope.DeviceScope(None, node_name="host"):
        assert scope.CurrentDeviceScope().node_name == "host"  # type: ignore[union-attr]


def test_empty_name_scope() -> None:
    with scope.NameScope("a"), scope.EmptyNameScope():
        assert scope.CurrentNameScope() == ""


def test_scopes_are_per_thread() -> None:
    seen: list[str] = []
    with scope.NameScope("main"):
        thread = threading.Thread(target=lambda: seen.append(scope.CurrentNameScope()))
        thread.start()
        thread.join()
    assert seen == [""]
