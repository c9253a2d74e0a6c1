"""InferShapesAndTypes and TensorProto/BlobProto conversion."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import ProtoError
from dpgraph.ir.registry import OPERATORS
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime.serialization import (
    deserialize_blob,
    numpy_to_tensor_proto,
    serialize_blob,
    tensor_proto_to_numpy,
)

DT = caffe2_pb2.TensorProto


def _mlp_net() -> core.Net:
    net = core.Net("rt_shapes")
    net.FC(["x", "w", "b"], "h")
    net.Relu("h", "r")
    net.Copy("r", "c")
    net.Cast("c", "ci", to=DT.INT32) if "Cast" in OPERATORS else net.Scale("c", "ci")
    return net


def test_infer_from_blob_dimensions() -> None:
    shapes, types = workspace.InferShapesAndTypes(
        [_mlp_net()], blob_dimensions={"x": [8, 5], "w": [3, 5], "b": [3]})
    assert shapes["h"] == [8, 3] and shapes["r"] == [8, 3] and shapes["c"] == [8, 3]
    assert types["h"] == DT.FLOAT and shapes["x"] == [8, 5]
    assert workspace.Blobs() == []  # nothing ran in the workspace


def test_infer_from_workspace_and_types() -> None:
    workspace.FeedBlob("x", np.ones((2, 5), np.float32))
    workspace.FeedBlob("w", np.ones((4, 5), np.float32))
    workspace.FeedBlob("b", np.ones(4, np.float32))
    shapes, types = workspace.InferShapesAndTypes([_mlp_net()])
    assert shapes["r"] == [2, 4] and types["r"] == DT.FLOAT
    assert not workspace.HasBlob("h")
    shapes, types = workspace.InferShapesAndTypes(
        [_mlp_net()], blob_dimensions={"x": [1, 5], "w": [2, 5], "b": [2]},
        blob_types={"x": DT.DOUBLE, "w": DT.DOUBLE, "b": DT.DOUBLE})
    assert types["x"] == DT.DOUBLE


def test_infer_skips_unknown_and_side_effect_ops() -> None:
    net = core.Net("rt_shapes_skip")
    net.Relu("unknown", "u")
    net.CreateBlobsQueue([], "q")
    shapes, _ = workspace.InferShapesAndTypes([net], blob_dimensions={})
    assert "u" not in shapes and "q" not in shapes


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_,
                                   np.uint8, np.int8, np.uint16, np.int16, np.float16])
def test_tensor_proto_roundtrip(dtype) -> None:
    x = (np.arange(6).reshape(2, 3) % 2 == 0) if dtype is np.bool_ else \
        np.arange(6).reshape(2, 3).astype(dtype)
    proto = numpy_to_tensor_proto(x, "t")
    assert list(proto.dims) == [2, 3] and proto.name == "t"
    back = tensor_proto_to_numpy(caffe2_pb2.TensorProto.FromString(proto.SerializeToString()))
    assert back.dtype == x.dtype
    np.testing.assert_array_equal(back, x)


def test_tensor_proto_fields_and_raw_data() -> None:
    assert numpy_to_tensor_proto(np.ones(2, np.float32)).data_type == DT.FLOAT
    assert list(numpy_to_tensor_proto(np.array([True, False])).int32_data) == [1, 0]
    strings = numpy_to_tensor_proto(np.array(["a", "b"], dtype=object))
    assert strings.data_type == DT.STRING and list(strings.string_data) == [b"a", b"b"]
    raw = caffe2_pb2.TensorProto(dims=[2], data_type=DT.INT64,
                                 raw_data=np.array([5, 6], "<i8").tobytes())
    np.testing.assert_array_equal(tensor_proto_to_numpy(raw), [5, 6])
    scalar = tensor_proto_to_numpy(numpy_to_tensor_proto(np.float32(2.5)))
    assert scalar.shape == () and scalar == 2.5
    with pytest.raises(ProtoError, match="need 4 values"):
        tensor_proto_to_numpy(caffe2_pb2.TensorProto(dims=[4], float_data=[1.0]))


def test_blob_proto_roundtrip() -> None:
    name, value = deserialize_blob(serialize_blob("x", np.ones((2, 2), np.float32)))
    assert name == "x" and value.shape == (2, 2)
    assert deserialize_blob(serialize_blob("s", "text")) == ("s", b"text")
    with pytest.raises(ProtoError):
        serialize_blob("e", None)


def test_shape_fn_is_preferred_and_kernel_is_the_fallback() -> None:
    if "RtTestShapeOnly" not in OPERATORS:
        from dpgraph.ir.registry import register_op

        @register_op("RtTestShapeOnly", inputs=1, outputs=1,
                     shape=lambda op, shapes, types: [((7, 7), DT.INT64)])
        def never(ctx):  # inference must not run a kernel that has a shape function
            raise AssertionError("kernel ran")

    net = core.Net("rt_shape_pref")
    net.RtTestShapeOnly("x", "s")
    net.RtTestIntArg("x", "k", k=2)  # no shape function: runs on a scratch zero array
    shapes, types = workspace.InferShapesAndTypes([net], blob_dimensions={"x": [2, 3]},
                                                  blob_types={"x": DT.INT32})
    assert shapes["s"] == [7, 7] and types["s"] == DT.INT64
    assert shapes["k"] == [2, 3] and types["k"] == DT.INT32
