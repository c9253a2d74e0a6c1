"""MetaNetDef helpers: Caffe2's ``predictor_py_utils`` (the keyed nets, plans and blob lists
of a saved predictor) and the predict / predict-init nets built from an export meta.

The maps of a MetaNetDef are repeated ``{key, value}`` messages, not proto maps: a lookup
returns the first entry with the key, ``AddNet``/``AddPlan`` always append::

    m = metanet_pb2.MetaNetDef()
    AddBlobs(m, "INPUTS_BLOB_TYPE", ["data"]); AddBlobs(m, "INPUTS_BLOB_TYPE", ["label"])
    GetBlobs(m, "INPUTS_BLOB_TYPE")        # ['data', 'label']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dpgraph.errors import ExportError
from dpgraph.ir import scope
from dpgraph.ir.net import Net
from dpgraph.ir.operator import CreateOperator
from dpgraph.proto import caffe2_pb2, metanet_pb2


def get_comp_name(string: str, name: str) -> str:
    """``TYPE_name``, or ``TYPE`` alone when ``name`` is empty."""
    return string + "_" + name if name else string


def to_first_match_dict(kv_list: Iterable[Any]) -> dict[Any, Any]:
    """``{key: value}`` of a repeated key/value field; the first entry of a key wins."""
    result: dict[Any, Any] = {}
    for kv in kv_list:
        result.setdefault(kv.key, kv.value)
    return result


def _ProtoMapGet(field: Iterable[Any], key: str) -> Any:
    """The value of the first entry with ``key``, or None."""
    for kv in field:
        if kv.key == key:
            return kv.value
    return None


def GetPlan(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    return _ProtoMapGet(meta_net_def.plans, key)


def GetPlanOriginal(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    return _ProtoMapGet(meta_net_def.plans, key)


def GetBlobs(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    """The blob names stored under ``key`` (``[]`` if absent)."""
    blobs = _ProtoMapGet(meta_net_def.blobs, key)
    return [] if blobs is None else blobs


def GetBlobsByTypePrefix(meta_net_def: metanet_pb2.MetaNetDef, blob_type_prefix: str
                         ) -> list[str]:
    """Names, without duplicates, from every blob list whose key starts with the prefix."""
    found: dict[str, None] = {}
    for entry in meta_net_def.blobs:
        if entry.key.startswith(blob_type_prefix):
            found.update(dict.fromkeys(entry.value))
    return list(found)


def GetNet(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    return _ProtoMapGet(meta_net_def.nets, key)


def GetNetOriginal(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    return _ProtoMapGet(meta_net_def.nets, key)


def GetApplicationSpecificInfo(meta_net_def: metanet_pb2.MetaNetDef, key: str) -> Any:
    return _ProtoMapGet(meta_net_def.applicationSpecificInfo, key)


def GetApplicationSpecificInfoDict(meta_net_def: metanet_pb2.MetaNetDef) -> dict[str, str]:
    return to_first_match_dict(meta_net_def.applicationSpecificInfo)


def AddBlobs(meta_net_def: metanet_pb2.MetaNetDef, blob_name: str,
             blob_def: Iterable[Any]) -> None:
    """Append names to the list under ``blob_name`` (created when missing)."""
    blobs = _ProtoMapGet(meta_net_def.blobs, blob_name)
    if blobs is None:
        blobs = meta_net_def.blobs.add(key=blob_name).value
    blobs.extend(str(b) for b in blob_def)


def ReplaceBlobs(meta_net_def: metanet_pb2.MetaNetDef, blob_name: str,
                 blob_def: Iterable[Any]) -> None:
    """Replace the list under ``blob_name``, which must exist."""
    blobs = _ProtoMapGet(meta_net_def.blobs, blob_name)
    assert blobs is not None, f"The blob_name:{blob_name} does not exist"
    del blobs[:]
    blobs.extend(str(b) for b in blob_def)


def AddPlan(meta_net_def: metanet_pb2.MetaNetDef, plan_name: str,
            plan_def: caffe2_pb2.PlanDef) -> None:
    meta_net_def.plans.add(key=plan_name).value.CopyFrom(plan_def)


def AddNet(meta_net_def: metanet_pb2.MetaNetDef, net_name: str,
           net_def: caffe2_pb2.NetDef) -> None:
    meta_net_def.nets.add(key=net_name).value.CopyFrom(net_def)


def SetBlobsOrder(meta_net_def: metanet_pb2.MetaNetDef, blobs_order: Iterable[str]) -> None:
    meta_net_def.blobsOrder.extend(blobs_order)


def SetPreLoadBlobs(meta_net_def: metanet_pb2.MetaNetDef, pre_load_blobs: Iterable[str]
                    ) -> None:
    meta_net_def.preLoadBlobs.extend(pre_load_blobs)


def SetRequestOnlyEmbeddings(meta_net_def: metanet_pb2.MetaNetDef,
                             request_only_embeddings: Iterable[str]) -> None:
    meta_net_def.requestOnlyEmbeddings.extend(request_only_embeddings)


def GetBlobsOrder(meta_net_def: metanet_pb2.MetaNetDef) -> Any:
    return meta_net_def.blobsOrder


def SetTensorBoundShapes(meta_net_def: metanet_pb2.MetaNetDef,
                         tensor_bound_shapes: metanet_pb2.TensorBoundShapes) -> None:
    meta_net_def.tensorBoundShapes.CopyFrom(tensor_bound_shapes)


def SetAOTConfig(meta_net_def: metanet_pb2.MetaNetDef, aot_config: metanet_pb2.AOTConfig
                 ) -> None:
    meta_net_def.aotConfig.CopyFrom(aot_config)


def GetArgumentByName(net_def: caffe2_pb2.NetDef, arg_name: str) -> Any:
    for arg in net_def.arg:
        if arg.name == arg_name:
            return arg
    return None


# --- nets built from an export meta -----------------------------------------------------------
def AddModelIdArg(meta: Any, net_def: caffe2_pb2.NetDef) -> None:
    """Copy the predict net's int ``model_id`` argument into ``net_def``."""
    if not isinstance(meta.predict_net, caffe2_pb2.NetDef):
        return
    model_id = GetArgumentByName(meta.predict_net, "model_id")
    if model_id is None:
        return
    existing = GetArgumentByName(net_def, "model_id")
    if existing is None:
        existing = net_def.arg.add()
        existing.name = "model_id"
    existing.i = model_id.i


