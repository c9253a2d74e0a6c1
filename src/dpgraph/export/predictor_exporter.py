"""Caffe2's predictor exporter: a :class:`PredictorExportMeta` saved with :func:`save_to_db`
into a DB (``minidb``, ``lmdb``, ...) together with the parameters, and read back with
:func:`load_from_db` / :func:`prepare_prediction_net`.

The DB holds, in this order (a ``Save`` op writes them), the serialized MetaNetDef under
``!!META_NET_DEF`` and one record per parameter.  The MetaNetDef carries three nets: the
global-init net (a ``Load`` of the parameters from the ``!!PREDICTOR_DBREADER`` reader), the
predict-init net (zero fills for inputs and outputs) and the predict net::

    meta = PredictorExportMeta(predict_net, parameters=["fc_w", "fc_b"], inputs=["data"],
                               outputs=["softmax"], shapes={"data": (1, 4), "softmax": (1, 2)})
    save_to_db("minidb", "/tmp/model.minidb", meta)
    net = prepare_prediction_net("/tmp/model.minidb", "minidb")   # in a fresh process
    workspace.FeedBlob("data", x); workspace.RunNet(net)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from dpgraph.export.metanet import (
    AddBlobs,
    AddModelIdArg,
    AddNet,
    GetNet,
    create_predict_init_net,
    create_predict_net,
    get_comp_name,
)
from dpgraph.ir import scope
from dpgraph.ir.device import DeviceOption
from dpgraph.ir.net import Net
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.plan import Plan
from dpgraph.ir.proto_io import parse_proto
from dpgraph.proto import caffe2_pb2, metanet_pb2, predictor_consts_pb2
from dpgraph.runtime import api

predictor_constants = predictor_consts_pb2.PredictorConsts()

class _ExportMetaFields(NamedTuple):
    predict_net: Any
    parameters: list[str]
    inputs: list[str]
    outputs: list[str]
    shapes: dict[str, Any]
    name: str
    extra_init_net: Any
    global_init_net: Any
    net_type: str | None
    num_workers: int | None
    trainer_prefix: str | None


class PredictorExportMeta(_ExportMetaFields):
    """What a saved predictor holds: the predict net, its parameter / input / output blob
    names, known shapes, optional extra nets, and the predict net's type and workers."""

    def __new__(cls, predict_net: Any, parameters: Iterable[Any], inputs: Iterable[Any],
                outputs: Iterable[Any], shapes: dict[str, Any] | None = None, name: str = "",
                extra_init_net: Any = None, global_init_net: Any = None,
                net_type: str | None = None, num_workers: int | None = None,
                trainer_prefix: str | None = None) -> PredictorExportMeta:
        inputs = [str(i) for i in inputs]
        outputs = [str(o) for o in outputs]
        assert len(set(inputs)) == len(inputs), (
            "All inputs to the predictor should be unique")
        parameters = [str(p) for p in parameters]
        assert set(parameters).isdisjoint(inputs), (
            "Parameters and inputs are required to be disjoint. Intersection: "
            f"{set(parameters).intersection(inputs)}")
        assert set(parameters).isdisjoint(outputs), (
            "Parameters and outputs are required to be disjoint. Intersection: "
            f"{set(parameters).intersection(outputs)}")
        shapes = shapes or {}
        if isinstance(predict_net, (Net, Plan)):
            predict_net = predict_net.Proto()
        assert isinstance(predict_net, (caffe2_pb2.NetDef, caffe2_pb2.PlanDef)), (
            f"predict_net must be a Net, NetDef, Plan or PlanDef, got {type(predict_net)}")
        return super().__new__(cls, predict_net, parameters, inputs,  # type: ignore[call-arg]
                                outputs, shapes, name, extra_init_net, global_init_net,
                                net_type, num_workers, trainer_prefix)

    def inputs_name(self) -> str:
        return get_comp_name(predictor_constants.INPUTS_BLOB_TYPE, self.name)

    def outputs_name(self) -> str:
        return get_comp_name(predictor_constants.OUTPUTS_BLOB_TYPE, self.name)

    def parameters_name(self) -> str:
        return get_comp_name(predictor_constants.PARAMETERS_BLOB_TYPE, self.name)

    def global_init_name(self) -> str:
        return get_comp_name(predictor_constants.GLOBAL_INIT_NET_TYPE, self.name)

    def predict_init_name(self) -> str:
        return get_comp_name(predictor_constants.PREDICT_INIT_NET_TYPE, self.name)

    def predict_net_name(self) -> str:
        return get_comp_name(predictor_constants.PREDICT_NET_TYPE, self.name)

    def _trainer_prefixed(self, name: str) -> str:
        return f"{self.trainer_prefix}_{name}" if self.trainer_prefix else name

    def train_init_plan_name(self) -> str:
        return self._trainer_prefixed(
            get_comp_name(predictor_constants.TRAIN_INIT_PLAN_TYPE, self.name))

    def train_plan_name(self) -> str:
        return self._trainer_prefixed(
            get_comp_name(predictor_constants.TRAIN_PLAN_TYPE, self.name))


