"""Caffe2's text file reader ops: CreateTextFileReader and TextFileReaderRead.

The file holds one row per line and tab-separated columns.  A reader instance makes
``num_passes`` passes over it; each ``TextFileReaderRead`` returns up to ``batch_size`` rows,
one 1-D output per column (STRING columns as bytes, FLOAT columns as float32), fewer at the
end and none once every pass is done.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, DataInputError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto
_SUPPORTED = {int(DT.STRING): "string", int(DT.FLOAT): "float"}


class TextFileReaderInstance:
    """The rows of a text file, ``num_passes`` times, read under a lock."""

    def __init__(self, filename: str, num_passes: int, field_types: list[int]) -> None:
        self.filename, self.num_passes = filename, num_passes
        self.field_types = field_types
        with open(filename, "rb") as handle:
            lines = handle.read().split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # the newline that ends the last row
        self.rows = lines
        self.position = 0  # rows handed out so far, over all passes
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"TextFileReaderInstance({self.filename!r}, {self.position}/"
                f"{len(self.rows) * self.num_passes} rows read)")

    def take(self, count: int) -> list[tuple[int, bytes]]:
        """Up to ``count`` ``(row number in the file, row bytes)``."""
        with self.lock:
            end = min(self.position + count, len(self.rows) * self.num_passes)
            taken = [(i % len(self.rows), self.rows[i % len(self.rows)])
                     for i in range(self.position, end)]
            self.position = end
        return taken


@register_op("CreateTextFileReader", inputs=0, outputs=1, side_effects=True)
def create_text_file_reader(ctx: OpContext) -> Outputs:
    """A reader of ``filename`` (required) for ``num_passes`` (1) passes; ``field_types``
    lists each column's TensorProto type (STRING or FLOAT)."""
    filename = ctx.str_arg("filename", "")
    if not filename:
        raise ArgumentError(ctx.describe("filename is required."))
    types = [int(t) for t in ctx.ints_arg("field_types", [])]
    unsupported = [t for t in types if t not in _SUPPORTED]
    if not types or unsupported:
        raise ArgumentError(ctx.describe(
            f"field_types must list STRING ({DT.STRING}) or FLOAT ({DT.FLOAT}) column types, "
            f"got {types}."))
    try:
        instance = TextFileReaderInstance(filename, ctx.int_arg("num_passes", 1), types)
    except OSError as error:
        raise DataInputError(ctx.describe(f"cannot read {filename!r}: {error}")) from None
    return (instance,)


def _column(values: list[bytes], data_type: int) -> np.ndarray:
    if data_type == DT.STRING:
        return np.array(values, dtype=object).reshape(len(values))
    return np.array([float(v) if v.strip() else 0.0 for v in values], dtype=np.float32)


@register_op("TextFileReaderRead", inputs=1, outputs=(1, None), side_effects=True)
def text_file_reader_read(ctx: OpContext) -> Outputs:
    """Up to ``batch_size`` (1) rows, one output per column."""
    reader = ctx.object_input(0, TextFileReaderInstance, "reader", "CreateTextFileReader")
    if ctx.num_outputs != len(reader.field_types):
        raise ctx.fail(f"Invalid number of outputs. Expected {len(reader.field_types)}, got "
                       f"{ctx.num_outputs}.")
    columns: list[list[bytes]] = [[] for _ in reader.field_types]
    for row_number, row in reader.take(ctx.int_arg("batch_size", 1)):
        fields = row.split(b"\t")
        if len(fields) != len(columns):
            raise DataInputError(ctx.describe(
                f"{reader.filename}: Invalid number of columns at row {row_number + 1}: "
                f"{len(fields)}, expected {len(columns)}."))
        for column, value in zip(columns, fields):
            column.append(value)
    try:
        return tuple(_column(c, t) for c, t in zip(columns, reader.field_types))
    except ValueError as error:
        raise DataInputError(ctx.describe(f"{reader.filename}: {error}")) from None


def _no_gradient(g: Any) -> None:
    """Caffe2's ``NO_GRADIENT``."""


for _op_type in ("CreateTextFileReader", "TextFileReaderRead"):
    register_gradient(_op_type)(_no_gradient)

__all__ = ["TextFileReaderInstance"]
