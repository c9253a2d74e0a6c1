"""Memory estimates and assignment checks of Caffe2's memonger: ``estimate_memory_usage``
(bytes allocated in total, at the high-water mark and per op type, from inferred shapes and
types), ``is_compatible`` and ``verify_assignments``."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from dpgraph.errors import MemongerError
from dpgraph.ir.proto_io import proto_of
from dpgraph.memory.assign import Assignment, LiveRange, RangeItem
from dpgraph.proto import caffe2_pb2

log = logging.getLogger("dpgraph.memonger")

_T = caffe2_pb2.TensorProto
_SIZEOF = {_T.DOUBLE: 8, _T.FLOAT: 4, _T.FLOAT16: 2, _T.INT32: 4, _T.INT8: 1, _T.UINT8: 1,
           _T.UINT16: 2, _T.INT16: 2, _T.BOOL: 1, _T.INT64: 8}
_RELEASING = ("Free", "Alias")


def _num_bytes(blob: str, shapes: Mapping[str, Any], types: Mapping[str, Any]) -> int:
    if blob not in shapes or blob not in types:
        log.warning("Unknown blob encountered: %s", blob)
        return 0
    return _SIZEOF.get(types[blob], 0) * int(np.prod(shapes[blob], dtype=np.int64))


def estimate_memory_usage(protos: Iterable[Any], shapes: Mapping[str, Any],
                          types: Mapping[str, Any], devicescope: caffe2_pb2.DeviceOption
                          ) -> tuple[int, int, dict[str, int]]:
    """``(total bytes allocated, high-water bytes, {op type: bytes allocated})`` of the ops
    on ``devicescope`` (plus Free / Alias, which release their outputs), in net order.

    ``shapes``/``types`` come from ``workspace.InferShapesAndTypes``; blobs they lack count
    as 0 bytes (with a warning).
    """
    by_op: defaultdict[str, int] = defaultdict(int)
    current = highwater = total = 0
    allocated: set[str] = set()
    for proto in protos:
        for op in proto_of(proto).op:
            if op.type in _RELEASING:
                for b in op.output:
                    if b in allocated:
                        current -= _num_bytes(b, shapes, types)
                        allocated.discard(b)
                continue
            if op.device_option != devicescope:
                continue
            for b in op.output:
                if b in allocated:
                    continue
                nbytes = _num_bytes(b, shapes, types)
                total += nbytes
                current += nbytes
                highwater = max(highwater, current)
                allocated.add(b)
                by_op[op.type] += nbytes
    return total, highwater, by_op


def is_compatible(candidate_range: LiveRange, assignment: Assignment,
                  static_blobs: Iterable[str]) -> bool:
    """True if a blob living ``candidate_range`` may join ``assignment``: it is defined
    after the assignment's last member was last used, and that member is not static."""
    name, last = assignment[-1]
    if name in set(static_blobs):
        return False
    if candidate_range.defined is None or last.used is None:
        return False
    return candidate_range.defined > last.used


def verify_assignments(assignments: Iterable[Assignment]) -> None:
    """Raise :class:`MemongerError` if two blobs of one assignment are live together."""
    for assignment in assignments:
        ordered: list[RangeItem] = sorted(
            assignment, key=lambda item: -1 if item[1].defined is None else item[1].defined)
        for (a, ra), (b, rb) in zip(ordered, ordered[1:]):
            if ra.used is None or rb.defined is None or rb.defined <= ra.used:
                raise MemongerError(f"blobs {a} {ra} and {b} {rb} share a buffer but their "
                                    "live ranges overlap")


__all__ = ["estimate_memory_usage", "is_compatible", "verify_assignments"]
