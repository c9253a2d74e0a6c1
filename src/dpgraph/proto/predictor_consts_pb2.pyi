from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PredictorConsts(_message.Message):
    __slots__ = ("META_NET_DEF", "PREDICTOR_DBREADER", "PARAMETERS_BLOB_TYPE", "INPUTS_BLOB_TYPE", "OUTPUTS_BLOB_TYPE", "GLOBAL_INIT_NET_TYPE", "PREDICT_INIT_NET_TYPE", "PREDICT_NET_TYPE", "SINGLE_PREDICTOR", "MULTI_PREDICTOR", "TRAIN_INIT_PLAN_TYPE", "TRAIN_PLAN_TYPE", "SHAPE_INFO_BLOB", "DEFERRED_BLOB_READER")
    META_NET_DEF_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_DBREADER_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_BLOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_BLOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_BLOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_INIT_NET_TYPE_FIELD_NUMBER: _ClassVar[int]
    PREDICT_INIT_NET_TYPE_FIELD_NUMBER: _ClassVar[int]
    PREDICT_NET_TYPE_FIELD_NUMBER: _ClassVar[int]
    SINGLE_PREDICTOR_FIELD_NUMBER: _ClassVar[int]
    MULTI_PREDICTOR_FIELD_NUMBER: _ClassVar[int]
    TRAIN_INIT_PLAN_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_PLAN_TYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_INFO_BLOB_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_BLOB_READER_FIELD_NUMBER: _ClassVar[int]
    META_NET_DEF: str
    PREDICTOR_DBREADER: str
    PARAMETERS_BLOB_TYPE: str
    INPUTS_BLOB_TYPE: str
    OUTPUTS_BLOB_TYPE: str
    GLOBAL_INIT_NET_TYPE: str
    PREDICT_INIT_NET_TYPE: str
    PREDICT_NET_TYPE: str
    SINGLE_PREDICTOR: str
    MULTI_PREDICTOR: str
    TRAIN_INIT_PLAN_TYPE: str
    TRAIN_PLAN_TYPE: str
    SHAPE_INFO_BLOB: str
    DEFERRED_BLOB_READER: str
    def __init__(self, META_NET_DEF: _Optional[str] = ..., PREDICTOR_DBREADER: _Optional[str] = ..., PARAMETERS_BLOB_TYPE: _Optional[str] = ..., INPUTS_BLOB_TYPE: _Optional[str] = ..., OUTPUTS_BLOB_TYPE: _Optional[str] = ..., GLOBAL_INIT_NET_TYPE: _Optional[str] = ..., PREDICT_INIT_NET_TYPE: _Optional[str] = ..., PREDICT_NET_TYPE: _Optional[str] = ..., SINGLE_PREDICTOR: _Optional[str] = ..., MULTI_PREDICTOR: _Optional[str] = ..., TRAIN_INIT_PLAN_TYPE: _Optional[str] = ..., TRAIN_PLAN_TYPE: _Optional[str] = ..., SHAPE_INFO_BLOB: _Optional[str] = ..., DEFERRED_BLOB_READER: _Optional[str] = ...) -> None: ...
