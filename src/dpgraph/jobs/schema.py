"""Caffe2's ``schema``: typed, nested records of blobs (Struct, Scalar, List, Map, ...).

A record describes columns: each leaf is a :class:`Scalar` with a numpy dtype, optional
metadata and optionally a blob (a BlobReference, or a numpy array for a value record).
Nested field names are joined with ``':'`` (``'a:b'``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, namedtuple
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

from dpgraph.errors import ModelConfigError
from dpgraph.ir.blob import BlobReference
from dpgraph.proto import caffe2_pb2

logger = logging.getLogger("dpgraph.schema")

FIELD_SEPARATOR = ":"


def _join_field_name(prefix: str, suffix: str) -> str:
    if prefix and suffix:
        return prefix + FIELD_SEPARATOR + suffix
    return prefix or suffix


def _normalize_field(field_or_type_or_blob: Any, keep_blobs: bool = True) -> Field:
    """A Field for a container: a clone of a Field (containers own their children, as in
    Caffe2), a Scalar of a type/dtype, or a Scalar holding a blob."""
    if isinstance(field_or_type_or_blob, Field):
        return field_or_type_or_blob.clone(keep_blobs=keep_blobs)
    if isinstance(field_or_type_or_blob, (type, np.dtype)):
        return Scalar(dtype=field_or_type_or_blob)
    return Scalar(blob=field_or_type_or_blob)


FeatureSpec = namedtuple("FeatureSpec", [
    "feature_type", "feature_names", "feature_ids", "feature_is_request_only",
    "desired_hash_size", "feature_to_index"])
FeatureSpec.__new__.__defaults__ = (None,) * 6


class Metadata(namedtuple("Metadata", ["categorical_limit", "expected_value",
                                       "feature_specs"])):
    """Per-scalar metadata: ``categorical_limit`` (ints only), ``expected_value`` and
    ``feature_specs``."""

    __slots__ = ()


Metadata.__new__.__defaults__ = (None, None, None)


class Field:
    """The base of every record type."""

    def __init__(self, children: Sequence[Field]) -> None:
        self._parent: tuple[Field | None, int] = (None, 0)
        self._field_offsets = [0]
        for child in children:
            self._field_offsets.append(self._field_offsets[-1] + len(child.field_names()))

    def clone_schema(self) -> Field:
        return self.clone(keep_blobs=False)

    def field_names(self) -> list[str]:
        raise NotImplementedError  # abstract: every concrete Field defines it

    def field_types(self) -> list[np.dtype]:
        raise NotImplementedError

    def field_metadata(self) -> list[Any]:
        raise NotImplementedError

    def field_blobs(self) -> list[Any]:
        raise NotImplementedError

    def all_scalars(self) -> list[Scalar]:
        raise NotImplementedError

    def has_blobs(self) -> bool:
        raise NotImplementedError

    def clone(self, keep_blobs: bool = True) -> Field:
        raise NotImplementedError

    def _set_parent(self, parent: Field, relative_id: int) -> None:
        self._parent = (parent, relative_id)

    def slice(self) -> slice:
        """The range of this field's columns within its root record."""
        base_id = self._child_base_id()
        return slice(base_id, base_id + len(self.field_names()))

    def _child_base_id(self, child_index: int | None = None) -> int:
        """The column of this field (or of its child) within the root record."""
        parent, index = self._parent
        pos = 0 if child_index is None else self._field_offsets[child_index]
        if parent is not None:
            pos += parent._child_base_id(index)
        return pos

    def __eq__(self, other: object) -> bool:
        """Same names, types and metadata (blobs are not compared)."""
        if not isinstance(other, Field):
            return False
        return (self.field_names() == other.field_names()
                and self.field_types() == other.field_types()
                and self.field_metadata() == other.field_metadata())

    __hash__ = None  # type: ignore[assignment]

    def _pprint_impl(self, indent: int, lines: list[str]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        lines: list[str] = []
        self._pprint_impl(0, lines)
        return "\n".join(lines)


class List(Field):
    """A variable-length list per row: ``lengths`` (int32) and the flattened ``values``."""

    def __init__(self, values: Any, lengths_blob: Any = None) -> None:
        if isinstance(lengths_blob, Field):
            if not isinstance(lengths_blob, Scalar):
                raise TypeError("List lengths must be a Scalar")
            self.lengths = _normalize_field(lengths_blob)
        else:
            self.lengths = Scalar(np.int32, lengths_blob)
        self._items = _normalize_field(values)
        self.lengths._set_parent(self, 0)
        self._items._set_parent(self, 1)
        super().__init__([self.lengths, self._items])

    def field_names(self) -> list[str]:
        value_fields = self._items.field_names()
        return ["lengths"] + [_join_field_name("values", v) for v in value_fields]

    def field_types(self) -> list[np.dtype]:
        return self.lengths.field_types() + self._items.field_types()

    def field_metadata(self) -> list[Any]:
        return self.lengths.field_metadata() + self._items.field_metadata()

    def field_blobs(self) -> list[Any]:
        return self.lengths.field_blobs() + self._items.field_blobs()

    def all_scalars(self) -> list[Scalar]:
        return self.lengths.all_scalars() + self._items.all_scalars()

    def has_blobs(self) -> bool:
        return self.lengths.has_blobs() and self._items.has_blobs()

    def clone(self, keep_blobs: bool = True) -> List:
        return type(self)(_normalize_field(self._items, keep_blobs),
                          _normalize_field(self.lengths, keep_blobs))

    def _pprint_impl(self, indent: int, lines: list[str]) -> None:
        lines.append("  " * indent + "List(")
        lines.append("  " * (indent + 1) + "lengths=")
        self.lengths._pprint_impl(indent + 2, lines)
        lines.append("  " * (indent + 1) + "_items=")
        self._items._pprint_impl(indent + 2, lines)
        lines.append("  " * indent + ")")

    def __getattr__(self, item: str) -> Any:
        """Fields of a Struct value are reachable directly; ``value``/``items`` give it."""
        if item.startswith("__") or item in ("_items", "lengths"):
            raise AttributeError(item)
        items = self.__dict__.get("_items")
        if isinstance(items, Struct):
            return getattr(items, item)
        if item in ("value", "items"):
            return items
        raise AttributeError(f"Field not found in list: {item}.")

    def __getitem__(self, item: str) -> Field:
        names = item.split(FIELD_SEPARATOR, 1)
        if len(names) == 1:
            if item == "lengths":
                return self.lengths
            if item == "values":
                return self._items
        elif names[0] == "values":
            items: Any = self._items
            return items[names[1]]
        raise KeyError(f"Field not found in list: {item}.")


class ListWithEvicted(List):
    """A List that also carries ``_evicted_values`` (an int64 Scalar)."""

    def __init__(self, values: Any, lengths_blob: Any = None,
                 evicted_values: Any = None) -> None:
        if isinstance(evicted_values, Field):
            if not isinstance(evicted_values, Scalar):
                raise TypeError("ListWithEvicted evicted_values must be a Scalar")
            self._evicted_values = _normalize_field(evicted_values)
        else:
            self._evicted_values = Scalar(np.int64, evicted_values)
        super().__init__(values, lengths_blob=lengths_blob)

    def field_names(self) -> list[str]:
        return super().field_names() + ["_evicted_values"]

    def field_types(self) -> list[np.dtype]:
        return super().field_types() + self._evicted_values.field_types()

    def field_metadata(self) -> list[Any]:
        return super().field_metadata() + self._evicted_values.field_metadata()

    def field_blobs(self) -> list[Any]:
        return super().field_blobs() + self._evicted_values.field_blobs()

    def all_scalars(self) -> list[Scalar]:
        return super().all_scalars() + self._evicted_values.all_scalars()

    def has_blobs(self) -> bool:
        return super().has_blobs() and self._evicted_values.has_blobs()

    def clone(self, keep_blobs: bool = True) -> ListWithEvicted:
        return type(self)(_normalize_field(self._items, keep_blobs),
                          _normalize_field(self.lengths, keep_blobs),
                          _normalize_field(self._evicted_values, keep_blobs))

    def __getattr__(self, item: str) -> Any:
        if item == "_evicted_values":
            raise AttributeError(item)
        return super().__getattr__(item)

    def __getitem__(self, item: str) -> Field:
        if item == "_evicted_values":
            return self._evicted_values
        return super().__getitem__(item)


class Struct(Field):
    """Named fields in order; nested names ``'a:b'`` build sub-Structs.  Frozen after
    construction: assigning a public attribute raises TypeError."""

    def __init__(self, *fields: tuple[str, Any]) -> None:
        for pair in fields:
            if len(pair) != 2 or not pair[0]:
                raise ModelConfigError(f"Struct fields are (name, field) pairs with non-empty "
                                       f"names, got {pair!r}")
            if pair[0] == "lengths":
                raise ModelConfigError("Struct cannot contain a field named `lengths`.")
        normalized = [(name, _normalize_field(field)) for name, field in fields]
        self.__dict__["fields"] = OrderedDict()
        for name, field in normalized:
            if FIELD_SEPARATOR in name:
                name, field = self._struct_from_nested_name(name, field)
            if name not in self.fields:
                self.fields[name] = field
                continue
            if not isinstance(field, Struct) or not isinstance(self.fields[name], Struct):
                raise ValueError(f"Duplicate field name: {name}")
            self.fields[name] = self.fields[name] + field
        for field_id, (_, field) in enumerate(self.fields.items()):
            field._set_parent(self, field_id)
        super().__init__(list(self.fields.values()))
        self.__dict__["_frozen"] = True

    def _struct_from_nested_name(self, nested_name: str, field: Field) -> tuple[str, Field]:
        def create_internal(names: list[str], field: Field) -> Field:
            if not names:
                return field
            return Struct((names[0], create_internal(names[1:], field)))

        names = nested_name.split(FIELD_SEPARATOR)
        return names[0], create_internal(names[1:], field)

    def get_children(self) -> list[tuple[str, Field]]:
        return list(self.fields.items())

    def field_names(self) -> list[str]:
        names: list[str] = []
        for name, field in self.fields.items():
            names += [_join_field_name(name, f) for f in field.field_names()]
        return names

    def field_types(self) -> list[np.dtype]:
        return [t for field in self.fields.values() for t in field.field_types()]

    def field_metadata(self) -> list[Any]:
        return [m for field in self.fields.values() for m in field.field_metadata()]

    def field_blobs(self) -> list[Any]:
        return [b for field in self.fields.values() for b in field.field_blobs()]

    def all_scalars(self) -> list[Scalar]:
        return [s for field in self.fields.values() for s in field.all_scalars()]

    def has_blobs(self) -> bool:
        return all(field.has_blobs() for field in self.fields.values())

    def clone(self, keep_blobs: bool = True) -> Struct:
        return type(self)(*[(name, _normalize_field(field, keep_blobs))
                            for name, field in self.fields.items()])

    def _get_field_by_nested_name(self, nested_name: str) -> Field | None:
        names = nested_name.split(FIELD_SEPARATOR, 1)
        field = self.fields.get(names[0], None)
        if field is None:
            return None
        if len(names) == 1:
            return field
        try:
            return field[names[1]]
        except (KeyError, TypeError):
            return None

    def _pprint_impl(self, indent: int, lines: list[str]) -> None:
        lines.append("  " * indent + "Struct( ")
        for name, field in self.fields.items():
            lines.append("  " * (indent + 1) + f"{name}=")
            field._pprint_impl(indent + 2, lines)
        lines.append("  " * indent + ") ")

    def __contains__(self, item: str) -> bool:
        return self._get_field_by_nested_name(item) is not None

    def __len__(self) -> int:
        return len(self.fields)

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields.values())

    def __getitem__(self, item: Any) -> Any:
        """A field by nested name (``'a:b'``), by index, or a sub-Struct for a list or
        tuple of names/indices."""
        if isinstance(item, (list, tuple)):
            keys = list(self.fields.keys())
            return Struct(*[(keys[k] if isinstance(k, int) else k, self[k]) for k in item])
        if isinstance(item, int):
            return next(islice(self.fields.values(), item, None))
        field = self._get_field_by_nested_name(item)
        if field is None:
            raise KeyError(f'field "{item}" not found')
        return field

    def get(self, item: str, default_value: Any = None) -> Any:
        """The field ``item`` (nested names allowed), or ``default_value``."""
        field = self._get_field_by_nested_name(item)
        return default_value if field is None else field

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        try:
            return self.__dict__["fields"][item]
        except KeyError:
            raise AttributeError(item) from None

    def __setattr__(self, key: str, value: Any) -> None:
        if self.__dict__.get("_frozen") and not key.startswith("_"):
            raise TypeError("Struct.__setattr__() can't be called after __init__(): "
                            "records are immutable; build a new Struct instead.")
        super().__setattr__(key, value)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __add__(self, other: Any) -> Any:
        """Merge the fields of two Structs, recursively for common Struct fields."""
        if not isinstance(other, Struct):
            return NotImplemented
        children = OrderedDict(self.get_children())
        for name, right in other.get_children():
            if name not in children:
                children[name] = right
                continue
            left = children[name]
            if not (isinstance(left, Struct) and isinstance(right, Struct)):
                raise TypeError(f"Type of left_field, {type(left)}, and type of right_field, "
                                f"{type(right)}, must both be Struct to allow merging of the "
                                f"field, {name}")
            children[name] = left + right
        return Struct(*children.items())

    def __sub__(self, other: Any) -> Any:
        """Remove ``other``'s fields from this Struct, recursively for Struct fields."""
        if not isinstance(other, Struct):
            return NotImplemented
        children = OrderedDict(self.get_children())
        for name, right in other.get_children():
            left = children.get(name)
            if left is None:
                continue
            if isinstance(left, Struct) and isinstance(right, Struct):
                remaining = left - right
                if remaining.get_children():
                    children[name] = remaining
                else:
                    del children[name]
            else:
                del children[name]
        return Struct(*children.items())