def create_predict_net(predictor_export_meta: Any) -> caffe2_pb2.NetDef:
    """The predict net: the meta's ops, inputs + parameters as external inputs."""
    meta = predictor_export_meta
    source = meta.predict_net
    net = caffe2_pb2.NetDef()
    net.name = source.name or "predict"
    net.op.extend(source.op)
    if "partition_info" in net.DESCRIPTOR.fields_by_name:  # not in dpgraph's NetDef yet
        net.partition_info.extend(source.partition_info)
    net.external_input.extend(list(meta.inputs) + list(meta.parameters))
    net.external_output.extend(meta.outputs)
    net.arg.extend(source.arg)
    if meta.net_type is not None:
        net.type = meta.net_type
    if meta.num_workers is not None:
        net.num_workers = meta.num_workers
    return net


def _blob_shape(ws: Any, blob: str, shapes: dict[str, Any]) -> Sequence[int]:
    shape = shapes.get(blob)
    if shape is not None:
        return [int(d) for d in shape]
    if ws is None or blob not in ws.blobs:
        raise ExportError(f"{blob} not in workspace but needed for shape: {shapes}; give "
                          "PredictorExportMeta(shapes={blob: shape}) or feed the blob first.")
    return list(ws.blobs[blob].fetch().shape)


def create_predict_init_net(ws: Any, predictor_export_meta: Any) -> caffe2_pb2.NetDef:
    """``predict-init``: a zero ConstantFill (no device option) per input and output,
    shaped from ``meta.shapes`` or the workspace, then the meta's ``extra_init_net``."""
    meta = predictor_export_meta
    net = Net("predict-init")
    blobs = list(meta.inputs) + list(meta.outputs)
    with scope.EmptyDeviceScope():
        for blob in blobs:
            net.Proto().op.append(CreateOperator(
                "ConstantFill", [], [blob], shape=_blob_shape(ws, blob, meta.shapes),
                value=0.0))
    net.Proto().external_input.extend(blobs)
    if meta.extra_init_net is not None:
        net.AppendNet(meta.extra_init_net)
    proto = net.Proto()
    AddModelIdArg(meta, proto)
    return proto


__all__ = [
    "AddBlobs", "AddModelIdArg", "AddNet", "AddPlan", "GetApplicationSpecificInfo",
    "GetApplicationSpecificInfoDict", "GetArgumentByName", "GetBlobs", "GetBlobsByTypePrefix",
    "GetBlobsOrder", "GetNet", "GetNetOriginal", "GetPlan", "GetPlanOriginal", "ReplaceBlobs",
    "SetAOTConfig", "SetBlobsOrder", "SetPreLoadBlobs", "SetRequestOnlyEmbeddings",
    "SetTensorBoundShapes", "_ProtoMapGet", "create_predict_init_net", "create_predict_net",
    "deserialize_protobuf_struct", "get_comp_name", "serialize_protobuf_struct",
    "to_first_match_dict",
]


# --- serde ------------------------------------------------------------------------------------
def serialize_protobuf_struct(protobuf_struct: Any) -> bytes:
    return protobuf_struct.SerializeToString()


def deserialize_protobuf_struct(serialized_protobuf: bytes, struct_type: Any) -> Any:
    deser = struct_type()
    deser.ParseFromString(serialized_protobuf)
    return deser
