"""utils.MakeArgument encodes every value kind exactly as Caffe2."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph.errors import ArgumentError
from dpgraph.proto import caffe2_pb2
from dpgraph.utils import MakeArgument


def fields(argument: caffe2_pb2.Argument) -> set[str]:
    return {f.name for f, _ in argument.ListFields()} - {"name"}


@pytest.mark.parametrize("value, field, expected", [
    (1.5, "f", 1.5),
    (3, "i", 3),
    (True, "i", 1),
    (False, "i", 0),
    ("NCHW", "s", b"NCHW"),
    (b"raw", "s", b"raw"),
    (np.float32(2.0), "f", 2.0),
    (np.int64(7), "i", 7),
])
def test_scalars(value: object, field: str, expected: object) -> None:
    argument = MakeArgument("k", value)
    assert argument.name == "k"
    assert fields(argument) == {field}
    assert getattr(argument, field) == expected


@pytest.mark.parametrize("value, field, expected", [
    ([1.0, 2.5], "floats", [1.0, 2.5]),
    ([1, 2], "ints", [1, 2]),
    ([True, False], "ints", [1, 0]),
    (["a", b"b"], "strings", [b"a", b"b"]),
    (np.array([1.0, 2.0], dtype=np.float32), "floats", [1.0, 2.0]),
    (np.array([[1, 2], [3, 4]]), "ints", [1, 2, 3, 4]),
    ((4, 5), "ints", [4, 5]),
])
def test_iterables(value: object, field: str, expected: list[object]) -> None:
    argument = MakeArgument("k", value)
    assert fields(argument) == {field}
    assert list(getattr(argument, field)) == expected


def test_empty_list_sets_only_the_name() -> None:
    argument = MakeArgument("k", [])
    assert fields(argument) == set()


def test_netdef_and_messages() -> None:
    net = caffe2_pb2.NetDef(name="sub")
    assert MakeArgument("n", net).n == net
    assert list(MakeArgument("ns", [net, net]).nets) == [net, net]
    option = caffe2_pb2.DeviceOption(device_type=1)
    assert MakeArgument("d", option).s == option.SerializeToString()
    assert list(MakeArgument("ds", [option]).strings) == [option.SerializeToString()]


@pytest.mark.parametrize("value", [object(), {"a": 1}, [1, "a"], None])
def test_unsupported_values_raise_typed_error(value: object) -> None:
    with pytest.raises(ArgumentError, match="'k'"):
        MakeArgument("k", value)
    with pytest.raises(ValueError):
        MakeArgument("k", value)