class Scalar(Field):
    """One column: a numpy dtype (possibly with an inner shape), optional metadata and an
    optional blob (a BlobReference, or array data for a value record)."""

    def __init__(self, dtype: Any = None, blob: Any = None, metadata: Any = None) -> None:
        self._metadata: Any = None
        self.dtype: np.dtype = np.dtype(np.void)
        self._original_dtype: Any = None
        self.set(dtype, blob, metadata, unsafe=True)
        super().__init__([])

    def field_names(self) -> list[str]:
        return [""]

    def field_type(self) -> np.dtype:
        return self.dtype

    def field_types(self) -> list[np.dtype]:
        return [self.dtype]

    def field_metadata(self) -> list[Any]:
        return [self._metadata]

    def has_blobs(self) -> bool:
        return self._blob is not None

    def field_blobs(self) -> list[Any]:
        if self._blob is None:
            raise AssertionError("Value is not set for this field.")
        return [self._blob]

    def all_scalars(self) -> list[Scalar]:
        return [self]

    def clone(self, keep_blobs: bool = True) -> Scalar:
        return Scalar(dtype=self._original_dtype, blob=self._blob if keep_blobs else None,
                      metadata=self._metadata)

    def get(self) -> Any:
        """The blob (or value) of this scalar."""
        if self._blob is None:
            raise AssertionError("Value is not set for this field.")
        return self._blob

    def __call__(self) -> Any:
        return self.get()

    @property
    def metadata(self) -> Any:
        return self._metadata

    def set_metadata(self, value: Any) -> None:
        if not isinstance(value, Metadata):
            raise TypeError(f"metadata must be a schema.Metadata, got {type(value).__name__}")
        self._validate_metadata(value)
        self._metadata = value

    def _validate_metadata(self, metadata: Any) -> None:
        if metadata is None:
            return
        if metadata.categorical_limit is not None and self.dtype is not None:
            if not np.issubdtype(self.dtype, np.integer):
                raise ValueError(f"Metadata categorical_limit can only be set on integral "
                                 f"fields, not {self.dtype}.")

    def set_value(self, blob: Any, throw_on_type_mismatch: bool = False,
                  unsafe: bool = False) -> None:
        """Set the blob, keeping the dtype (a value of another dtype warns or raises)."""
        if self.dtype.base != np.void and throw_on_type_mismatch:
            if not isinstance(blob, np.ndarray) or blob.dtype.base != self.dtype.base:
                raise TypeError(f"Expected {self.dtype.base}, got "
                                f"{getattr(blob, 'dtype', type(blob))}.")
        self.set(dtype=self._original_dtype, blob=blob, unsafe=unsafe)

    def set(self, dtype: Any = None, blob: Any = None, metadata: Any = None,
            unsafe: bool = False) -> None:
        """Set dtype, blob and metadata at once (warns unless ``unsafe``, since it
        changes a schema others may share)."""
        if not unsafe:
            logger.warning("Scalar should be considered immutable. Only call Scalar.set() "
                           "on newly created Scalar with unsafe=True. This will become an "
                           "error soon.")
        if blob is not None and isinstance(blob, str):
            raise ValueError("Passing str blob to Scalar.set() is ambiguous. Do either "
                             "set(blob=np.array(...)) or set(blob=BlobReference(...))")
        self._original_dtype = dtype
        if dtype is not None and isinstance(dtype, tuple) and dtype[1] == 1:
            dtype = (dtype[0], (1,))
        if dtype is not None:
            if isinstance(dtype, tuple) and dtype[0] == np.void:
                raise TypeError(f"Cannot set the Scalar with type {dtype} for blob {blob}. "
                                "If this Scalar is not a value but a placeholder, leave the "
                                "dtype unset.")
            dtype = np.dtype(dtype)
        if blob is not None and not isinstance(blob, BlobReference):
            blob = self._as_value(blob, dtype)
            if blob.ndim > 1 and dtype is not None and dtype.base != np.void:
                dtype = np.dtype((dtype.base, blob.shape[1:]))
        if metadata is not None:
            self._validate_metadata_for(metadata, dtype)
            self._metadata = metadata
        self.dtype = np.dtype(np.void) if dtype is None else dtype
        self._blob = blob

    @staticmethod
    def _as_value(blob: Any, dtype: np.dtype | None) -> np.ndarray:
        """Array data for a value record: converted to the dtype's base type; a scalar or
        an empty non-array becomes 1-D (or (0,) + inner shape)."""
        preserve_shape = isinstance(blob, np.ndarray)
        if dtype is not None and dtype != np.void:
            blob = np.array(blob, dtype=dtype.base)
            if blob.size == 0 and not preserve_shape:
                blob = blob.reshape((0,) + dtype.shape)
        else:
            blob = np.asarray(blob)
        if blob.ndim == 0 and not preserve_shape:
            blob = blob.reshape((1,))
        return blob

    def _validate_metadata_for(self, metadata: Any, dtype: Any) -> None:
        limit = getattr(metadata, "categorical_limit", None)
        if limit is not None and dtype is not None and not np.issubdtype(
                np.dtype(dtype).base, np.integer):
            raise ValueError(f"Metadata categorical_limit can only be set on integral "
                             f"fields, not {dtype}.")

    def set_type(self, dtype: Any) -> None:
        self._original_dtype = dtype
        self.dtype = np.dtype(dtype) if dtype is not None else np.dtype(np.void)
        self._validate_metadata(self._metadata)

    def id(self) -> int:
        """The column index of this scalar within its root record."""
        return self.slice().start

    def _pprint_impl(self, indent: int, lines: list[str]) -> None:
        lines.append("  " * indent + f"Scalar({self.dtype!r}, {self._blob!r}, "
                     f"{self._metadata!r})")


