"""Spec §2: caffe2 ``scope`` module (NameScope, DeviceScope, Empty*Scope)."""

from __future__ import annotations

import threading

import pytest

from dpgraph import core, scope
from dpgraph.proto import caffe2_pb2


def test_separator_and_defaults() -> None:
    assert scope._NAMESCOPE_SEPARATOR == "/"
    assert scope.CurrentNameScope() == ""
    assert scope.CurrentDeviceScope() is None


def test_namescope_nesting_and_reset() -> None:
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
            assert scope.CurrentNameScope() == "gpu_0/sub/"
        with scope.NameScope(""):
            assert scope.CurrentNameScope() == "gpu_0/"
        with scope.NameScope(None):
            assert scope.CurrentNameScope() == "gpu_0/"
    assert scope.CurrentNameScope() == ""


def test_namescope_no_normalisation() -> None:
    with scope.NameScope("a/"):
        assert scope.CurrentNameScope() == "a//"


def test_namescope_rejects_non_string() -> None:
    with pytest.raises(AssertionError):
        with scope.NameScope(3):  # type: ignore[arg-type]
            pass


def test_namescope_restored_after_exception() -> None:
    with pytest.raises(ZeroDivisionError):
        with scope.NameScope("boom"):
            _ = 1 / 0
    assert scope.CurrentNameScope() == ""


def test_scopes_are_thread_local() -> None:
    seen: list[str] = []
    with scope.NameScope("main"):
        thread = threading.Thread(target=lambda: seen.append(scope.CurrentNameScope()))
        thread.start()
        thread.join()
    assert seen == [""]


def test_device_scope_copies_and_restores() -> None:
    option = core.DeviceOption(caffe2_pb2.CUDA, 1)
    with scope.DeviceScope(option):
        current = scope.CurrentDeviceScope()
        assert current == option
        assert current is not option  # a fresh DeviceOption
        with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
            assert scope.CurrentDeviceScope().device_type == caffe2_pb2.CPU
        assert scope.CurrentDeviceScope() == option
    assert scope.CurrentDeviceScope() is None


def test_device_scope_node_name_rules() -> None:
    with pytest.raises(AssertionError):
        with scope.DeviceScope(None):
            pass
    with pytest.raises(AssertionError):
        with scope.DeviceScope("gpu"):  # type: ignore[arg-type]
            pass
    with scope.DeviceScope(None, node_name="host1"):
        assert scope.CurrentDeviceScope().node_name == "host1"
        with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
            assert scope.CurrentDeviceScope().node_name == "host1"  # inherited
        with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0), node_name="host2"):
            assert scope.CurrentDeviceScope().node_name == "host2"  # explicit wins


def test_device_scope_extra_info_merged_sorted() -> None:
    outer = core.DeviceOption(caffe2_pb2.CPU, extra_info=["z", "b"])
    with scope.DeviceScope(outer):
        with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, extra_info=["a"])):
            assert list(scope.CurrentDeviceScope().extra_info) == ["a", "b", "z"]
        with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, extra_info=["b"])):
            assert list(scope.CurrentDeviceScope().extra_info) == ["b", "b", "z"]


def test_empty_scopes() -> None:
    with scope.NameScope("n"), scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
        with scope.EmptyDeviceScope():
            assert scope.CurrentDeviceScope() is None
            assert scope.CurrentNameScope() == "n/"
        with scope.EmptyNameScope():
            assert scope.CurrentNameScope() == ""
        assert scope.CurrentDeviceScope() is not None
        assert scope.CurrentNameScope() == "n/"


def test_core_aliases() -> None:
    assert core.NameScope is scope.NameScope
    assert core.DeviceScope is scope.DeviceScope