def get_predictor_exporter_helper(submodelNetName: str) -> PredictorExportMeta:
    """A stub meta named ``submodelNetName``, used only to compute the keys."""
    return PredictorExportMeta(predict_net=Net(submodelNetName), parameters=[], inputs=[],
                               outputs=[], shapes=None, name=submodelNetName)


class _CurrentWorkspaceBlobs:
    """``ws.blobs`` of the current workspace, as Caffe2's C Workspace exposes it."""

    class _Blob:
        def __init__(self, name: str) -> None:
            self.name = name

        def fetch(self) -> Any:
            return api.FetchBlob(self.name)

    class _Blobs:
        def __contains__(self, name: Any) -> bool:
            return api.HasBlob(name)

        def __getitem__(self, name: Any) -> Any:
            return _CurrentWorkspaceBlobs._Blob(str(name))

    blobs = _Blobs()


def _global_init_net(predictor_export_meta: PredictorExportMeta,
                     db_type: str | None) -> caffe2_pb2.NetDef:
    meta = predictor_export_meta
    net = Net("global-init")
    if db_type != "manifold_db":
        net.Proto().op.append(CreateOperator(
            "Load", [predictor_constants.PREDICTOR_DBREADER], meta.parameters))
        net.Proto().external_input.append(predictor_constants.PREDICTOR_DBREADER)
        net.Proto().external_output.extend(meta.parameters)
    if meta.global_init_net is not None:
        net.AppendNet(meta.global_init_net)
    proto = net.Proto()
    AddModelIdArg(meta, proto)
    return proto


def get_meta_net_def(predictor_export_meta: PredictorExportMeta, ws: Any = None,
                     db_type: str | None = None) -> metanet_pb2.MetaNetDef:
    """The MetaNetDef of a meta: predict-init, global-init and predict nets, then the
    parameter, input and output lists.  ``ws`` (default: the current workspace) supplies
    input/output shapes that ``meta.shapes`` lacks."""
    meta = predictor_export_meta
    ws = ws if ws is not None else _CurrentWorkspaceBlobs()
    meta_net_def = metanet_pb2.MetaNetDef()
    AddNet(meta_net_def, meta.predict_init_name(), create_predict_init_net(ws, meta))
    AddNet(meta_net_def, meta.global_init_name(), _global_init_net(meta, db_type))
    AddNet(meta_net_def, meta.predict_net_name(), create_predict_net(meta))
    AddBlobs(meta_net_def, meta.parameters_name(), meta.parameters)
    AddBlobs(meta_net_def, meta.inputs_name(), meta.inputs)
    AddBlobs(meta_net_def, meta.outputs_name(), meta.outputs)
    return meta_net_def


def set_model_info(meta_net_def: metanet_pb2.MetaNetDef, project_str: str,
                   model_class_str: str, version: Any) -> None:
    assert isinstance(meta_net_def, metanet_pb2.MetaNetDef)
    meta_net_def.modelInfo.project = project_str
    meta_net_def.modelInfo.modelClass = model_class_str
    meta_net_def.modelInfo.version = version


def save_to_db(db_type: str, db_destination: str,
               predictor_export_meta: PredictorExportMeta, use_ideep: bool = False,
               *args: Any, **kwargs: Any) -> None:
    """Write the MetaNetDef (first) and the parameters from the current workspace into a
    DB with one ``Save`` op; extra keyword arguments (e.g. ``chunk_size``) go to Save."""
    meta_net_def = get_meta_net_def(predictor_export_meta, db_type=db_type)
    device_type = caffe2_pb2.PROTO_IDEEP if use_ideep else caffe2_pb2.PROTO_CPU
    with scope.DeviceScope(DeviceOption(caffe2_pb2.PROTO_CPU)):
        api.FeedBlob(predictor_constants.META_NET_DEF, meta_net_def.SerializeToString())
    op = CreateOperator(
        "Save", [predictor_constants.META_NET_DEF] + list(predictor_export_meta.parameters),
        [], absolute_path=True, db=db_destination, db_type=db_type,
        device_option=DeviceOption(device_type), **kwargs)
    api.RunOperatorOnce(op)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, np.ndarray) and value.dtype == object and value.size == 1:
        return _as_bytes(value.item())
    return str(value).encode()


def read_meta_net_def(ws: Any, filename: str, db_type: str) -> metanet_pb2.MetaNetDef:
    """Open the DB as ``!!PREDICTOR_DBREADER`` in runtime workspace ``ws`` and parse the
    ``!!META_NET_DEF`` record (the reader stays open for the global-init net's Load)."""
    created = ws.run_operators_once([CreateOperator(
        "CreateDB", [], [predictor_constants.PREDICTOR_DBREADER], db=filename,
        db_type=db_type)])
    assert created, f"Failed to create db {filename}"
    ws.run_operators_once([CreateOperator(
        "Load", [predictor_constants.PREDICTOR_DBREADER],
        [predictor_constants.META_NET_DEF])])
    return parse_proto(metanet_pb2.MetaNetDef,
                       _as_bytes(ws.fetch_blob(predictor_constants.META_NET_DEF)),
                       f"{filename}: record {predictor_constants.META_NET_DEF}")