def Map(keys: Any, values: Any, keys_name: str = "keys", values_name: str = "values",
        lengths_blob: Any = None) -> List:
    """A List of ``Struct((keys_name, keys), (values_name, values))``."""
    return List(Struct((keys_name, keys), (values_name, values)), lengths_blob=lengths_blob)


def MapWithEvicted(keys: Any, values: Any, keys_name: str = "keys",
                   values_name: str = "values", lengths_blob: Any = None,
                   evicted_values: Any = None) -> ListWithEvicted:
    return ListWithEvicted(Struct((keys_name, keys), (values_name, values)),
                           lengths_blob=lengths_blob, evicted_values=evicted_values)


def NamedTuple(name_prefix: str, *fields: Any) -> Struct:
    return Struct(*[(f"{name_prefix}_{i}", field) for i, field in enumerate(fields)])


def Tuple(*fields: Any) -> Struct:
    """A Struct with fields ``field_0``, ``field_1``, ..."""
    return NamedTuple("field", *fields)


def RawTuple(num_fields: int, name_prefix: str = "field") -> Struct:
    """A Struct of ``num_fields`` untyped scalars."""
    if not isinstance(num_fields, int) or num_fields < 0:
        raise ValueError(f"num_fields must be a non-negative int, got {num_fields!r}")
    return NamedTuple(name_prefix, *([np.void] * num_fields))


