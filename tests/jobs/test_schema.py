"""schema: records, nested names, merging, cloning, value records and record nets."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from dpgraph import core, schema, workspace
from dpgraph.proto import caffe2_pb2


def test_struct_normalizes_types_and_pickles() -> None:
    s = schema.Struct(("field1", np.int32), ("field2", schema.List(schema.Scalar(str))))
    assert s == schema.Struct(("field1", schema.Scalar(dtype=np.int32)),
                              ("field2", schema.List(schema.Scalar(dtype=str))))
    s2 = pickle.loads(pickle.dumps(s))
    assert isinstance(s2.field1, schema.Scalar) and isinstance(s2.field2, schema.List)
    assert getattr(s2, "non_existent", None) is None
    assert s2 == s
    assert s.field_names() == ["field1", "field2:lengths", "field2:values"]
    assert s.field_types()[0] == np.dtype(np.int32)


def test_tuple_indexing_and_iteration() -> None:
    s = schema.Tuple(np.int32, str, np.float32)
    assert s.field_names() == ["field_0", "field_1", "field_2"]
    assert s[2] == schema.Scalar(np.float32)
    assert s[2, 0] == schema.Struct(("field_2", schema.Scalar(np.float32)),
                                    ("field_0", schema.Scalar(np.int32)))
    assert [v for v in s] == [s[0], s[1], s[2]]
    assert schema.RawTuple(2) == schema.Struct(("field_0", schema.Scalar()),
                                               ("field_1", schema.Scalar()))


def test_nested_names_merge_and_conflicts() -> None:
    f_a = schema.Scalar(blob=core.BlobReference("blob1"))
    f_b = schema.Struct(("c", schema.Struct(("d", schema.Scalar(
        blob=core.BlobReference("blob2"))),)),)
    f_x = schema.Struct(("x", schema.Scalar(blob=core.BlobReference("blob3"))),)
    with pytest.raises(TypeError):
        schema.Struct(("a", f_a), ("b", f_b), ("b:c:d", f_x))
    st = schema.Struct(("a", f_a), ("b", f_b), ("e:f", f_x))
    assert st.field_names() == ["a", "b:c:d", "e:f:x"]
    assert st.field_blobs() == ["blob1", "blob2", "blob3"]
    st = schema.Struct(("a:a1", f_a), ("b:b1", f_b), ("a", f_x))
    assert st.field_names() == ["a:a1", "a:x", "b:b1:c:d"]
    with pytest.raises(ValueError):
        schema.Struct(("a", schema.Scalar()), ("a", schema.Scalar()))
    with pytest.raises(TypeError):
        st.a = schema.Scalar()


def test_get_contains_and_list_map_paths() -> None:
    st = schema.Struct(("a", schema.Scalar()),
                       ("b", schema.Struct(("c", schema.Struct(("d", schema.Scalar())),))))
    for bad in ("", "x", "x:y", "b:c:x"):
        with pytest.raises(KeyError):
            st[bad]
    assert isinstance(st["b:c:d"], schema.Scalar)
    assert "b:c" in st and "b:c:d" in st and "b:c:d:x" not in st and "" not in st
    assert st.get("zz", 7) == 7 and len(st) == 2
    lst = schema.List(schema.Scalar(str))
    s = schema.Struct(("f1", schema.Scalar(np.int32)), ("f2", lst))
    assert s["f2:lengths"] == lst.lengths and s["f2:values"] == lst.items
    assert s["f2:lengths"] is not lst.lengths  # containers own clones, as in Caffe2
    m = schema.Map(schema.Scalar(np.int32), schema.Scalar(np.float32))
    s = schema.Struct(("f2", m))
    assert s["f2:values:keys"] == m.keys and s["f2:values:values"] == m.values
    with pytest.raises(KeyError):
        s["f2:keys:nothing"]
    ev = schema.ListWithEvicted(schema.Scalar(np.int32))
    assert ev.field_names() == ["lengths", "values", "_evicted_values"]
    assert ev["_evicted_values"].field_types() == [np.dtype(np.int64)]


def test_add_sub_and_slices() -> None:
    s1 = schema.Struct(("a", schema.Scalar()), ("b", schema.Struct(
        ("c", schema.Scalar()), ("d", schema.Scalar()), ("e", schema.Scalar()))))
    s2 = schema.Struct(("b", schema.Struct(("d", schema.Scalar()), ("e", schema.Scalar()))))
    assert (s1 - s2).field_names() == ["a", "b:c"]
    assert (schema.Struct(("a", schema.Scalar())) + schema.Struct(
        ("z", schema.Scalar()))).field_names() == ["a", "z"]
    with pytest.raises(TypeError):
        s1 + s1
    with pytest.raises(TypeError):
        s1 - schema.Scalar()
    assert s1.b.d.slice() == slice(2, 3)
    assert s1.b.slice() == slice(1, 4)
    assert s1.b.e.id() == 3


def test_metadata_clone_and_blob_lists() -> None:
    s = schema.Struct(
        ("a", schema.Scalar(np.float32)),
        ("b", schema.Scalar(np.int32, metadata=schema.Metadata(categorical_limit=5))),
        ("c", schema.List(schema.Scalar(np.int32,
                                        metadata=schema.Metadata(categorical_limit=6)))))
    s.c.lengths.set_metadata(schema.Metadata(categorical_limit=7))
    sv = schema.from_blob_list(s, [np.array([3.4]), np.array([2]), np.array([3]),
                                   np.array([1, 2, 3])])
    assert sv.b.metadata.categorical_limit == 5
    assert sv.c.value.metadata.categorical_limit == 6
    assert sv.c.lengths.metadata.categorical_limit == 7
    assert sv.a.get().dtype == np.float32 and sv.c.lengths().dtype == np.int32
    with pytest.raises(ValueError):
        schema.Scalar(np.float32, metadata=schema.Metadata(categorical_limit=3))
    with pytest.raises(ValueError):
        schema.Scalar(np.int32, blob="ambiguous")
    with pytest.raises(ValueError):
        schema.from_blob_list(s, [np.array([1.0])])
    inner = schema.Scalar(np.float32, np.zeros((2, 3)))
    assert inner.dtype.shape == (3,)


def test_from_column_list_recovers_lists_and_maps() -> None:
    st = schema.Struct(("a", schema.Scalar()), ("b", schema.List(schema.Scalar())),
                       ("c", schema.Map(schema.Scalar(), schema.Scalar())))
    columns = list(reversed(st.field_names()))
    rec = schema.from_column_list(columns, col_blobs=[core.BlobReference("blob:" + c)
                                                      for c in columns])
    assert rec.has_blobs()
    assert sorted(rec.field_names()) == sorted(st.field_names())
    assert [str(b) for b in rec.field_blobs()] == ["blob:" + n for n in rec.field_names()]
    assert isinstance(rec.b, schema.List)
    assert schema.from_column_list([]) == schema.Struct()


def test_dtype_helpers_and_equal_schemas() -> None:
    assert schema.data_type_for_dtype(np.float32) == caffe2_pb2.TensorProto.FLOAT
    assert schema.data_type_for_dtype(str) == caffe2_pb2.TensorProto.STRING
    with pytest.raises(TypeError):
        schema.data_type_for_dtype(np.complex64)
    assert schema.dtype_for_core_type(caffe2_pb2.TensorProto.INT64) is np.int64
    a = schema.Struct(("x", np.int32))
    b = schema.Struct(("y", np.int32))
    assert not schema.equal_schemas(a, b)
    assert schema.equal_schemas(a, b, check_field_names=False)
    assert schema.is_schema_subset(a, a + b)
    assert schema.from_dtype(np.dtype([("p", np.float32), ("q", np.int64)])).field_names() \
        == ["p", "q"]
    assert schema.as_record([("u", np.int32)]) == schema.Struct(("u", np.int32))


def test_new_feed_fetch_const_and_init_empty_records() -> None:
    net = core.Net("records")
    rec = schema.NewRecord(net, schema.Struct(("x", np.float32),
                                             ("l", schema.List(np.int64))))
    assert [str(b) for b in rec.field_blobs()] == ["x", "l:lengths", "l:values"]
    values = [np.array([1.0, 2.0], np.float32), np.array([2], np.int32),
              np.array([5, 6], np.int64)]
    schema.FeedRecord(rec, values)
    fetched = schema.FetchRecord(rec)
    for got, want in zip(fetched.field_blobs(), values):
        np.testing.assert_array_equal(got, want)
    scalar = schema.NewRecord(net, schema.Scalar(np.int32))
    assert str(scalar()) == "unnamed_scalar"
    const = schema.ConstRecord(net, schema.Struct(("c", schema.Scalar(
        np.int32, np.array([4, 5], np.int32)))))
    empty = schema.InitEmptyRecord(net, schema.Struct(("e", np.float32)))
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(schema.FetchRecord(const).c(), [4, 5])
    assert schema.FetchRecord(empty).e().shape == (0,)
