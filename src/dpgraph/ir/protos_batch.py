"""Batched decoding of ``TensorProtos`` records: output i stacks ``protos[i]`` of each record.

Records of one DB nearly always share a byte layout: the same dims and data types, so the
same structure bytes with the element payloads at the same offsets.  Such records are
decoded as a ``[count, length]`` byte matrix with no per-record Python: the structure bytes
are compared column-wise with the first record's, fixed-width payloads are viewed as their
dtype, and varint payloads (int32/int64 labels) are decoded column-wise when every record
splits them into varints at the same places.  Records whose lengths differ (a label of 5
next to one of 500 needs one byte more) are decoded per length group.  Anything else goes
through :func:`~dpgraph.ir.blob_serde.decode_tensor_protos` record by record, which also
names the bad record when one is corrupt.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpgraph.ir.blob_serde import (
    BYTE_HOLDER_TYPES,
    DATA_TYPE_TO_NUMPY,
    TensorProtoError,
    decode_tensor_protos,
    read_varint,
)
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto

# TensorProto fields that hold elements: float_data, double_data (fixed width),
# int32_data, int64_data (varints), raw_data, byte_data (raw little-endian bytes)
_FIXED: dict[int, np.dtype] = {3: np.dtype("<f4"), 9: np.dtype("<f8")}
_VARINT = (4, 10)
_RAW = (13, 5)
_SINGLE_FIELD: dict[int, int] = {DT.FLOAT: 3, DT.DOUBLE: 9, DT.INT64: 10}
_UNSUPPORTED = (6, 11, 15)  # string_data, external_data and the like: record by record


@dataclass(frozen=True)
class _Payload:
    """Where one proto's elements sit in a record, and how to read them."""

    offset: int
    size: int
    dtype: np.dtype  # the output dtype (for raw and fixed payloads also the wire dtype)
    shape: tuple[int, ...]
    varint: bool


@dataclass(frozen=True)
class _Layout:
    payloads: list[_Payload]
    structure: np.ndarray  # the indices of the bytes around the payloads


def _walk(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, Any, int]]:
    """``(field, wire, value_start, value, value_end)`` for the fields in ``data[start:end]``."""
    pos = start
    while pos < end:
        tag, pos = read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, after = read_varint(data, pos)
            yield number, wire, pos, value, after
        elif wire == 2:
            size, body = read_varint(data, pos)
            after = body + size
            yield number, wire, body, None, after
        else:  # fixed-width scalars: leave such records to the general decoder
            raise TensorProtoError("unpacked fixed-width field.")
        pos = after
    if pos != end:
        raise TensorProtoError("field runs past the end of its message.")


def _varint_count(data: bytes, begin: int, end: int) -> int:
    """How many varints ``data[begin:end]`` holds (its bytes without the continuation bit)."""
    block = np.frombuffer(data, np.uint8, end - begin, begin)
    return int(np.count_nonzero(block < 0x80))


def _element_fields(data_type: int) -> tuple[int, ...]:
    """The TensorProto fields that may hold ``data_type``'s elements (raw_data aside)."""
    if data_type in _SINGLE_FIELD:
        return (_SINGLE_FIELD[data_type],)
    if data_type == DT.BYTE:
        return (5,)
    return (5, 4) if data_type in BYTE_HOLDER_TYPES else (4,)