def from_dtype(dtype: Any, _outer_shape: tuple[int, ...] = ()) -> Field:
    """A record from a (possibly structured) numpy dtype."""
    dtype = np.dtype(dtype)
    if dtype.names is None:
        shape = _outer_shape + dtype.shape
        return Scalar((dtype.base, shape) if shape else dtype.base)
    struct_fields = []
    for name, (fdtype, _offset) in dtype.fields.items():
        struct_fields.append((name, from_dtype(fdtype, _outer_shape + dtype.shape)))
    return Struct(*struct_fields)


class _SchemaNode:
    """A node of the tree from_column_list builds from column names."""

    def __init__(self, name: str, type_str: str = "") -> None:
        self.name = name
        self.children: list[_SchemaNode] = []
        self.type_str = type_str
        self.field: Field | None = None

    def add_child(self, name: str, type_str: str = "") -> _SchemaNode:
        for child in self.children:
            if child.name == name and child.type_str == type_str:
                return child
        child = _SchemaNode(name, type_str)
        self.children.append(child)
        return child

    def get_field(self) -> Field:
        if not self.children or self.field is not None:
            return Struct() if self.field is None else self.field
        by_name = {child.name: child for child in self.children}
        if set(by_name) == {"lengths", "values"}:
            self.field = List(by_name["values"].get_field(),
                              lengths_blob=by_name["lengths"].get_field())
        elif set(by_name) == {"lengths", "keys", "values"}:
            self.field = Map(by_name["keys"].get_field(), by_name["values"].get_field(),
                             lengths_blob=by_name["lengths"].get_field())
        else:
            self.field = Struct(*[(c.name, c.get_field()) for c in self.children])
        return self.field