def load_from_db(filename: str, db_type: str,
                 device_option: caffe2_pb2.DeviceOption | None = None,
                 *args: Any, **kwargs: Any) -> metanet_pb2.MetaNetDef:
    """Open the DB as ``!!PREDICTOR_DBREADER``, load and parse ``!!META_NET_DEF``; every op
    of its nets gets ``device_option`` (default: the current device scope) when given."""
    meta_net_def = read_meta_net_def(api.current(), filename, db_type)
    if device_option is None:
        device_option = scope.CurrentDeviceScope()
    if device_option is not None:
        for kv in meta_net_def.nets:
            for op in kv.value.op:
                op.device_option.CopyFrom(device_option)
    return meta_net_def


def prepare_prediction_net(filename: str, db_type: str,
                           device_option: caffe2_pb2.DeviceOption | None = None) -> Net:
    """Load a saved predictor, run its global-init and predict-init nets, create the
    predict net in the current workspace and return it."""
    meta_net_def = load_from_db(filename, db_type, device_option)
    api.RunNetOnce(GetNet(meta_net_def, predictor_constants.GLOBAL_INIT_NET_TYPE))
    api.RunNetOnce(GetNet(meta_net_def, predictor_constants.PREDICT_INIT_NET_TYPE))
    predict_net = Net(GetNet(meta_net_def, predictor_constants.PREDICT_NET_TYPE))
    api.CreateNet(predict_net)
    return predict_net


# --- models replicated by Parallelize ---------------------------------------------------------
def _strip(name: str, prefix: str) -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


def parallel_model_export_meta(model: Any, inputs: Iterable[Any], outputs: Iterable[Any],
                               shapes: dict[str, Any] | None = None, **meta_kwargs: Any
                               ) -> tuple[PredictorExportMeta, dict[str, str]]:
    """The export meta of the first device of a Parallelized (test-mode) model, with the
    device prefix (``gpu_0/``, ``cpu_0/``) stripped from every blob, on CPU.

    Returns ``(meta, {exported name: workspace blob name})``; :func:`save_parallel_model`
    saves it.  ``inputs``/``outputs`` are unprefixed (``["data"]``, ``["softmax"]``).
    """
    from dpgraph.modeling.model_helper import ExtractPredictorNet

    prefix = f"{model._device_prefix}_{model._devices[0]}/"
    source = caffe2_pb2.NetDef()
    source.CopyFrom(model.net.Proto())  # ExtractPredictorNet moves the kept ops in place
    inputs, outputs = [str(b) for b in inputs], [str(b) for b in outputs]
    predict_net, params = ExtractPredictorNet(
        source, [prefix + b for b in inputs], [prefix + b for b in outputs],
        DeviceOption(caffe2_pb2.PROTO_CPU))
    proto = predict_net.Proto()
    for op in proto.op:
        for field in (op.input, op.output):
            field[:] = [_strip(b, prefix) for b in field]
    for field in (proto.external_input, proto.external_output):
        field[:] = [_strip(b, prefix) for b in field]
    sources = {_strip(str(p), prefix): str(p) for p in params}
    meta = PredictorExportMeta(proto, list(sources), inputs, outputs, shapes=shapes,
                               **meta_kwargs)
    return meta, sources


def save_parallel_model(db_type: str, db_destination: str, model: Any, inputs: Iterable[Any],
                        outputs: Iterable[Any], shapes: dict[str, Any] | None = None,
                        **kwargs: Any) -> PredictorExportMeta:
    """``save_to_db`` for the first device of a Parallelized test model, without device
    prefixes: the parameters are copied into a scratch workspace under their exported
    names and saved from there; the current workspace is left unchanged."""
    meta, sources = parallel_model_export_meta(model, inputs, outputs, shapes)
    values = {name: api.FetchBlob(blob) for name, blob in sources.items()}
    shape_source = {b: np.shape(api.FetchBlob(f"{model._device_prefix}_{model._devices[0]}/"
                                              + b))
                    for b in meta.inputs + meta.outputs if b not in meta.shapes}
    meta = meta._replace(shapes={**shape_source, **meta.shapes})
    previous = api.CurrentWorkspace()
    scratch = f"__dpgraph_export_{previous}"
    api.SwitchWorkspace(scratch, True)
    try:
        for name, value in values.items():
            api.FeedBlob(name, value)
        save_to_db(db_type, db_destination, meta, **kwargs)
    finally:
        api.ResetWorkspace()
        api.SwitchWorkspace(previous)
    return meta


__all__ = [
    "PredictorExportMeta", "get_meta_net_def", "get_predictor_exporter_helper",
    "load_from_db", "parallel_model_export_meta", "predictor_constants", "read_meta_net_def",
    "prepare_prediction_net", "save_parallel_model", "save_to_db", "set_model_info",
]