def _payload(data: bytes, start: int, end: int) -> _Payload | None:
    """Where one TensorProto's elements sit, if it has a layout the batch decoder reads."""
    fields = list(_walk(data, start, end))
    if any(n == 1 and w == 2 for n, w, *_ in fields) or \
            any(n in _UNSUPPORTED for n, *_ in fields):
        return None  # packed dims, strings, external data
    dims = [v for n, w, _, v, _ in fields if n == 1]
    types = [v for n, _, _, v, _ in fields if n == 2]
    data_type = types[-1] if types else DT.FLOAT
    holders = [(n, s, e) for n, w, s, _, e in fields
               if w == 2 and (n in _FIXED or n in _VARINT or n in _RAW)]
    dtype = DATA_TYPE_TO_NUMPY.get(data_type)
    if len(holders) != 1 or dtype is None or dtype.kind not in "biuf" or \
            data_type == DT.FLOAT16:
        return None
    number, begin, finish = holders[0]
    if number != 13 and number not in _element_fields(data_type):
        return None  # the per-record decoder says what is wrong with it
    if any(dim >= 1 << 63 for dim in dims) or \
            (number in _VARINT and finish > begin and data[finish - 1] >= 0x80):
        return None  # a negative dim, a truncated varint: the per-record decoder names it
    wire_dtype: np.dtype = dtype if number in _VARINT else \
        _FIXED.get(number, dtype.newbyteorder("<"))
    count = _varint_count(data, begin, finish) if number in _VARINT else \
        (finish - begin) / wire_dtype.itemsize
    if count != math.prod(dims):
        return None
    return _Payload(begin, finish - begin, wire_dtype, tuple(dims), number in _VARINT)


def _record_layout(data: bytes) -> _Layout | None:
    """The payloads of one record and the structure bytes around them."""
    try:
        payloads = []
        for number, wire, begin, _, end in _walk(data, 0, len(data)):
            if number != 1 or wire != 2:
                return None
            payload = _payload(data, begin, end)
            if payload is None:
                return None
            payloads.append(payload)
    except (TensorProtoError, IndexError):
        return None
    gaps, pos = [], 0
    for payload in sorted(payloads, key=lambda p: p.offset):
        gaps.append((pos, payload.offset))
        pos = payload.offset + payload.size
    gaps.append((pos, len(data)))
    return _Layout(payloads, np.concatenate([np.arange(a, b) for a, b in gaps]))


