"""Spec §1: caffe2_pb2 message schema (field numbers, labels, packing, defaults, enums)."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2

from dpgraph.proto import caffe2_pb2

T = descriptor_pb2.FieldDescriptorProto
OPT, REP, REQ = T.LABEL_OPTIONAL, T.LABEL_REPEATED, T.LABEL_REQUIRED


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    caffe2_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def _message_proto(path: str) -> descriptor_pb2.DescriptorProto:
    names = path.split(".")
    current = {m.name: m for m in _file_proto().message_type}[names[0]]
    for name in names[1:]:
        current = {m.name: m for m in current.nested_type}[name]
    return current


# message -> [(number, label, type, name, packed)]
SCHEMA = {
    "TensorProto": [
        (1, REP, T.TYPE_INT64, "dims", False), (2, OPT, T.TYPE_ENUM, "data_type", False),
        (3, REP, T.TYPE_FLOAT, "float_data", True), (4, REP, T.TYPE_INT32, "int32_data", True),
        (5, OPT, T.TYPE_BYTES, "byte_data", False), (6, REP, T.TYPE_BYTES, "string_data", False),
        (7, OPT, T.TYPE_STRING, "name", False), (8, OPT, T.TYPE_MESSAGE, "device_detail", False),
        (9, REP, T.TYPE_DOUBLE, "double_data", True), (10, REP, T.TYPE_INT64, "int64_data", True),
        (11, OPT, T.TYPE_MESSAGE, "segment", False), (13, OPT, T.TYPE_BYTES, "raw_data", False),
        (15, OPT, T.TYPE_UINT32, "data_format", False),
    ],
    "QTensorProto": [
        (1, REP, T.TYPE_INT64, "dims", False), (2, REQ, T.TYPE_INT32, "precision", False),
        (3, REQ, T.TYPE_DOUBLE, "scale", False), (4, REQ, T.TYPE_DOUBLE, "bias", False),
        (5, REQ, T.TYPE_BOOL, "is_signed", False), (6, REP, T.TYPE_INT32, "data", True),
        (7, OPT, T.TYPE_STRING, "name", False), (8, OPT, T.TYPE_ENUM, "data_type", False),
        (9, REP, T.TYPE_DOUBLE, "scales", False), (10, REP, T.TYPE_DOUBLE, "biases", False),
        (11, OPT, T.TYPE_INT32, "axis", False), (12, OPT, T.TYPE_BOOL, "is_multiparam", False),
    ],
    "TensorProtos": [(1, REP, T.TYPE_MESSAGE, "protos", False)],
    "TensorShape": [
        (1, REP, T.TYPE_INT64, "dims", False), (2, OPT, T.TYPE_ENUM, "data_type", False),
        (3, REP, T.TYPE_INT32, "unknown_dims", False),
        (4, OPT, T.TYPE_BOOL, "unknown_shape", False), (5, OPT, T.TYPE_STRING, "name", False),
    ],
    "TensorShapes": [(1, REP, T.TYPE_MESSAGE, "shapes", False)],
    "Argument": [
        (1, OPT, T.TYPE_STRING, "name", False), (2, OPT, T.TYPE_FLOAT, "f", False),
        (3, OPT, T.TYPE_INT64, "i", False), (4, OPT, T.TYPE_BYTES, "s", False),
        (5, REP, T.TYPE_FLOAT, "floats", False), (6, REP, T.TYPE_INT64, "ints", False),
        (7, REP, T.TYPE_BYTES, "strings", False), (8, OPT, T.TYPE_MESSAGE, "n", False),
        (9, REP, T.TYPE_MESSAGE, "nets", False), (10, OPT, T.TYPE_MESSAGE, "t", False),
        (11, REP, T.TYPE_MESSAGE, "tensors", False), (12, REP, T.TYPE_MESSAGE, "qtensors", False),
    ],
    "DeviceOption": [
        (1, OPT, T.TYPE_INT32, "device_type", False), (2, OPT, T.TYPE_INT32, "device_id", False),
        (3, OPT, T.TYPE_UINT32, "random_seed", False), (4, OPT, T.TYPE_STRING, "node_name", False),
        (5, OPT, T.TYPE_INT32, "numa_node_id", False),
        (6, REP, T.TYPE_STRING, "extra_info", False),
    ],
    "OperatorDef": [
        (1, REP, T.TYPE_STRING, "input", False), (2, REP, T.TYPE_STRING, "output", False),
        (3, OPT, T.TYPE_STRING, "name", False), (4, OPT, T.TYPE_STRING, "type", False),
        (5, REP, T.TYPE_MESSAGE, "arg", False), (6, OPT, T.TYPE_MESSAGE, "device_option", False),
        (7, OPT, T.TYPE_STRING, "engine", False),
        (8, REP, T.TYPE_STRING, "control_input", False),
        (9, OPT, T.TYPE_BOOL, "is_gradient_op", False),
        (10, OPT, T.TYPE_STRING, "debug_info", False), (11, OPT, T.TYPE_STRING, "domain", False),
        (12, OPT, T.TYPE_INT64, "op_version", False),
    ],
    "NetDef": [
        (1, OPT, T.TYPE_STRING, "name", False), (2, REP, T.TYPE_MESSAGE, "op", False),
        (3, OPT, T.TYPE_STRING, "type", False), (4, OPT, T.TYPE_INT32, "num_workers", False),
        (5, OPT, T.TYPE_MESSAGE, "device_option", False), (6, REP, T.TYPE_MESSAGE, "arg", False),
        (7, REP, T.TYPE_STRING, "external_input", False),
        (8, REP, T.TYPE_STRING, "external_output", False),
    ],
    "ExecutionStep": [
        (1, OPT, T.TYPE_STRING, "name", False), (2, REP, T.TYPE_MESSAGE, "substep", False),
        (3, REP, T.TYPE_STRING, "network", False), (4, OPT, T.TYPE_INT64, "num_iter", False),
        (5, OPT, T.TYPE_STRING, "criteria_network", False),
        (6, OPT, T.TYPE_BOOL, "concurrent_substeps", False),
        (7, OPT, T.TYPE_STRING, "report_net", False),
        (8, OPT, T.TYPE_INT32, "report_interval", False),
        (9, OPT, T.TYPE_STRING, "should_stop_blob", False),
        (10, OPT, T.TYPE_BOOL, "only_once", False), (11, OPT, T.TYPE_INT64, "run_every_ms", False),
        (12, OPT, T.TYPE_BOOL, "create_workspace", False),
        (13, OPT, T.TYPE_INT32, "num_concurrent_instances", False),
    ],
    "PlanDef": [
        (1, OPT, T.TYPE_STRING, "name", False), (2, REP, T.TYPE_MESSAGE, "network", False),
        (3, REP, T.TYPE_MESSAGE, "execution_step", False),
    ],
    "BlobProto": [
        (1, OPT, T.TYPE_STRING, "name", False), (2, OPT, T.TYPE_STRING, "type", False),
        (3, OPT, T.TYPE_MESSAGE, "tensor", False), (4, OPT, T.TYPE_BYTES, "content", False),
        (5, OPT, T.TYPE_MESSAGE, "qtensor", False),
        (6, OPT, T.TYPE_INT32, "content_num_chunks", False),
        (7, OPT, T.TYPE_INT32, "content_chunk_id", False),
    ],
    "DBReaderProto": [
        (1, OPT, T.TYPE_STRING, "name", False), (2, OPT, T.TYPE_STRING, "source", False),
        (3, OPT, T.TYPE_STRING, "db_type", False), (4, OPT, T.TYPE_STRING, "key", False),
    ],
}


def test_proto_package_is_caffe2() -> None:
    assert caffe2_pb2.DESCRIPTOR.package == "caffe2"
    assert _file_proto().syntax in ("", "proto2")


@pytest.mark.parametrize("message", sorted(SCHEMA))
def test_message_fields(message: str) -> None:
    fields = {f.number: f for f in _message_proto(message).field}
    for number, label, ftype, name, packed in SCHEMA[message]:
        field = fields.get(number)
        assert field is not None, f"{message}.{name} = {number} missing"
        assert field.name == name, (message, number)
        assert field.label == label, (message, name)
        assert field.type == ftype, (message, name)
        assert field.options.packed == packed, (message, name)


def test_reserved_numbers_unused() -> None:
    assert 12 not in caffe2_pb2.TensorProto.DESCRIPTOR.fields_by_number
    assert 14 not in caffe2_pb2.TensorProto.DESCRIPTOR.fields_by_number
    assert 7 not in caffe2_pb2.DeviceOption.DESCRIPTOR.fields_by_number


def test_segment_fields() -> None:
    seg = _message_proto("TensorProto.Segment")
    assert [(f.number, f.name, f.label, f.type) for f in seg.field] == [
        (1, "begin", REQ, T.TYPE_INT64), (2, "end", REQ, T.TYPE_INT64)]


def test_defaults() -> None:
    assert caffe2_pb2.TensorProto().data_type == caffe2_pb2.TensorProto.FLOAT
    assert caffe2_pb2.TensorProto().data_format == 0
    assert caffe2_pb2.TensorShape().data_type == caffe2_pb2.TensorProto.FLOAT
    assert caffe2_pb2.TensorShape().unknown_shape is False
    assert caffe2_pb2.QTensorProto().data_type == caffe2_pb2.TensorProto.INT32
    assert caffe2_pb2.QTensorProto().is_multiparam is False
    assert caffe2_pb2.DeviceOption().device_type == 0
    assert caffe2_pb2.OperatorDef().is_gradient_op is False
    assert caffe2_pb2.NetDef.DESCRIPTOR.fields_by_name["num_workers"].GetOptions().deprecated \
        is False


def test_data_type_enum() -> None:
    expected = dict(UNDEFINED=0, FLOAT=1, INT32=2, BYTE=3, STRING=4, BOOL=5, UINT8=6, INT8=7,
                    UINT16=8, INT16=9, INT64=10, FLOAT16=12, DOUBLE=13, ZERO_COLLISION_HASH=14,
                    REBATCHING_BUFFER=15)
    for name, value in expected.items():
        assert getattr(caffe2_pb2.TensorProto, name) == value, name
    assert 11 not in caffe2_pb2.TensorProto.DataType.values()
    assert caffe2_pb2.TensorProto.FMT_PROTOBUF == 0
    assert caffe2_pb2.TensorProto.FMT_BFLOAT16 == 1


def test_device_type_enum_and_aliases() -> None:
    late = dict(PROTO_CPU=0, PROTO_CUDA=1, PROTO_MKLDNN=2, PROTO_OPENGL=3, PROTO_OPENCL=4,
                PROTO_IDEEP=5, PROTO_HIP=6, PROTO_FPGA=7, PROTO_MSNPU=8, PROTO_XLA=9,
                PROTO_MLC=10, PROTO_COMPILE_TIME_MAX_DEVICE_TYPES=11)
    for name, value in late.items():
        assert getattr(caffe2_pb2, name) == value, name
        assert caffe2_pb2.DeviceTypeProto.Value(name) == value
    for alias in ("CPU", "CUDA", "MKLDNN", "OPENGL", "OPENCL", "IDEEP", "HIP",
                  "COMPILE_TIME_MAX_DEVICE_TYPES"):
        assert getattr(caffe2_pb2, alias) == late["PROTO_" + alias], alias


def test_device_id_wire_compatible_with_cuda_gpu_id() -> None:
    # field 2 varint: tag 0x10
    assert caffe2_pb2.DeviceOption(device_id=3).SerializeToString() == b"\x10\x03"
    option = caffe2_pb2.DeviceOption()
    option.ParseFromString(b"\x08\x01\x10\x02")
    assert (option.device_type, option.device_id) == (1, 2)


def test_unpacked_repeated_wire_bytes() -> None:
    # Argument.ints (6) unpacked: each element has its own tag 0x30
    assert caffe2_pb2.Argument(ints=[1, 2]).SerializeToString() == b"\x30\x01\x30\x02"
    # TensorProto.dims (1) unpacked, int32_data (4) packed
    assert caffe2_pb2.TensorProto(dims=[2, 3]).SerializeToString().startswith(b"\x08\x02\x08\x03")
    assert caffe2_pb2.TensorProto(int32_data=[1, 2], data_type=2).SerializeToString() \
        .endswith(b"\x22\x02\x01\x02")
