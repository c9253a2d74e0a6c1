"""Wire compatibility of dpgraph's caffe2.proto with Caffe2's schema."""

from __future__ import annotations

import pytest
from _golden import golden_root

from dpgraph.errors import ProtoError
from dpgraph.ir.proto_io import parse_proto
from dpgraph.proto import caffe2_pb2


def test_device_type_aliases() -> None:
    assert (caffe2_pb2.CPU, caffe2_pb2.CUDA, caffe2_pb2.MKLDNN, caffe2_pb2.OPENGL,
            caffe2_pb2.OPENCL, caffe2_pb2.IDEEP, caffe2_pb2.HIP) == (0, 1, 2, 3, 4, 5, 6)
    assert caffe2_pb2.PROTO_CUDA == caffe2_pb2.CUDA


def test_tensor_proto_bytes_packed_and_unpacked() -> None:
    tensor = caffe2_pb2.TensorProto(dims=[2, 3], data_type=caffe2_pb2.TensorProto.FLOAT,
                                    float_data=[1.0, 2.0])
    # dims: field 1 varints, one tag per element (unpacked)
    # data_type: field 2 varint 1; float_data: field 3, packed, 8 bytes little-endian
    assert tensor.SerializeToString() == bytes(
        [0x08, 0x02, 0x08, 0x03, 0x10, 0x01, 0x1A, 0x08,
         0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40])


def test_int32_data_packed_with_negative_values() -> None:
    tensor = caffe2_pb2.TensorProto(int32_data=[1, -1])
    assert tensor.SerializeToString() == bytes([0x22, 0x0B, 0x01] + [0xFF] * 9 + [0x01])


def test_argument_ints_unpacked() -> None:
    argument = caffe2_pb2.Argument(name="a", ints=[1, 2], floats=[0.5])
    expected = bytes([0x0A, 0x01, 0x61,              # name
                      0x2D, 0x00, 0x00, 0x00, 0x3F,  # floats: field 5, fixed32, unpacked
                      0x30, 0x01, 0x30, 0x02])       # ints: field 6, varint, unpacked
    assert argument.SerializeToString() == expected


def test_net_def_hand_worked_bytes() -> None:
    net = caffe2_pb2.NetDef(name="n")
    op = net.op.add(type="Relu", input=["x"], output=["y"])
    op.device_option.device_type = caffe2_pb2.CUDA
    op.device_option.device_id = 0
    net.external_input.append("x")
    op_bytes = bytes([0x0A, 0x01, 0x78, 0x12, 0x01, 0x79, 0x22, 0x04]) + b"Relu" + bytes(
        [0x32, 0x04, 0x08, 0x01, 0x10, 0x00])
    expected = (bytes([0x0A, 0x01, 0x6E, 0x12, len(op_bytes)]) + op_bytes
                + bytes([0x3A, 0x01, 0x78]))
    assert net.SerializeToString() == expected
    assert caffe2_pb2.NetDef.FromString(expected) == net


def test_device_id_presence_is_kept() -> None:
    option = caffe2_pb2.DeviceOption(device_type=0, device_id=0)
    assert option.SerializeToString() == bytes([0x08, 0x00, 0x10, 0x00])
    assert caffe2_pb2.DeviceOption().SerializeToString() == b""


def test_every_golden_proto_round_trips_to_identical_bytes() -> None:
    root = golden_root()
    files = sorted(root.glob("*/op.pb")) + sorted(root.glob("*/grad_*.pb"))
    assert len(files) > 152
    for path in files:
        data = path.read_bytes()
        op = caffe2_pb2.OperatorDef.FromString(data)
        assert op.type, path
        assert op.SerializeToString() == data, path


def test_malformed_bytes_raise_typed_error() -> None:
    with pytest.raises(ProtoError, match="NetDef"):
        parse_proto(caffe2_pb2.NetDef, b"\x0a\xff\xff", "broken.pb")