def _decode_varints(block: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """Column-wise varint decoding of ``[rows, bytes]``; None unless every row splits into
    varints at the same byte positions."""
    more = block >= 0x80
    if not more.any():
        return block.astype(dtype)  # one byte per value: the common small labels
    if not (more == more[0]).all() or more[0, -1]:
        return None  # varints split differently, or a truncated last varint
    ends = np.flatnonzero(~more[0])
    starts = np.concatenate(([0], ends[:-1] + 1))
    values = np.zeros((block.shape[0], len(ends)), np.uint64)
    for k, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        for j in range(start, end + 1):
            values[:, k] |= (block[:, j].astype(np.uint64) & 0x7F) << np.uint64(7 * (j - start))
    # negative int32/int64 values are ten-byte two's complement varints
    return values.view(np.int64).astype(dtype)


def _decode_rows(rows: np.ndarray, template: np.ndarray,
                 layout: _Layout) -> list[np.ndarray] | None:
    """The tensors of ``rows`` (``[count, length]`` bytes) laid out as ``template`` (a
    record of ``layout``); None when a row's structure bytes differ from the template's."""
    if not (rows[:, layout.structure] == template[layout.structure]).all():
        return None
    out = []
    for payload in layout.payloads:
        block = rows[:, payload.offset:payload.offset + payload.size]
        if payload.varint:
            values = _decode_varints(block, payload.dtype)
            if values is None or values.shape[1] != math.prod(payload.shape):
                return None
        else:
            values = block.copy().view(payload.dtype)  # a copy even of a single row
            if not payload.dtype.isnative:
                values = values.astype(payload.dtype.newbyteorder("="))
        out.append(values.reshape((rows.shape[0], *payload.shape)))
    return out


class _LayoutCache:
    """The layouts of recently decoded record lengths, each with a record that has it: rows
    whose structure bytes equal that record's share its layout, so a DB's layout is parsed
    once, not once per batch."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._entries: dict[int, tuple[np.ndarray, _Layout]] = {}

    def decode(self, rows: np.ndarray) -> list[np.ndarray] | None:
        cached = self._entries.get(rows.shape[1])
        if cached is not None:
            decoded = _decode_rows(rows, *cached)
            if decoded is not None:
                return decoded
        template = rows[0].copy()
        layout = _record_layout(template.tobytes())
        if layout is None:
            return None
        if len(self._entries) >= self.capacity:
            self._entries.clear()
        self._entries[rows.shape[1]] = (template, layout)
        return _decode_rows(rows, template, layout)


_LAYOUTS = _LayoutCache()


def _group_rows(buffer: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """``[len(starts), length]`` bytes: the records of one length starting at ``starts``."""
    if np.all(np.diff(starts) == length):
        return buffer[starts[0]:starts[0] + len(starts) * length].reshape(len(starts), length)
    return buffer[starts[:, None] + np.arange(length)]


def _stack_joined(joined: Any, lengths: list[int]) -> list[np.ndarray] | None:
    """The fast path over records joined end to end; None when it does not apply."""
    buffer = np.frombuffer(joined, np.uint8)
    if lengths.count(lengths[0]) == len(lengths):
        return _LAYOUTS.decode(buffer.reshape(len(lengths), lengths[0]))
    sizes = np.asarray(lengths, np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    groups = np.unique(sizes)
    out: list[np.ndarray] | None = None
    for length in groups.tolist():
        rows = np.flatnonzero(sizes == length)
        part = _LAYOUTS.decode(_group_rows(buffer, starts[rows], length))
        if part is None:
            return None
        if out is None:
            out = [np.empty((len(sizes), *t.shape[1:]), t.dtype) for t in part]
        if len(part) != len(out) or any(t.shape[1:] != o.shape[1:] or t.dtype != o.dtype
                                        for t, o in zip(part, out)):
            return None  # the per-record decoder reports the mismatch
        for target, values in zip(out, part):
            target[rows] = values
    return out


def _record_where(where: str, row: int, keys: Sequence[bytes] | None) -> str:
    key = f", key {keys[row]!r}" if keys is not None else ""
    return f"{where or 'TensorProtos'}{key} (record {row} of the batch)"


def _stack_slow(values: Sequence[bytes], where: str,
                keys: Sequence[bytes] | None) -> list[np.ndarray]:
    records = [decode_tensor_protos(v, _record_where(where, row, keys))
               for row, v in enumerate(values)]
    count = len(records[0])
    for row, record in enumerate(records):
        if len(record) != count:
            raise TensorProtoError(f"{_record_where(where, row, keys)}: holds {len(record)} "
                                   f"TensorProtos, the first record of the batch {count}.")
    out = []
    for i, sample in enumerate(records[0]):
        batch = np.empty((len(records), *sample.shape), dtype=sample.dtype)
        for row, record in enumerate(records):
            if record[i].shape != sample.shape:
                raise TensorProtoError(
                    f"{_record_where(where, row, keys)}: proto {i} has dims "
                    f"{list(record[i].shape)}, the first record of the batch "
                    f"{list(sample.shape)}; all records must share per-output dims.")
            if record[i].dtype != sample.dtype:
                raise TensorProtoError(
                    f"{_record_where(where, row, keys)}: proto {i} holds {record[i].dtype}, "
                    f"the first record of the batch {sample.dtype}; all records must share "
                    "per-output data types.")
            batch[row] = record[i]
        out.append(batch)
    return out


def decode_joined_tensor_protos(joined: Any, lengths: Sequence[int], where: str = "",
                                keys: Sequence[bytes] | None = None) -> list[np.ndarray]:
    """Stack the tensors of ``TensorProtos`` records given end to end in ``joined`` (record
    j is ``lengths[j]`` bytes): output i is ``[len(lengths)] + dims`` of ``protos[i]``."""
    if not lengths:
        raise TensorProtoError(f"{where or 'TensorProtos'}: no records to decode.")
    stacked = _stack_joined(joined, list(lengths))
    if stacked is not None:
        return stacked
    view, values, pos = memoryview(joined), [], 0
    for length in lengths:
        values.append(bytes(view[pos:pos + length]))
        pos += length
    return _stack_slow(values, where, keys)


def decode_tensor_protos_batch(values: Sequence[Any], where: str = "",
                               keys: Sequence[bytes] | None = None) -> list[np.ndarray]:
    """Stack the tensors of many ``TensorProtos`` records (bytes-like each): output i is
    ``[len(values)] + dims`` of ``protos[i]``."""
    return decode_joined_tensor_protos(b"".join(values), [len(v) for v in values], where,
                                       keys)