def from_column_list(col_names: Sequence[str], col_types: Sequence[Any] | None = None,
                     col_blobs: Sequence[Any] | None = None,
                     col_metadata: Sequence[Any] | None = None) -> Field:
    """A record from flat column names (``'a:lengths'``, ``'a:values'`` make a List)."""
    n = len(col_names)
    col_types = [None] * n if col_types is None else col_types
    col_metadata = [None] * n if col_metadata is None else col_metadata
    col_blobs = [None] * n if col_blobs is None else col_blobs
    if not (len(col_types) == len(col_blobs) == len(col_metadata) == n):
        raise ValueError(f"from_column_list: {n} names, {len(col_types)} types, "
                         f"{len(col_blobs)} blobs and {len(col_metadata)} metadata differ "
                         "in length.")
    root = _SchemaNode("root", "Struct")
    for name, ctype, blob, meta in zip(col_names, col_types, col_blobs, col_metadata):
        parts = name.split(FIELD_SEPARATOR)
        current = root
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            current = current.add_child(part, ctype if last else "")
            if last:
                current.field = Scalar(dtype=ctype, blob=blob, metadata=meta)
    return root.get_field()


def from_blob_list(schema: Field, values: Any, throw_on_type_mismatch: bool = False) -> Field:
    """A copy of ``schema`` whose scalars hold ``values`` (one per column, in order)."""
    if isinstance(values, BlobReference):
        values = [values]
    record = schema.clone_schema()
    scalars = record.all_scalars()
    if len(scalars) != len(values):
        raise ValueError(f"Values must have {len(scalars)} elements, got {len(values)}.")
    for scalar, value in zip(scalars, values):
        scalar.set_value(value, throw_on_type_mismatch, unsafe=True)
    return record


