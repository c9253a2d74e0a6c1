"""Caffe2's stat registry and the ops that feed and read it (stats_ops, stats_put_ops).

A :class:`StatRegistry` maps stat names to int64 counters.  One process-wide registry (not
cleared by ``ResetWorkspace``, as in Caffe2) backs every op that is not given a registry blob.

* ``StatRegistryCreate`` [] -> [registry]: a new, private registry.
* ``StatRegistryUpdate`` [keys, values(, registry)]: add each value to its counter (created
  at 0 when new).
* ``StatRegistryExport`` [(registry)] -> [keys (bytes), values (int64), timestamps (int64 ns)];
  ``reset`` (default 1) zeroes the counters, which stay registered.
* ``AveragePut`` / ``IncrementPut`` / ``StdDevPut`` [value]: put the first element of the
  input, times ``magnitude_expand`` (default 1) as an int64, into the global registry under
  ``<stat_name>/stat_value`` (Increment), ``.../sum`` and ``.../count`` (Average), plus
  ``.../sumoffset`` and ``.../sumsqoffset`` (StdDev).  ``stat_name`` defaults to the input's
  name; ``bound`` clamps to the int64 range (NaN puts 0) instead of failing; an empty input
  puts ``default_value`` (required then).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient

INT64_MAX = 2 ** 63 - 1
INT64_MIN = -(2 ** 63)


def _wrap(value: int) -> int:
    """``value`` wrapped to int64, as Caffe2's atomic counters overflow."""
    return (value - INT64_MIN) % 2 ** 64 + INT64_MIN


