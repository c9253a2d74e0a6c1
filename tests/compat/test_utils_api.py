"""caffe2.python.utils helpers that Caffe2 scripts and tests call."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.message import DecodeError

from dpgraph import core, utils
from dpgraph.proto import caffe2_pb2


def test_op_almost_equal_ignores_the_named_fields() -> None:
    a = core.CreateOperator("Relu", ["x"], ["y"], name="a")
    b = core.CreateOperator("Relu", ["x"], ["y"], name="b")
    assert not utils.OpAlmostEqual(a, b)
    assert utils.OpAlmostEqual(a, b, "name") and utils.OpAlmostEqual(a, b, ["name"])
    assert a.name == "a"  # the originals are untouched


def test_proto_readers_take_text_or_binary(tmp_path: Path) -> None:
    net = caffe2_pb2.NetDef(name="z")
    assert utils.TryReadProtoWithClass(caffe2_pb2.NetDef, net.SerializeToString()).name == "z"
    assert utils.TryReadProtoWithClass(caffe2_pb2.NetDef, 'name: "q"').name == "q"
    getters = {caffe2_pb2.NetDef: lambda n: n.name}
    assert utils.GetContentFromProto(net, getters) == "z"
    assert utils.GetContentFromProtoString('name: "t"', getters) == "t"
    with pytest.raises(DecodeError):
        utils.GetContentFromProtoString(b"\xff\xff\xff", getters)
    (tmp_path / "n.pbtxt").write_text('name: "w"')
    utils.ConvertProtoToBinary(caffe2_pb2.NetDef, str(tmp_path / "n.pbtxt"),
                               str(tmp_path / "n.pb"))
    assert caffe2_pb2.NetDef.FromString((tmp_path / "n.pb").read_bytes()).name == "w"


def test_raise_if_not_equal_and_enum_values() -> None:
    utils.raiseIfNotEqual(1, 1, "same")
    with pytest.raises(Exception, match=r"sizes\. 1 != 2"):
        utils.raiseIfNotEqual(1, 2, "sizes")

    class Kind:
        DENSE = "dense"
        SPARSE = "sparse"
        lower = "ignored"

    assert utils.EnumClassKeyVals(Kind) == {"DENSE": "dense", "SPARSE": "sparse"}


def test_args_to_dict_keeps_caffe2_raw_values() -> None:
    args = [utils.MakeArgument("i", 3), utils.MakeArgument("f", 4.0),
            utils.MakeArgument("s", "foo"), utils.MakeArgument("ints", [3, 4]),
            utils.MakeArgument("strs", ["foo", "bar"]), caffe2_pb2.Argument(name="empty"),
            caffe2_pb2.Argument(i=7)]
    assert utils.ArgsToDict(args) == {"i": 3, "f": 4.0, "s": b"foo", "ints": [3, 4],
                                      "strs": [b"foo", b"bar"], "empty": None}


def test_layout_conversions_and_reset_blobs() -> None:
    import numpy as np

    from dpgraph import workspace
    from dpgraph.errors import ShapeError, WorkspaceError

    x = np.arange(24).reshape(1, 2, 3, 4)
    np.testing.assert_array_equal(utils.NHWC2NCHW(utils.NCHW2NHWC(x)), x)
    assert utils.NCHW2NHWC(x).shape == (1, 3, 4, 2)
    with pytest.raises(ShapeError, match="NCHW2NHWC"):
        utils.NCHW2NHWC(np.zeros(3))
    workspace.FeedBlob("to_free", np.ones(3, np.float32))
    utils.ResetBlobs(["to_free"])
    assert workspace.HasBlob("to_free")
    with pytest.raises(WorkspaceError, match="empty"):
        workspace.FetchBlob("to_free")
    assert utils.DebugMode.run(lambda: 7) == 7