def as_record(value: Any) -> Field:
    """A Field from a Field, a list of (name, value) pairs, a tuple, a dict or a value."""
    if isinstance(value, Field):
        return value
    if isinstance(value, list) or isinstance(value, tuple):
        is_field_list = all(isinstance(f, tuple) and len(f) == 2 and isinstance(f[0], str)
                            for f in value)
        if is_field_list:
            return Struct(*[(k, as_record(v)) for k, v in value])
        return Tuple(*[as_record(f) for f in value])
    if isinstance(value, dict):
        return Struct(*[(k, as_record(v)) for k, v in value.items()])
    return _normalize_field(value)


_DATA_TYPE_FOR_DTYPE = [
    (np.str_, caffe2_pb2.TensorProto.STRING),
    (np.object_, caffe2_pb2.TensorProto.STRING),
    (np.float16, caffe2_pb2.TensorProto.FLOAT16),
    (np.float32, caffe2_pb2.TensorProto.FLOAT),
    (np.float64, caffe2_pb2.TensorProto.DOUBLE),
    (np.bool_, caffe2_pb2.TensorProto.BOOL),
    (np.int8, caffe2_pb2.TensorProto.INT8),
    (np.int16, caffe2_pb2.TensorProto.INT16),
    (np.int32, caffe2_pb2.TensorProto.INT32),
    (np.int64, caffe2_pb2.TensorProto.INT64),
    (np.uint8, caffe2_pb2.TensorProto.UINT8),
    (np.uint16, caffe2_pb2.TensorProto.UINT16),
]


