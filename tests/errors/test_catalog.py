"""The bad-input catalog (issue 21): one table of bad inputs across dpgraph's public surface.

Each case asserts three things (see _catalog.check_case): the typed dpgraph.errors class
(and that no bare ValueError/MemoryError/... is its direct cause), a message naming the op,
blob, device or file involved and saying what to do, and that the current workspace (blobs,
placements, nets), the model and the files on disk are exactly as before the call.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _catalog import CliFailure, Env, case, check_case, run_cli

from dpgraph import brew, checkpoint, core, data_parallel_model, data_workers, model_helper
from dpgraph import workspace as ws
from dpgraph.collectives import cpu, rendezvous
from dpgraph.db.base import Mode, open_db
from dpgraph.errors import (
    ArgumentError,
    BlobNameError,
    BlobNotFoundError,
    CheckpointError,
    CheckpointWriteError,
    CollectiveError,
    CommandError,
    CorruptDataError,
    DataInputError,
    DBError,
    DeviceError,
    DeviceOptionTypeError,
    ExportError,
    ModelStateError,
    NetError,
    NotParallelizedError,
    OperatorDefError,
    OperatorError,
    ParallelizeError,
    ProtoError,
    RendezvousError,
    ResourceLimitError,
    ScopeError,
    SerializationError,
    ShapeError,
    TextFormatError,
    UnknownOperatorError,
    UnregisteredOperatorError,
    VerificationError,
    WorkspaceError,
    WorkspaceNameError,
)
from dpgraph.ir import proto_io, text
from dpgraph.ir.verify import verify
from dpgraph.proto import caffe2_pb2

F32 = np.float32
CUDA = caffe2_pb2.CUDA


@pytest.fixture(autouse=True)
def default_limits() -> Any:
    yield
    proto_io.set_max_tensor_bytes(None)
    proto_io.set_max_nesting_depth(None)


# --- builders --------------------------------------------------------------------------------
def feed(**blobs: Any) -> Any:
    def setup(env: Env) -> None:
        for name, value in blobs.items():
            ws.FeedBlob(name, value)
    return setup


def run_op(op_type: str, inputs: list[str], outputs: list[str], **args: Any) -> Any:
    return lambda env: ws.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **args))


def op_case(case_id: str, op_type: str, inputs: list[str], outputs: list[str],
            blobs: dict[str, Any], error: type, names: tuple[str, ...],
            hint: str | tuple[str, ...] = "hint:", **args: Any) -> Any:
    """An op run on bad blobs or arguments: names the op, its outputs and cpu_0."""
    return case(f"ops/{case_id}", run_op(op_type, inputs, outputs, **args), error,
                (op_type, "cpu_0", f"outputs: {', '.join(outputs)}", *names), hint,
                setup=feed(**blobs))


def deep_net(levels: int) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef(name="level0")
    current = net
    for level in range(levels):
        op = current.op.add(type="Do", output=[f"out{level}"])
        argument = op.arg.add(name="net")
        argument.n.name = f"level{level + 1}"
        current = argument.n
    return net


def huge_fill_net() -> core.Net:
    net = core.Net("huge_init")
    net.ConstantFill([], ["small"], shape=[2], value=1.0)
    net.ConstantFill([], ["huge_w"], shape=[10**6, 10**6], value=0.0)
    return net


def huge_tensor(name: str = "w") -> caffe2_pb2.TensorProto:
    proto = caffe2_pb2.TensorProto(name=name, data_type=caffe2_pb2.TensorProto.FLOAT)
    proto.dims.extend([10**6, 10**6])
    return proto


def write(env: Env, name: str, data: bytes) -> None:
    (env.tmp / name).write_bytes(data)


def write_minidb(env: Env, name: str, records: dict[str, bytes]) -> None:
    db = open_db("minidb", env.path(name), Mode.new)
    transaction = db.new_transaction()
    for key, value in records.items():
        transaction.put(key, value)
    transaction.commit()
    transaction.close()
    db.close()


def write_net(env: Env, name: str = "net.pb", net: Any = None) -> None:
    if net is None:
        net = caffe2_pb2.NetDef(name="p")
        net.op.add(type="Relu", input=["x"], output=["y"])
    proto_io.write_proto(net, env.tmp / name)


def saved_checkpoint(env: Env) -> None:
    ws.FeedBlob("w", np.ones((2, 3), F32))
    ws.FeedBlob("b", np.ones(3, F32))
    checkpoint.save_checkpoint(env.tmp / "ok.ckpt", ["w", "b"])


def huge_checkpoint(env: Env) -> None:
    message = caffe2_pb2.TensorProtos()
    message.protos.append(huge_tensor("w"))
    crc = zlib.crc32(message.protos[0].SerializeToString(deterministic=True))
    manifest = message.protos.add(name=checkpoint.MANIFEST_NAME,
                                  data_type=caffe2_pb2.TensorProto.INT64)
    manifest.dims.append(3)
    manifest.int64_data.extend([checkpoint.FORMAT_VERSION, 1, crc])
    write(env, "huge.ckpt", message.SerializeToString())


def deep_plan(levels: int) -> caffe2_pb2.PlanDef:
    plan = caffe2_pb2.PlanDef(name="deep_plan")
    step = plan.execution_step.add(name="step0")
    for level in range(levels):
        step = step.substep.add(name=f"step{level + 1}")
    return plan


def huge_fill_plan() -> caffe2_pb2.PlanDef:
    plan = caffe2_pb2.PlanDef(name="huge_plan")
    plan.network.append(huge_fill_net().Proto())
    plan.execution_step.add(name="init", network=[plan.network[0].name])
    return plan


def gpu_net(env: Env) -> core.Net:
    net = core.Net("on_gpu")
    with core.DeviceScope(core.DeviceOption(CUDA, 3)):
        net.Relu(["x"], ["y"])
    return net


# --- Parallelize ------------------------------------------------------------------------------
def forward(model: Any, loss_scale: float) -> list[Any]:
    fc = brew.fc(model, "data", "fc", dim_in=4, dim_out=2)
    _, loss = model.net.SoftmaxWithLoss([fc, "label"], ["softmax", "loss"], scale=loss_scale)
    return [loss]


def param_update(model: Any) -> None:
    for param in model.GetParams():
        model.WeightedSum([param, "ONE", model.param_to_grad[param], "LR"], param)


def new_model(env: Env) -> None:
    env.model = model_helper.ModelHelper(name="catalog_dpm")
    brew.fc(env.model, "shared_in", "shared_fc", 2, 2)  # a param that is already there


def parallelize(forward_fun: Any = forward, parallelize_fun: Any = None, **kwargs: Any) -> Any:
    kwargs.setdefault("param_update_builder_fun", param_update)
    kwargs.setdefault("devices", [0, 1])
    if parallelize_fun is None:
        parallelize_fun = data_parallel_model.Parallelize_CPU

    def call(env: Env) -> None:
        parallelize_fun(env.model, lambda m: None, forward_fun, **kwargs)
    return call


def dpm_case(case_id: str, error: type, names: tuple[str, ...], hint: Any,
             marks: Any = (), setup: Any = new_model, **kwargs: Any) -> Any:
    return case(f"parallelize/{case_id}", parallelize(**kwargs), error, names, hint,
                setup=setup, marks=marks)


def parallelized_model(env: Env) -> None:
    env.model = model_helper.ModelHelper(name="catalog_done")
    data_parallel_model.Parallelize_CPU(env.model, lambda m: None, forward,
                                        param_update_builder_fun=param_update, devices=[0, 1])


def no_gpus(env: Env) -> None:
    ws.SetVirtualGpus(0)
    new_model(env)


# --- collectives ------------------------------------------------------------------------------
def world(env: Env) -> Any:
    if "world" not in env.things:
        env.things["world"] = cpu.create()
    return env.things["world"]


def closed_world(env: Env) -> None:
    world(env).close()


def nccl_setup(env: Env) -> None:
    ws.SetVirtualGpus(2)
    for device, size in ((0, 3), (1, 4)):
        with core.DeviceScope(core.DeviceOption(CUDA, device)):
            ws.FeedBlob(f"g{device}", np.ones(size, F32))


def nccl_call(env: Env) -> None:
    net = core.Net("catalog_nccl")
    with core.DeviceScope(core.DeviceOption(CUDA, 0)):
        net.NCCLAllreduce(["g0", "g1"], ["g0", "g1"])
    ws.RunNetOnce(net)


# --- data workers -----------------------------------------------------------------------------
def init_workers(fetcher: Any = None, names: Any = ("data",), **kwargs: Any) -> Any:
    def call(env: Env) -> None:
        registry = data_workers.global_coordinator._coordinators
        known = list(registry)
        try:
            data_workers.init_data_input_workers(
                core.Net("catalog_input"), list(names), fetcher or (lambda w, b: None),
                **kwargs)
        finally:  # a wrongly accepted call leaves no never-started workers to stop at exit
            registry[:] = [c for c in registry if any(c is k for k in known)]
    return call


# --- ONNX -------------------------------------------------------------------------------------
def onnx_net(outputs: bool = True) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef(name="catalog_onnx")
    net.op.add(type="FC", input=["a", "w", "b"], output=["y"])
    net.external_input.extend(["a", "w", "b"])
    if outputs:
        net.external_output.append("y")
    return net


def to_onnx(net: Any, params: Any, inputs: Any, **kwargs: Any) -> Any:
    from dpgraph import export

    return lambda env: export.to_onnx(net, params, inputs, **kwargs)


PARAMS = {"w": np.ones((2, 2), F32), "b": np.ones(2, F32)}


def lstm_net() -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef(name="catalog_unsupported")
    net.op.add(type="LSTMUnit", input=["h", "c", "g", "t"], output=["h2", "c2"])
    net.external_output.append("h2")
    return net


# --- predictor --------------------------------------------------------------------------------
def predictor_meta(parameters: list[str]) -> Any:
    from dpgraph.predictor import predictor_exporter as pe

    net = core.Net("catalog_predict")
    net.Relu(["x"], ["y"])
    return pe.PredictorExportMeta(predict_net=net, parameters=parameters, inputs=["x"],
                                  outputs=["y"])


def predictor_load(name: str) -> Any:
    from dpgraph.predictor import predictor_exporter as pe

    return lambda env: pe.prepare_prediction_net(env.path(name), "minidb")


def predictor_save(parameters: list[str]) -> Any:
    from dpgraph.predictor import predictor_exporter as pe

    return lambda env: pe.save_to_db("minidb", env.path("pred.minidb"), predictor_meta(
        parameters))


# --- the table --------------------------------------------------------------------------------
GARBAGE = b"\x00\xff garbage \x01" * 12
HINT_LIMIT = ("DPGRAPH_MAX_TENSOR_BYTES", "set_max_tensor_bytes")
HINT_NESTING = ("DPGRAPH_MAX_NESTING_DEPTH", "flatten")

IR_CASES = [
    case("ir/text_unknown_keyword", lambda e: text.parse_net('net "a"\nhello world'),
         TextFormatError, ("line 2", "'hello'"), "a line starts with"),
    case("ir/text_bad_json", lambda e: text.parse_net('net "a" {bad json'),
         TextFormatError, ("line 1", "bad JSON"), "must be one JSON object"),
    case("ir/text_op_without_arrow", lambda e: text.parse_net('net "a"\nop Relu x y'),
         TextFormatError, ("line 2", "'op Relu x y'"), "op TYPE INPUT... -> OUTPUT..."),
    case("ir/text_bad_device",
         lambda e: text.parse_net('net "a"\nop Relu x -> y {"device": "tpu:0"}'),
         TextFormatError, ("line 2", "'tpu:0'"), "expected e.g. 'gpu:0'"),
    case("ir/text_bad_option_type",
         lambda e: text.parse_net('net "a"\nop Relu x -> y {"args": 5}'),
         TextFormatError, ("line 2",), "fix the value on that line"),
    case("ir/text_hostile_nesting",
         lambda e: text.parse_net('op Relu x -> y {"args": [["a", ' + "[" * 50000 +
                                  "]" * 50000 + "]]}"),
         ResourceLimitError, ("line 1",), "flatten the nesting"),
    case("ir/text_parse_op_empty", lambda e: text.parse_op("op"), TextFormatError,
         ("'op'",), "op TYPE INPUT"),
    case("ir/proto_garbage_bytes",
         lambda e: proto_io.parse_proto(caffe2_pb2.NetDef, GARBAGE, "garbage.pb"),
         ProtoError, ("garbage.pb", "NetDef"), "binary Caffe2 protobuf"),
    case("ir/proto_missing_file",
         lambda e: proto_io.read_proto(caffe2_pb2.NetDef, e.tmp / "missing.pb"),
         ProtoError, ("{tmp}/missing.pb",), "check the path"),
    case("ir/proto_nesting_over_protobuf_limit",
         lambda e: proto_io.read_proto(caffe2_pb2.NetDef, e.tmp / "deep.pb"),
         ResourceLimitError, ("{tmp}/deep.pb", "NetDef"), "flatten",
         setup=lambda e: write(e, "deep.pb", deep_net(40).SerializeToString())),
    case("ir/proto_nesting_over_configured_limit",
         lambda e: proto_io.read_proto(caffe2_pb2.NetDef, e.tmp / "deep.pb"),
         ResourceLimitError, ("{tmp}/deep.pb", "level5", "5 levels"), HINT_NESTING,
         setup=lambda e: (write(e, "deep.pb", deep_net(12).SerializeToString()),
                          proto_io.set_max_nesting_depth(5))),
    case("ir/arg_unsupported_type",
         lambda e: core.CreateOperator("Relu", ["x"], ["y"], foo=object()),
         ArgumentError, ("'foo'",), "use a number, string"),
    case("ir/arg_mixed_list",
         lambda e: core.CreateOperator("ConstantFill", [], ["y"], shape=[1.5, 2]),
         ArgumentError, ("'shape'", "float, int"), "use a list of only"),
    case("ir/blob_name_not_string", lambda e: core.CreateOperator("Relu", [3], ["y"]),
         BlobNameError, ("int 3",), "must be a str, bytes or BlobReference"),
    case("ir/device_option_string_type", lambda e: core.DeviceOption("cuda", 0),
         DeviceOptionTypeError, ("device_type='cuda'",), "DeviceOption(caffe2_pb2.CUDA, 0)"),
    case("ir/device_scope_not_option", lambda e: core.DeviceScope("gpu").__enter__(),
         ScopeError, ("DeviceScope", "str"), "build one with core.DeviceOption"),
    case("ir/name_scope_not_string", lambda e: core.NameScope(3).__enter__(), ScopeError,
         ("NameScope", "int 3"), "pass the scope name as a string"),
    case("ir/operator_device_option_string",
         lambda e: core.CreateOperator("Relu", ["x"], ["y"], device_option="cpu"),
         DeviceOptionTypeError, ("'Relu'", "str 'cpu'"), "core.DeviceOption(device_type"),
    case("ir/net_from_int", lambda e: core.Net(5), NetError, ("got int",),
         "takes a name or a NetDef"),
    case("ir/unknown_op_method", lambda e: core.Net("n").Frobnicat(["x"], ["y"]),
         UnknownOperatorError, ("Frobnicat",), "Did you mean"),
    case("ir/verify_undefined_input",
         lambda e: verify(e.things["net"]), VerificationError, ("'v'", "'z'", "op 1 (Sum)"),
         "declare blobs that exist before the net runs in external_input",
         setup=lambda e: e.things.update(net=_net_with_undefined_input())),
]


def _net_with_undefined_input() -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef(name="v")
    net.op.add(type="Relu", input=["x"], output=["y"])
    net.op.add(type="Sum", input=["y", "z"], output=["w"])
    net.external_input.append("x")
    return net


X23 = np.ones((2, 3), F32)
OP_CASES = [
    op_case("constant_fill_negative_shape", "ConstantFill", [], ["y"], {}, ArgumentError,
            ("'shape'", "[-1, 2]"), "must be >= 0", shape=[-1, 2]),
    op_case("constant_fill_string_shape", "ConstantFill", [], ["y"], {}, ArgumentError,
            ("'shape'", "'abc'"), "pass whole numbers", shape="abc"),
    op_case("constant_fill_fractional_shape", "ConstantFill", [], ["y"], {}, ArgumentError,
            ("'shape'", "2.5"), "pass whole numbers", shape=[2.5, 1.0]),
    op_case("constant_fill_huge_shape", "ConstantFill", [], ["y"], {}, ResourceLimitError,
            ("[1000000, 1000000]",), HINT_LIMIT, shape=[10**6, 10**6]),
    op_case("gaussian_fill_huge_shape", "GaussianFill", [], ["y"], {}, ResourceLimitError,
            ("[1000000, 1000000]",), HINT_LIMIT, shape=[10**6, 10**6]),
    op_case("uniform_fill_negative_shape", "UniformFill", [], ["y"], {}, ArgumentError,
            ("[-3]",), "must be >= 0", shape=[-3]),
    op_case("xavier_fill_negative_shape", "XavierFill", [], ["y"], {}, ArgumentError,
            ("[-3, 2]",), "must be >= 0", shape=[-3, 2]),
    op_case("given_tensor_fill_count", "GivenTensorFill", [], ["y"], {}, ArgumentError,
            ("shape [3]",), "give exactly 3 values", shape=[3], values=[1.0, 2.0]),
    op_case("fill_input_as_shape_negative", "ConstantFill", ["s"], ["y"],
            {"s": np.array([-1, 2], np.int64)}, ArgumentError, ("input_as_shape",),
            "must be >= 0", input_as_shape=1),
    op_case("fill_input_as_shape_float", "ConstantFill", ["s"], ["y"],
            {"s": np.array([1.5], F32)}, ShapeError, ("input_as_shape", "float32"),
            "pass an int64 tensor", input_as_shape=1),
    op_case("fill_input_as_shape_huge", "ConstantFill", ["s"], ["y"],
            {"s": np.array([10**6, 10**6], np.int64)}, ResourceLimitError,
            ("[1000000, 1000000]",), HINT_LIMIT, input_as_shape=1),
    op_case("constant_fill_bad_dtype", "ConstantFill", [], ["y"], {}, ArgumentError,
            ("data type 99",), "supported:", shape=[2], dtype=99),
    op_case("reshape_mismatch", "Reshape", ["x"], ["y", "old"], {"x": np.ones(6, F32)},
            ShapeError, ("x ([6] float32 on cpu_0)", "[4, 2]"), "hint:", shape=[4, 2]),
    op_case("reshape_two_unknown", "Reshape", ["x"], ["y", "old"], {"x": np.ones(6, F32)},
            ArgumentError, ("[-1, -1]",), "hint:", shape=[-1, -1]),
    op_case("transpose_bad_axes", "Transpose", ["x"], ["y"], {"x": X23}, ArgumentError,
            ("axes [0, 0]",), "hint:", axes=[0, 0]),
    op_case("sum_shape_mismatch", "Sum", ["a", "b"], ["y"],
            {"a": X23, "b": np.ones((3, 2), F32)}, ShapeError, ("'b'", "(3, 2)"),
            "use Add with broadcast=1"),
    op_case("add_broadcast_mismatch", "Add", ["a", "b"], ["y"],
            {"a": X23, "b": np.ones(4, F32)}, ShapeError, ("B (4,)",), "hint:", broadcast=1),
    op_case("fc_inner_dims", "FC", ["x", "w", "b"], ["y"],
            {"x": X23, "w": np.ones((4, 5), F32), "b": np.ones(4, F32)}, ShapeError,
            ("'x'", "(4, 5)"), "axis"),
    op_case("conv_zero_stride", "Conv", ["x", "w", "b"], ["y"],
            {"x": np.ones((1, 3, 8, 8), F32), "w": np.ones((2, 3, 3, 3), F32),
             "b": np.ones(2, F32)}, ArgumentError, ("stride=[0, 0]",), "hint:",
            kernel=3, stride=0),
    op_case("max_pool_zero_kernel", "MaxPool", ["x"], ["y"],
            {"x": np.ones((1, 1, 4, 4), F32)}, ArgumentError, ("kernel=[0, 0]",), "hint:",
            kernel=0),
    op_case("dropout_ratio", "Dropout", ["x"], ["y", "mask"], {"x": X23}, ArgumentError,
            ("ratio 2.0",), "must be in [0, 1]", ratio=2.0),
    op_case("softmax_axis", "Softmax", ["x"], ["y"], {"x": X23}, ShapeError,
            ("axis 5",), "hint:", axis=5),
    op_case("sparse_lengths_sum_lengths", "SparseLengthsSum", ["d", "i", "l"], ["y"],
            {"d": np.ones((4, 2), F32), "i": np.array([0, 1], np.int64),
             "l": np.array([3], np.int32)}, ShapeError, ("lengths sum to 3",), "hint:"),
    op_case("lengths_sum_negative", "LengthsSum", ["x", "l"], ["y"],
            {"x": np.ones(3, F32), "l": np.array([-1], np.int32)}, ShapeError,
            ("lengths",), "must be non-negative"),
    op_case("gather_out_of_range", "Gather", ["x", "i"], ["y"],
            {"x": X23, "i": np.array([5], np.int32)}, ShapeError, ("[0, 2)",),
            "indices must lie in"),
    op_case("matmul_inner_dims", "MatMul", ["a", "b"], ["y"],
            {"a": X23, "b": np.ones((4, 2), F32)}, ShapeError, ("(2, 3)", "(4, 2)"),
            "check trans_a/trans_b"),
    op_case("cast_bad_to", "Cast", ["x"], ["y"], {"x": X23}, ArgumentError,
            ("'to'", "77"), "supported:", to=77),
    op_case("spatial_bn_scale_length", "SpatialBN", ["x", "s", "b", "m", "v"], ["y"],
            {"x": np.ones((2, 3, 2, 2), F32), **{n: np.ones(4, F32) for n in "sbmv"}},
            ShapeError, ("'s'", "one per channel (3)"), "check 'order'", is_test=1),
    op_case("lrn_size", "LRN", ["x"], ["y", "scale"], {"x": np.ones((1, 3, 2, 2), F32)},
            ShapeError, ("'size'",), "must be a positive window size", size=0),
    op_case("flatten_axis", "Flatten", ["x"], ["y"], {"x": X23}, ShapeError, ("axis 7",),
            "hint:", axis=7),
    op_case("reduce_sum_axes", "ReduceSum", ["x"], ["y"], {"x": X23}, ShapeError,
            ("axes [4]",), "hint:", axes=[4]),
    op_case("squeeze_non_unit", "Squeeze", ["x"], ["y"], {"x": X23}, ShapeError,
            ("dims [0]",), "each must be size 1", dims=[0]),
    op_case("expand_dims_range", "ExpandDims", ["x"], ["y"], {"x": X23}, ShapeError,
            ("dim 9",), "hint:", dims=[9]),
    op_case("concat_mismatch", "Concat", ["a", "b"], ["y", "split"],
            {"a": X23, "b": np.ones((3, 4), F32)}, ShapeError, ("'b'",), "hint:", axis=0),
    op_case("softmax_with_loss_float_label", "SoftmaxWithLoss", ["x", "label"],
            ["p", "loss"], {"x": X23, "label": np.array([0.0, 1.0], F32)}, ShapeError,
            ("label 'label'", "float32"), "astype(np.int32)"),
    op_case("missing_input", "Relu", ["nope"], ["y"], {}, BlobNotFoundError,
            ("'nope'",), "feed it with workspace.FeedBlob"),
    op_case("numpy_failure_typed", "ReluGradient", ["y", "dy"], ["dx"],
            {"y": X23, "dy": np.ones((5, 7), F32)}, ShapeError,
            ("dy ([5, 7] float32 on cpu_0)",), "forward Relu op"),
    op_case("expand_huge", "Expand", ["x", "s"], ["y"],
            {"x": np.ones(1, F32), "s": np.array([10**6, 10**6], np.int64)},
            ResourceLimitError, ("output 'y'", "[1000000, 1000000]"), HINT_LIMIT),
    op_case("one_hot_huge", "OneHot", ["i", "n"], ["y"],
            {"i": np.array([1], np.int64), "n": np.array(10**12, np.int64)},
            ResourceLimitError, ("output 'y'", "[1, 1000000000000]"), HINT_LIMIT),
    op_case("tile_huge", "Tile", ["x"], ["y"], {"x": np.ones((1000, 1000), F32)},
            ResourceLimitError, ("output 'y'", "[10000000000, 1000]"), HINT_LIMIT,
            tiles=10**7, axis=0),
    case("ops/unregistered_type", run_op("Frobnicate", ["x"], ["y"]),
         UnregisteredOperatorError, ("'Frobnicate'", "['x']"), "Did you mean"),
    case("ops/wrong_arity", run_op("AveragedLoss", ["x", "x"], ["y"]), OperatorDefError,
         ("AveragedLoss", "['x', 'x']"), "takes 1 inputs", setup=feed(x=X23)),
]

RUNTIME_CASES = [
    case("runtime/fetch_missing", lambda e: ws.FetchBlob("nope"), BlobNotFoundError,
         ("nope",), "Feed it with workspace.FeedBlob"),
    case("runtime/feed_bad_name", lambda e: ws.FeedBlob(3.5, np.ones(2, F32)),
         WorkspaceNameError, ("float 3.5",), "Expected a string or BlobReference"),
    case("runtime/feed_object", lambda e: ws.FeedBlob("x", object()), WorkspaceError,
         ("'x'", "object"), "feed a numpy array"),
    case("runtime/feed_object_array", lambda e: ws.FeedBlob("x", np.array([1, None])),
         WorkspaceError, ("'x'", "int"), "feed a numeric dtype array"),
    case("runtime/feed_gpu_without_gpu",
         lambda e: ws.FeedBlob("x", np.ones(2, F32), core.DeviceOption(CUDA, 0)),
         DeviceError, ("'x'", "gpu_0"), "SetVirtualGpus"),
    case("runtime/feed_tensor_proto_huge", lambda e: ws.FeedBlob("x", huge_tensor()),
         ResourceLimitError, ("FeedBlob('x')", "[1000000, 1000000]"), HINT_LIMIT),
    case("runtime/feed_tensor_proto_negative",
         lambda e: ws.FeedBlob("x", caffe2_pb2.TensorProto(dims=[-1], data_type=1)),
         ShapeError, ("FeedBlob('x')", "[-1]"), "fix the shape"),
    case("runtime/feed_tensor_proto_short",
         lambda e: ws.FeedBlob("x", caffe2_pb2.TensorProto(dims=[3], data_type=1,
                                                          float_data=[1.0])),
         SerializationError, ("FeedBlob('x')", "dims [3]"), "Check the TensorProto's dims"),
    case("runtime/feed_tensor_proto_under_lowered_limit",
         lambda e: ws.FeedBlob("x", caffe2_pb2.TensorProto(dims=[64], data_type=1)),
         ResourceLimitError, ("FeedBlob('x')", "[64]", "128 bytes"), HINT_LIMIT,
         setup=lambda e: proto_io.set_max_tensor_bytes(128)),
    case("runtime/create_net_garbage_bytes", lambda e: ws.CreateNet(GARBAGE), ProtoError,
         ("serialized NetDef",), "binary Caffe2 protobuf"),
    case("runtime/create_net_not_a_net", lambda e: ws.CreateNet(5), WorkspaceError,
         ("got int",), "Expected a Net, NetDef"),
    case("runtime/create_net_twice",
         lambda e: ws.CreateNet(e.things["net"]), WorkspaceError, ("\"twice\"",),
         "overwrite=True",
         setup=lambda e: (e.things.update(net=caffe2_pb2.NetDef(name="twice")),
                          ws.CreateNet(e.things["net"]))),
    case("runtime/create_net_unknown_source",
         lambda e: ws.CreateNet(_net_with_undefined_input()), WorkspaceError,
         ("'z'", "'v'", "Sum"), "add it to external_input"),
    case("runtime/create_net_huge_fill", lambda e: ws.CreateNet(huge_fill_net()),
         ResourceLimitError, ("ConstantFill", "huge_w"), HINT_LIMIT),
    case("runtime/run_net_once_huge_fill", lambda e: ws.RunNetOnce(huge_fill_net()),
         ResourceLimitError, ("op 1", "huge_w"), HINT_LIMIT),
    case("runtime/create_net_deep_nesting", lambda e: ws.CreateNet(deep_net(50)),
         ResourceLimitError, ("level0", "32 levels"), HINT_NESTING),
    case("runtime/run_missing_net", lambda e: ws.RunNet("nope"), WorkspaceError,
         ("nope",), "create it with CreateNet first"),
    case("runtime/run_net_bad_iterations", lambda e: ws.RunNet("iter", "x"),
         WorkspaceError, ("'iter'", "str 'x'"), "num_iter must be an int",
         setup=lambda e: ws.CreateNet(caffe2_pb2.NetDef(name="iter"))),
    case("runtime/run_gpu_op_without_gpu", lambda e: ws.RunNetOnce(gpu_net(e)), DeviceError,
         ("Relu", "gpu_3"), "SetVirtualGpus", setup=feed(x=np.ones(2, F32))),
    case("runtime/run_plan_garbage_bytes", lambda e: ws.RunPlan(GARBAGE), ProtoError,
         ("serialized PlanDef",), "binary Caffe2 protobuf"),
    case("runtime/run_plan_deep_steps", lambda e: ws.RunPlan(deep_plan(150)),
         ResourceLimitError, ("'deep_plan'", "step100"), "flatten the substeps"),
    case("runtime/run_plan_huge_fill", lambda e: ws.RunPlan(huge_fill_plan()),
         ResourceLimitError, ("ConstantFill", "huge_w"), HINT_LIMIT),
    case("runtime/switch_to_missing_workspace", lambda e: ws.SwitchWorkspace("nope_ws"),
         WorkspaceError, ("'nope_ws'",), "create_if_missing=True"),
    case("runtime/deserialize_garbage", lambda e: ws.DeserializeBlob("x", GARBAGE),
         CorruptDataError, ("DeserializeBlob('x')",), "not written by Save"),
    case("runtime/serialize_missing", lambda e: ws.SerializeBlob("nope"), BlobNotFoundError,
         ("nope",), "Feed it"),
    case("runtime/run_operator_not_op", lambda e: ws.RunOperatorOnce("Relu"),
         WorkspaceError, ("got str",), "Expected an OperatorDef"),
    case("runtime/infer_shapes_not_nets", lambda e: ws.InferShapesAndTypes([5]),
         WorkspaceError, ("type int",), "pass [net]"),
    case("runtime/infer_shapes_not_a_list", lambda e: ws.InferShapesAndTypes(5),
         WorkspaceError, ("got int",), "pass [net]"),
    case("runtime/feed_device_option_string",
         lambda e: ws.FeedBlob("x", np.ones(2, F32), "gpu"), WorkspaceError,
         ("FeedBlob('x')", "str 'gpu'"), "core.DeviceOption(device_type, device_id)"),
    case("runtime/feed_complex", lambda e: ws.FeedBlob("x", np.ones(2, np.complex64)),
         WorkspaceError, ("FeedBlob('x')", "complex64"), "convert it"),
    case("runtime/feed_ragged_list", lambda e: ws.FeedBlob("x", [[1, 2], [3]]),
         WorkspaceError, ("FeedBlob('x')", "list"), "feed a numpy array"),
    case("runtime/fetch_blobs_not_a_list", lambda e: ws.FetchBlobs(None), WorkspaceError,
         ("FetchBlobs", "None"), "use FetchBlob for one blob"),
    case("runtime/reset_workspace_bad_root", lambda e: ws.ResetWorkspace(5), WorkspaceError,
         ("root_folder", "int 5"), "must be a path", setup=feed(kept=np.ones(2, F32))),
    case("runtime/virtual_gpus_not_int", lambda e: ws.SetVirtualGpus("a"), ArgumentError,
         ("SetVirtualGpus", "str 'a'"), "must be an int"),
    case("runtime/virtual_gpus_negative", lambda e: ws.SetVirtualGpus(-1), ArgumentError,
         ("SetVirtualGpus", "-1"), "must be >= 0"),
]

PARALLEL_CASES = [
    dpm_case("negative_device", ParallelizeError, ("[-1]",), "devices", devices=[-1, 0]),
    dpm_case("duplicate_devices", ParallelizeError, ("[0, 0]",), "duplicates",
             devices=[0, 0]),
    dpm_case("no_devices", ParallelizeError, ("empty list",), "at least one device",
             devices=[]),
    dpm_case("rendezvous_not_dict", RendezvousError, ("got str",), "a dict or None",
             rendezvous="abc", devices=[0]),
    dpm_case("rendezvous_missing_keys", RendezvousError, ("['kv_handler', 'shard_id']",),
             "Caffe2's form is", rendezvous={"num_shards": 2}, devices=[0]),
    dpm_case("bucket_size", ParallelizeError, ("gradient_bucket_mb", "-3"),
             "a positive size in MB", gradient_bucket_mb=-3),
    dpm_case("accumulate_steps", ParallelizeError, ("accumulate_steps", "got 0"),
             "must be a positive int", accumulate_steps=0),
    dpm_case("gradient_dtype", ParallelizeError, ("gradient_dtype", "'int8'"),
             "'float16' or 'bfloat16'", gradient_dtype="int8"),
    dpm_case("two_update_builders", ParallelizeError, ("param_update_builder_fun",),
             "optimizer_builder_fun", optimizer_builder_fun=lambda m: None),
    dpm_case("shared_model_on_gpus", ParallelizeError, ("Shared model",),
             "cpu_device=True", parallelize_fun=data_parallel_model.Parallelize,
             shared_model=True),
    dpm_case("losses_not_list", ParallelizeError, ("device 0", "NoneType"),
             "must return list of loss blobs", forward_fun=lambda m, s: None),
    dpm_case("losses_as_strings", ParallelizeError, ("device 0", "'cpu_0/loss'"),
             "return BlobReferences",
             forward_fun=lambda m, s: [str(loss) for loss in forward(m, s)]),
    dpm_case("no_losses", ParallelizeError, ("device 0",), "return the list of loss",
             forward_fun=lambda m, s: []),
    dpm_case("gpus_missing", ParallelizeError, ("[0, 1]", "0 GPU"),
             ("SetVirtualGpus", "DPGRAPH_ALLOW_MISSING_GPUS"), setup=no_gpus,
             parallelize_fun=data_parallel_model.Parallelize_GPU,),
    case("parallelize/not_a_model",
        lambda e: data_parallel_model.Parallelize_CPU("m", lambda m: None, forward,
                                                      param_update_builder_fun=param_update,
                                                      devices=[0, 1]),
        ParallelizeError, ("str",), "needs a model_helper.ModelHelper"),
    case("parallelize/twice", parallelize(), ModelStateError, ("'catalog_done'",),
         "new ModelHelper", setup=parallelized_model),
    case("parallelize/run_net_before", lambda e: data_parallel_model.RunNet(e.model, 1),
         NotParallelizedError, ("RunNet", "'catalog_dpm'"), "Parallelize(model, ...) first",
         setup=new_model),
    case("parallelize/blob_sync_prefixed",
         lambda e: data_parallel_model.AddBlobSync(e.model, ["cpu_0/fc_w"]),
         ParallelizeError, ("cpu_0/fc_w",), "unprefixed", setup=parallelized_model),
]

COLLECTIVE_CASES = [
    case("rendezvous/env_missing",
         lambda e: rendezvous.rendezvous_from_env(environ={}), RendezvousError,
         ("RANK", "MASTER_PORT"), "launch with torchrun"),
    case("rendezvous/env_not_int",
         lambda e: rendezvous.rendezvous_from_env(environ={
             "RANK": "zero", "WORLD_SIZE": "2", "MASTER_PORT": "1"}),
         RendezvousError, ("'zero'",), "set RANK, WORLD_SIZE, MASTER_PORT"),
    case("rendezvous/file_store_under_a_file",
         lambda e: rendezvous.file_store(e.path("plain.txt") + "/store"), RendezvousError,
         ("{tmp}/plain.txt",), "every rank can write",
         setup=lambda e: write(e, "plain.txt", b"x")),
    case("rendezvous/tcp_store_bad_port",
         lambda e: rendezvous.tcp_store("127.0.0.1", -5, True, timeout=1), RendezvousError,
         ("-5",), "port must be an int in 0..65535"),
    case("rendezvous/rank_out_of_range", lambda e: cpu.create(rank=3, size=2),
         RendezvousError, ("rank 3 of 2",), "GLOO"),
    case("collectives/shape_mismatch",
         lambda e: world(e).allreduce([np.ones(3, F32), np.ones(4, F32)]), CollectiveError,
         ("allreduce", "'cpu'", "copy 1 has shape (4,)"), "must match"),
    case("collectives/dtype_mismatch",
         lambda e: world(e).allreduce([np.ones(3, F32), np.ones(3, np.float64)]),
         CollectiveError, ("allreduce", "float64"), "must match"),
    case("collectives/list_not_array", lambda e: world(e).allreduce([[1.0, 2.0]]),
         CollectiveError, ("local copy 0 is a list",), "numpy"),
    case("collectives/no_buffers", lambda e: world(e).allreduce([]), CollectiveError,
         ("allreduce", "'cpu'"), "pass at least one local copy"),
    case("collectives/broadcast_root", lambda e: world(e).broadcast([np.ones(2, F32)], 3),
         CollectiveError, ("root 3",), "broadcast"),
    case("collectives/after_close", lambda e: world(e).allreduce([np.ones(2, F32)]),
         CollectiveError, ("destroyed",), "CreateCommonWorld", setup=closed_world),
    case("collectives/nccl_device_copies", nccl_call, ShapeError,
         ("NCCLAllreduce", "'g1' is [4] float32", "gpu_1"), "hint:", setup=nccl_setup),
    case("collectives/allreduce_op_without_world",
         run_op("Allreduce", ["cw", "x"], ["x"], engine="GLOO"), BlobNotFoundError,
         ("Allreduce", "'cw'"), "run the net that produces it", setup=feed(x=np.ones(2, F32))),
    case("collectives/store_handler_without_port",
         run_op("TCPStoreHandlerCreate", [], ["store"]), RendezvousError,
         ("TCPStoreHandlerCreate", "'port'"), "is required"),
]


def load_op(name: str, outputs: list[str], **args: Any) -> Any:
    return lambda env: ws.RunOperatorOnce(core.CreateOperator(
        "Load", [], outputs, db=env.path(name), db_type="minidb", absolute_path=1, **args))


def save_op(inputs: list[str], db_type: str = "minidb") -> Any:
    return lambda env: ws.RunOperatorOnce(core.CreateOperator(
        "Save", inputs, [], db=env.path("out.minidb"), db_type=db_type, absolute_path=1))


def saved_db(env: Env) -> None:
    ws.FeedBlob("w", np.ones(2, F32))
    save_op(["w"])(env)


def huge_record_db(env: Env) -> None:
    blob = caffe2_pb2.BlobProto(name="w", type="Tensor")
    blob.tensor.CopyFrom(huge_tensor())
    write_minidb(env, "huge.minidb", {"w": blob.SerializeToString()})


def tensor_protos_db(env: Env) -> None:
    record = caffe2_pb2.TensorProtos()
    record.protos.append(huge_tensor("x"))
    write_minidb(env, "records.minidb", {"k": record.SerializeToString()})
    ws.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["reader"], db=env.path(
        "records.minidb"), db_type="minidb"))


DB_CASES = [
    case("db/unknown_type", lambda e: open_db("bogus", e.path("x"), Mode.read), DBError,
         ("bogus", "{tmp}/x"), "Registered types"),
    case("db/missing_file", lambda e: open_db("minidb", e.path("missing"), Mode.read),
         DBError, ("{tmp}/missing",), "check the path"),
    case("db/bad_mode", lambda e: open_db("minidb", e.path("x"), "sideways"), DBError,
         ("'sideways'",), "Mode.read, Mode.write or Mode.new"),
    case("db/load_garbage_file", load_op("garbage.minidb", ["w"]), CorruptDataError,
         ("Load", "{tmp}/garbage.minidb"), "truncated or corrupt",
         setup=lambda e: write(e, "garbage.minidb", GARBAGE)),
    case("db/load_absent_key", load_op("out.minidb", ["zz"]), DBError,
         ("Load", "['zz']", "{tmp}/out.minidb"), "Nothing was loaded", setup=saved_db),
    case("db/load_missing_file", load_op("none.minidb", ["w"]), DBError,
         ("Load", "{tmp}/none.minidb"), "check the path"),
    case("db/save_unknown_type", save_op(["w"], "bogusdb"), DBError,
         ("Save", "bogusdb"), "Registered types", setup=feed(w=np.ones(2, F32))),
    case("db/save_missing_blob", save_op(["nope"]), BlobNotFoundError,
         ("Save", "'nope'"), "feed it with workspace.FeedBlob"),
    case("limits/db_record_huge", load_op("huge.minidb", ["w"]), ResourceLimitError,
         ("Load", "{tmp}/huge.minidb", "'w'", "[1000000, 1000000]"), "limit",
         setup=huge_record_db),
    case("limits/tensorprotos_huge",
         run_op("TensorProtosDBInput", ["reader"], ["x"], batch_size=1), ResourceLimitError,
         ("TensorProtosDBInput", "{tmp}/records.minidb", "[1000000, 1000000]"), "limit",
         setup=tensor_protos_db),
    case("data_workers/fetcher_not_callable", init_workers(fetcher=5, batch_size=2),
         DataInputError, ("fetch_fun",), "must be callable",),
    case("data_workers/no_blob_names", init_workers(names=(), batch_size=2),
         DataInputError, ("input_blob_names",), "name the blobs",),
    case("data_workers/zero_threads", init_workers(batch_size=2, num_worker_threads=0),
         DataInputError, ("num_worker_threads",), "must be an int >= 1",),
]

CHECKPOINT_CASES = [
    case("checkpoint/missing_file", lambda e: checkpoint.load_checkpoint(e.tmp / "no.ckpt"),
         CheckpointError, ("{tmp}/no.ckpt",), "No such file"),
    case("checkpoint/empty_file", lambda e: checkpoint.load_checkpoint(e.tmp / "empty.ckpt"),
         CheckpointError, ("{tmp}/empty.ckpt",), "no checkpoint manifest",
         setup=lambda e: write(e, "empty.ckpt", b"")),
    case("checkpoint/garbage", lambda e: checkpoint.load_checkpoint(e.tmp / "bad.ckpt"),
         CheckpointError, ("{tmp}/bad.ckpt",), "not a readable checkpoint",
         setup=lambda e: write(e, "bad.ckpt", GARBAGE)),
    case("checkpoint/truncated", lambda e: checkpoint.load_checkpoint(e.tmp / "cut.ckpt"),
         CheckpointError, ("{tmp}/cut.ckpt",), "truncated",
         setup=lambda e: (saved_checkpoint(e), write(
             e, "cut.ckpt", (e.tmp / "ok.ckpt").read_bytes()[:40]))),
    case("checkpoint/other_model", lambda e: checkpoint.load_checkpoint(e.tmp / "ok.ckpt"),
         CheckpointError, ("'w'", "float32[2, 3]", "float32[4, 3]"), "different model",
         setup=lambda e: (saved_checkpoint(e), ws.FeedBlob("w", np.ones((4, 3), F32)))),
    case("checkpoint/expected_blob_absent",
         lambda e: checkpoint.load_checkpoint(e.tmp / "ok.ckpt", expected=["w", "zzz"]),
         CheckpointError, ("['zzz']",), "different model", setup=saved_checkpoint),
    case("checkpoint/save_missing_blob",
         lambda e: checkpoint.save_checkpoint(e.tmp / "new.ckpt", ["w", "nope"]),
         CheckpointError, ("['nope']",), "run the init net first", setup=saved_checkpoint),
    case("checkpoint/save_to_directory",
         lambda e: checkpoint.save_checkpoint(e.tmp / "adir", ["w"]), CheckpointWriteError,
         ("{tmp}/adir",), "writable",
         setup=lambda e: (saved_checkpoint(e), (e.tmp / "adir").mkdir())),
    case("limits/checkpoint_huge", lambda e: checkpoint.load_checkpoint(e.tmp / "huge.ckpt"),
         ResourceLimitError, ("{tmp}/huge.ckpt", "'w'", "[1000000, 1000000]"), "limit",
         setup=huge_checkpoint),
]

EXPORT_CASES = [
    case("predictor/load_missing_file", predictor_load("none.minidb"), DBError,
         ("{tmp}/none.minidb",), "check the path"),
    case("predictor/load_garbage_file", predictor_load("garbage.minidb"), CorruptDataError,
         ("{tmp}/garbage.minidb",), "truncated or corrupt",
         setup=lambda e: write(e, "garbage.minidb", GARBAGE)),
    case("predictor/save_unfed_input", predictor_save([]), ExportError, ("x",),
         "feed the blob first"),
    case("onnx/parameters_missing", to_onnx(onnx_net(), {}, {"a": (1, 2)}), ExportError,
         ("'catalog_onnx'", "['w', 'b']"), "parameters"),
    case("onnx/input_shape_missing", to_onnx(onnx_net(), PARAMS, {}), ExportError,
         ("'catalog_onnx'", "['a']"), "give their shapes in `inputs`"),
    case("onnx/no_outputs", to_onnx(onnx_net(outputs=False), PARAMS, {"a": (1, 2)}),
         ExportError, ("'catalog_onnx'",), "pass `outputs`"),
    case("onnx/not_a_net", to_onnx(5, {}, {}), ExportError, ("got int",),
         "pass a core.Net"),
    case("onnx/negative_input_dim", to_onnx(onnx_net(), PARAMS, {"a": (-1, 2)}), ExportError,
         ("'a'", "dim -1"), "for a symbolic dim"),
    case("onnx/input_dtype", to_onnx(onnx_net(), PARAMS, {"a": ((1, 2), "complex")}),
         ExportError, ("'a'", "'complex'"), "use a numeric dtype"),
    case("onnx/input_shape_not_tuple", to_onnx(onnx_net(), PARAMS, {"a": "1x2"}),
         ExportError, ("'a'", "'1x2'"), "give e.g."),
    case("onnx/unknown_output", to_onnx(onnx_net(), PARAMS, {"a": (1, 2)}, outputs=["zz"]),
         ExportError, ("'zz'", "'catalog_onnx'"), "name blobs that an op of the net writes"),
    case("onnx/opset", to_onnx(onnx_net(), PARAMS, {"a": (1, 2)}, opset=5), ExportError,
         ("opset 5",), "use 13 to"),
    case("onnx/unsupported_op", to_onnx(lstm_net(), {}, {}), ExportError,
         ("'catalog_unsupported'", "LSTMUnit"), "docs/export.md"),
]


def cli_case(case_id: str, argv: list[str], names: tuple[str, ...], hint: Any,
             setup: Any = None) -> Any:
    def call(env: Env) -> None:
        run_cli([a.format(tmp=env.tmp) for a in argv])
    return case(f"cli/{case_id}", call, CommandError, names, hint, setup=setup)


CLI_CASES = [
    cli_case("inspect_missing", ["inspect", "{tmp}/missing.pb"],
             ("dpgraph inspect: error:", "{tmp}/missing.pb"), "check the path"),
    cli_case("inspect_garbage", ["inspect", "{tmp}/garbage.pb"],
             ("dpgraph inspect: error:", "{tmp}/garbage.pb"), "binary Caffe2 protobuf",
             setup=lambda e: write(e, "garbage.pb", GARBAGE)),
    cli_case("verify_missing", ["verify", "{tmp}/missing.pb"],
             ("dpgraph verify: error:", "{tmp}/missing.pb"), "check the path"),
    cli_case("verify_hostile_nesting", ["verify", "{tmp}/deep.pb"],
             ("dpgraph verify: error:", "{tmp}/deep.pb"), "flatten",
             setup=lambda e: write(e, "deep.pb", deep_net(40).SerializeToString())),
    cli_case("draw_to_directory", ["draw", "{tmp}/net.pb", "-o", "{tmp}"],
             ("dpgraph draw: error:",), "use a .dot, .svg, .png or .pdf output",
             setup=write_net),
    cli_case("export_onnx_missing_arguments", ["export-onnx", "{tmp}/net.pb"],
             ("export-onnx", "INIT"), "the following arguments are required",
             setup=write_net),
    cli_case("export_onnx_missing_init",
             ["export-onnx", "{tmp}/net.pb", "{tmp}/none.pb", "-o", "{tmp}/o.onnx"],
             ("dpgraph export-onnx: error:", "{tmp}/none.pb"), "check the path",
             setup=write_net),
    cli_case("export_onnx_bad_input_spec",
             ["export-onnx", "{tmp}/net.pb", "{tmp}/net.pb", "-o", "{tmp}/o.onnx",
              "--input", "x:1,?"], ("--input 'x:1,?'",), "dims are integers or names",
             setup=write_net),
    cli_case("inspect_missing_init", ["inspect", "{tmp}/net.pb", "--init", "{tmp}/no.pb"],
             ("dpgraph inspect: error:", "{tmp}/no.pb"), "check the path", setup=write_net),
    cli_case("inspect_nesting_over_limit", ["inspect", "{tmp}/deep.pb"],
             ("dpgraph inspect: error:", "{tmp}/deep.pb", "3 levels"), HINT_NESTING,
             setup=lambda e: (write(e, "deep.pb", deep_net(6).SerializeToString()),
                              proto_io.set_max_nesting_depth(3))),
    cli_case("unknown_command", ["frobnicate"], ("'frobnicate'",), "choose from"),
    cli_case("demo_devices_not_int", ["demo", "--devices", "abc"], ("--devices", "'abc'"),
             "invalid int value"),
    cli_case("demo_zero_devices", ["demo", "--devices", "0"], ("dpgraph demo: error:",
                                                               "--devices"), "need --devices >= 1"),
]

ALL_CASES = (IR_CASES + OP_CASES + RUNTIME_CASES + PARALLEL_CASES + COLLECTIVE_CASES +
             DB_CASES + CHECKPOINT_CASES + EXPORT_CASES + CLI_CASES)


@pytest.mark.parametrize("item", ALL_CASES)
def test_bad_input(item: Any, tmp_path: Path) -> None:
    check_case(item, Env(tmp=tmp_path))


def test_catalog_size_and_coverage() -> None:
    """At least 80 distinct bad inputs, across every area issue 21 names."""
    ids = [p.id for p in ALL_CASES]
    assert len(ids) == len(set(ids)) >= 80
    areas = {i.split("/")[0] for i in ids}
    assert areas >= {"ir", "ops", "runtime", "parallelize", "rendezvous", "collectives", "db",
                     "data_workers", "checkpoint", "limits", "predictor", "onnx", "cli"}


def test_limits_are_configurable_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensor-size limit comes from the setter, else the environment, else 64 GiB; a
    bad setting is refused with a typed error."""
    assert proto_io.max_tensor_bytes() == proto_io.DEFAULT_MAX_TENSOR_BYTES
    monkeypatch.setenv("DPGRAPH_MAX_TENSOR_BYTES", "1e6")
    assert proto_io.max_tensor_bytes() == 10**6
    assert proto_io.set_max_tensor_bytes(4096) is None
    assert proto_io.max_tensor_bytes() == 4096
    ws.RunOperatorOnce(core.CreateOperator("ConstantFill", [], ["ok"], shape=[1024]))
    with pytest.raises(ResourceLimitError):
        ws.RunOperatorOnce(core.CreateOperator("ConstantFill", [], ["big"], shape=[1025]))
    assert not ws.HasBlob("big")
    monkeypatch.setenv("DPGRAPH_MAX_TENSOR_BYTES", "lots")
    proto_io.set_max_tensor_bytes(None)
    with pytest.raises(ResourceLimitError, match="DPGRAPH_MAX_TENSOR_BYTES='lots'"):
        proto_io.max_tensor_bytes()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ArgumentError):
            proto_io.set_max_tensor_bytes(bad)  # type: ignore[arg-type]
    monkeypatch.setenv("DPGRAPH_MAX_NESTING_DEPTH", "3")
    proto_io.check_nesting(deep_net(2))
    with pytest.raises(ResourceLimitError):
        proto_io.check_nesting(deep_net(3))


def test_operator_error_of_a_fill_is_still_an_operator_error() -> None:
    """A refused fill is both the ResourceLimitError and the OperatorError naming the op."""
    with pytest.raises(OperatorError) as info:
        ws.RunOperatorOnce(core.CreateOperator("ConstantFill", [], ["y"], shape=[10**13]))
    assert isinstance(info.value, ResourceLimitError) and isinstance(info.value, MemoryError)
    assert info.value.op_type == "ConstantFill"


def test_cli_failure_view_is_typed() -> None:
    assert issubclass(CliFailure, CommandError)


def test_runtime_doc_limits_example() -> None:
    """The docs/runtime.md "Resource limits" snippet runs and restores the setting."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"
    section = doc.read_text().split("## Resource limits", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, str(doc), "exec"), {})  # noqa: S102
    assert proto_io.max_tensor_bytes() == proto_io.DEFAULT_MAX_TENSOR_BYTES
