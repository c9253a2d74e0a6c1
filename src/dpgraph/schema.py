"""Caffe2's ``schema``: records of blobs (Struct, Scalar, List, Map, ...)."""

from dpgraph.jobs.records import (
    ConstRecord,
    FeedRecord,
    FetchRecord,
    InitEmptyRecord,
    NewRecord,
)
from dpgraph.jobs.schema import (
    FIELD_SEPARATOR,
    FeatureSpec,
    Field,
    List,
    ListWithEvicted,
    Map,
    MapWithEvicted,
    Metadata,
    NamedTuple,
    RawTuple,
    Scalar,
    Struct,
    Tuple,
    as_record,
    attach_metadata_to_scalars,
    data_type_for_dtype,
    dtype_for_core_type,
    equal_schemas,
    from_blob_list,
    from_column_list,
    from_dtype,
    is_schema_subset,
    schema_check,
)

__all__ = [
    "FIELD_SEPARATOR", "ConstRecord", "FeatureSpec", "FeedRecord", "FetchRecord", "Field",
    "InitEmptyRecord", "List", "ListWithEvicted", "Map", "MapWithEvicted", "Metadata",
    "NamedTuple", "NewRecord", "RawTuple", "Scalar", "Struct", "Tuple", "as_record",
    "attach_metadata_to_scalars", "data_type_for_dtype", "dtype_for_core_type",
    "equal_schemas", "from_blob_list", "from_column_list", "from_dtype", "is_schema_subset",
    "schema_check",
]