def is_schema_subset(schema: Field, original_schema: Field) -> bool:
    """True if every column of ``schema`` is a column of ``original_schema``."""
    return set(schema.field_names()).issubset(set(original_schema.field_names()))


def equal_schemas(schema: Field, original_schema: Field, check_field_names: bool = True,
                  check_field_types: bool = True, check_field_metas: bool = False) -> bool:
    """Compare two records on names, types and (optionally) metadata."""
    assert isinstance(schema, Field)
    assert isinstance(original_schema, Field)
    if check_field_names and schema.field_names() != original_schema.field_names():
        return False
    if check_field_types and schema.field_types() != original_schema.field_types():
        return False
    if check_field_metas and schema.field_metadata() != original_schema.field_metadata():
        return False
    return True


def schema_check(schema: Field, previous: Field | None = None) -> Field:
    """``schema`` after checking it equals ``previous`` (when given)."""
    record = as_record(schema)
    if previous is not None and not equal_schemas(schema, previous):
        raise ModelConfigError(f"Schema {record} does not match the previous schema "
                               f"{previous}.")
    return record


def data_type_for_dtype(dtype: Any) -> int:
    """The TensorProto.DataType of a numpy dtype (TypeError if there is none)."""
    base = np.dtype(dtype).base
    for np_type, dt in _DATA_TYPE_FOR_DTYPE:
        if base == np.dtype(np_type):
            return dt
    if base.kind in "US":
        return caffe2_pb2.TensorProto.STRING
    raise TypeError(f"Unknown dtype: {base}")


def dtype_for_core_type(core_type: int) -> Any:
    """The numpy type of a TensorProto.DataType (TypeError if there is none)."""
    for np_type, dt in _DATA_TYPE_FOR_DTYPE:
        if dt == core_type:
            return np_type
    raise TypeError(f"Unknown core type: {core_type}")


def attach_metadata_to_scalars(field: Field, metadata: Any) -> None:
    for scalar in field.all_scalars():
        scalar.set_metadata(metadata)


__all__ = [
    "FIELD_SEPARATOR", "FeatureSpec", "Field", "List", "ListWithEvicted", "Map",
    "MapWithEvicted", "Metadata",
    "NamedTuple", "RawTuple", "Scalar", "Struct", "Tuple", "as_record",
    "attach_metadata_to_scalars", "data_type_for_dtype", "dtype_for_core_type",
    "equal_schemas", "from_blob_list", "from_column_list", "from_dtype", "is_schema_subset",
    "schema_check",
]