class StatRegistry:
    """Named int64 counters, in registration order; thread safe."""

    def __init__(self) -> None:
        self._values: dict[bytes, int] = {}
        self._offsets: dict[bytes, list[int]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StatRegistry({len(self._values)} stats)"

    def increment(self, key: bytes, value: int) -> int:
        with self._lock:
            new = _wrap(self._values.get(key, 0) + int(value))
            self._values[key] = new
            return new

    def update(self, keys: list[bytes], values: list[int]) -> None:
        for key, value in zip(keys, values):
            self.increment(key, value)

    def publish(self, reset: bool) -> list[tuple[bytes, int, int]]:
        """[(key, value, timestamp ns)] of every counter; ``reset`` zeroes them."""
        with self._lock:
            now = time.time_ns()
            out = [(key, value, now) for key, value in self._values.items()]
            if reset:
                self._values = dict.fromkeys(self._values, 0)
            return out

    def stddev_offset(self, key: bytes, value: int) -> int:
        """The offset StdDevPut subtracts; it reproduces Caffe2's compare-exchange on
        (first, expected), both starting at INT64_MIN, of one stat."""
        with self._lock:
            state = self._offsets.setdefault(key, [INT64_MIN, INT64_MIN])
            if state[0] == state[1]:
                state[0] = value
            else:
                state[1] = state[0]
            return state[0]


GLOBAL_REGISTRY = StatRegistry()


def _registry(ctx: OpContext, index: int) -> StatRegistry:
    if ctx.num_inputs > index:
        return ctx.object_input(index, StatRegistry, "stat registry", "StatRegistryCreate")
    return GLOBAL_REGISTRY


def _as_key(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


@register_op("StatRegistryCreate", inputs=0, outputs=1, side_effects=True)
def stat_registry_create(ctx: OpContext) -> Outputs:
    """A new, empty registry."""
    return (StatRegistry(),)


@register_op("StatRegistryUpdate", inputs=(2, 3), outputs=0, side_effects=True)
def stat_registry_update(ctx: OpContext) -> Outputs:
    """Add values[i] to counter keys[i] (global registry unless a third input is given)."""
    keys, values = host(ctx.inputs[0]).reshape(-1), host(ctx.inputs[1]).reshape(-1)
    if keys.size != values.size:
        raise ctx.fail(f"keys has {keys.size} entries but values {values.size}")
    if values.dtype.kind not in "iu":
        raise ctx.fail(f"values must be int64, got {values.dtype}")
    _registry(ctx, 2).update([_as_key(k) for k in keys.tolist()],
                             [int(v) for v in values.tolist()])
    return ()


@register_op("StatRegistryExport", inputs=(0, 1), outputs=3, side_effects=True)
def stat_registry_export(ctx: OpContext) -> Outputs:
    """[(registry)] -> [keys, values, timestamps]; ``reset`` (1) zeroes the counters."""
    data = _registry(ctx, 0).publish(bool(ctx.int_arg("reset", 1)))
    keys = np.empty(len(data), dtype=object)
    keys[:] = [key for key, _, _ in data]
    return (keys, np.array([v for _, v, _ in data], dtype=np.int64),
            np.array([t for _, _, t in data], dtype=np.int64))


def _put_value(ctx: OpContext) -> int:
    """The input's first element times ``magnitude_expand``, as Caffe2's int64."""
    x = host(ctx.inputs[0])
    if x.size:
        value = x.reshape(-1)[0]
    elif ctx.has_arg("default_value"):
        value = x.dtype.type(np.float32(ctx.float_arg("default_value")))
    else:
        raise ArgumentError(ctx.describe(
            f"default_value must be given when the input is empty (stat {_stat_name(ctx)!r})"))
    magnitude = ctx.int_arg("magnitude_expand", 1)
    if magnitude <= 0:
        raise ArgumentError(ctx.describe(f"magnitude_expand must be > 0, got {magnitude}"))
    bound = INT64_MAX // magnitude
    is_nan = bool(value != value)
    if ctx.int_arg("bound", 0):
        if is_nan:
            return 0
        if value <= -bound:
            return INT64_MIN
        if value >= bound:
            return INT64_MAX
    elif is_nan or abs(int(value)) >= bound:
        raise ctx.fail(f"input value {value} is NaN or too large for magnitude_expand "
                       f"{magnitude} (set bound=1 to clamp)")
    if x.dtype.kind in "iub":
        return _wrap(int(value) * magnitude)
    ftype = np.float32 if x.dtype == np.float16 else x.dtype.type
    return _wrap(int(ftype(value) * ftype(magnitude)))


def _stat_name(ctx: OpContext) -> str:
    return ctx.str_arg("stat_name", ctx.input_name(0))


@register_op("IncrementPut", inputs=1, outputs=0, side_effects=True)
def increment_put(ctx: OpContext) -> Outputs:
    """Add the value to ``<stat_name>/stat_value``."""
    GLOBAL_REGISTRY.increment(f"{_stat_name(ctx)}/stat_value".encode(), _put_value(ctx))
    return ()


@register_op("AveragePut", inputs=1, outputs=0, side_effects=True)
def average_put(ctx: OpContext) -> Outputs:
    """Add the value to ``.../sum`` and 1 to ``.../count``."""
    base = f"{_stat_name(ctx)}/stat_value"
    value = _put_value(ctx)
    GLOBAL_REGISTRY.increment(f"{base}/count".encode(), 1)
    GLOBAL_REGISTRY.increment(f"{base}/sum".encode(), value)
    return ()


@register_op("StdDevPut", inputs=1, outputs=0, side_effects=True)
def stddev_put(ctx: OpContext) -> Outputs:
    """Average's counters plus the offset sums ``.../sumoffset`` and ``.../sumsqoffset``
    (values minus the stat's offset, Caffe2's first value)."""
    base = f"{_stat_name(ctx)}/stat_value"
    value = _put_value(ctx)
    shifted = _wrap(value - GLOBAL_REGISTRY.stddev_offset(base.encode(), value))
    GLOBAL_REGISTRY.increment(f"{base}/count".encode(), 1)
    GLOBAL_REGISTRY.increment(f"{base}/sumsqoffset".encode(), _wrap(shifted * shifted))
    GLOBAL_REGISTRY.increment(f"{base}/sumoffset".encode(), shifted)
    GLOBAL_REGISTRY.increment(f"{base}/sum".encode(), value)
    return ()


for _type in ("StatRegistryCreate", "StatRegistryUpdate", "StatRegistryExport",
              "IncrementPut", "AveragePut", "StdDevPut"):
    register_gradient(_type)(no_gradient)
