from dpgraph.proto import caffe2_pb2 as _caffe2_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorBoundShape(_message.Message):
    __slots__ = ("shape", "dim_type", "name", "shape_is_final")
    class DimType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[TensorBoundShape.DimType]
        CONSTANT: _ClassVar[TensorBoundShape.DimType]
        BATCH: _ClassVar[TensorBoundShape.DimType]
        BATCH_OF_FEATURE_MAX: _ClassVar[TensorBoundShape.DimType]
        BATCH_OF_FEATURE_MAX_DEFAULT: _ClassVar[TensorBoundShape.DimType]
        FEATURE_MAX: _ClassVar[TensorBoundShape.DimType]
        FEATURE_MAX_DEFAULT: _ClassVar[TensorBoundShape.DimType]
    UNKNOWN: TensorBoundShape.DimType
    CONSTANT: TensorBoundShape.DimType
    BATCH: TensorBoundShape.DimType
    BATCH_OF_FEATURE_MAX: TensorBoundShape.DimType
    BATCH_OF_FEATURE_MAX_DEFAULT: TensorBoundShape.DimType
    FEATURE_MAX: TensorBoundShape.DimType
    FEATURE_MAX_DEFAULT: TensorBoundShape.DimType
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DIM_TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    shape: _caffe2_pb2.TensorShape
    dim_type: _containers.RepeatedScalarFieldContainer[TensorBoundShape.DimType]
    name: str
    shape_is_final: bool
    def __init__(self, shape: _Optional[_Union[_caffe2_pb2.TensorShape, _Mapping]] = ..., dim_type: _Optional[_Iterable[_Union[TensorBoundShape.DimType, str]]] = ..., name: _Optional[str] = ..., shape_is_final: _Optional[bool] = ...) -> None: ...

class TensorBoundShapes(_message.Message):
    __slots__ = ("shapes", "max_batch_size", "max_feature_len")
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_FEATURE_LEN_FIELD_NUMBER: _ClassVar[int]
    shapes: _containers.RepeatedCompositeFieldContainer[TensorBoundShape]
    max_batch_size: int
    max_feature_len: int
    def __init__(self, shapes: _Optional[_Iterable[_Union[TensorBoundShape, _Mapping]]] = ..., max_batch_size: _Optional[int] = ..., max_feature_len: _Optional[int] = ...) -> None: ...

class AOTConfig(_message.Message):
    __slots__ = ("max_batch_size", "max_seq_size", "in_batch_broadcast", "onnxifi_blacklist_ops", "onnxifi_min_ops")
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_SIZE_FIELD_NUMBER: _ClassVar[int]
    IN_BATCH_BROADCAST_FIELD_NUMBER: _ClassVar[int]
    ONNXIFI_BLACKLIST_OPS_FIELD_NUMBER: _ClassVar[int]
    ONNXIFI_MIN_OPS_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: int
    max_seq_size: int
    in_batch_broadcast: bool
    onnxifi_blacklist_ops: str
    onnxifi_min_ops: int
    def __init__(self, max_batch_size: _Optional[int] = ..., max_seq_size: _Optional[int] = ..., in_batch_broadcast: _Optional[bool] = ..., onnxifi_blacklist_ops: _Optional[str] = ..., onnxifi_min_ops: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("project", "modelClass", "version", "predictorType", "modelId")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    MODELCLASS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREDICTORTYPE_FIELD_NUMBER: _ClassVar[int]
    MODELID_FIELD_NUMBER: _ClassVar[int]
    project: str
    modelClass: str
    version: str
    predictorType: str
    modelId: str
    def __init__(self, project: _Optional[str] = ..., modelClass: _Optional[str] = ..., version: _Optional[str] = ..., predictorType: _Optional[str] = ..., modelId: _Optional[str] = ...) -> None: ...

class BlobsMap(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., value: _Optional[_Iterable[str]] = ...) -> None: ...

class NetsMap(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: _caffe2_pb2.NetDef
    def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_caffe2_pb2.NetDef, _Mapping]] = ...) -> None: ...

class PlansMap(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: _caffe2_pb2.PlanDef
    def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_caffe2_pb2.PlanDef, _Mapping]] = ...) -> None: ...

class StringMap(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class MetaNetDef(_message.Message):
    __slots__ = ("blobs", "nets", "modelInfo", "plans", "applicationSpecificInfo", "blobsOrder", "preLoadBlobs", "tensorBoundShapes", "requestOnlyEmbeddings", "aotConfig")
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    NETS_FIELD_NUMBER: _ClassVar[int]
    MODELINFO_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    APPLICATIONSPECIFICINFO_FIELD_NUMBER: _ClassVar[int]
    BLOBSORDER_FIELD_NUMBER: _ClassVar[int]
    PRELOADBLOBS_FIELD_NUMBER: _ClassVar[int]
    TENSORBOUNDSHAPES_FIELD_NUMBER: _ClassVar[int]
    REQUESTONLYEMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    AOTCONFIG_FIELD_NUMBER: _ClassVar[int]
    blobs: _containers.RepeatedCompositeFieldContainer[BlobsMap]
    nets: _containers.RepeatedCompositeFieldContainer[NetsMap]
    modelInfo: ModelInfo
    plans: _containers.RepeatedCompositeFieldContainer[PlansMap]
    applicationSpecificInfo: _containers.RepeatedCompositeFieldContainer[StringMap]
    blobsOrder: _containers.RepeatedScalarFieldContainer[str]
    preLoadBlobs: _containers.RepeatedScalarFieldContainer[str]
    tensorBoundShapes: TensorBoundShapes
    requestOnlyEmbeddings: _containers.RepeatedScalarFieldContainer[str]
    aotConfig: AOTConfig
    def __init__(self, blobs: _Optional[_Iterable[_Union[BlobsMap, _Mapping]]] = ..., nets: _Optional[_Iterable[_Union[NetsMap, _Mapping]]] = ..., modelInfo: _Optional[_Union[ModelInfo, _Mapping]] = ..., plans: _Optional[_Iterable[_Union[PlansMap, _Mapping]]] = ..., applicationSpecificInfo: _Optional[_Iterable[_Union[StringMap, _Mapping]]] = ..., blobsOrder: _Optional[_Iterable[str]] = ..., preLoadBlobs: _Optional[_Iterable[str]] = ..., tensorBoundShapes: _Optional[_Union[TensorBoundShapes, _Mapping]] = ..., requestOnlyEmbeddings: _Optional[_Iterable[str]] = ..., aotConfig: _Optional[_Union[AOTConfig, _Mapping]] = ...) -> None: ...
