"""Timer ops (Caffe2's stats timers): TimerBegin, TimerEnd, TimerGet, TimerGetAndEnd.

A timer blob holds a :class:`Timer`; ``TimerGet`` reads the nanoseconds elapsed since it
began (int64 scalar). Ending a timer adds its nanoseconds to Caffe2's exported average stat
``<counter_name>/time_ns/sum`` and ``.../count`` in the global stat registry."""

from __future__ import annotations

import time

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient
from dpgraph.ops.stats import GLOBAL_REGISTRY


class Timer:
    """A named stopwatch started when made; ``end`` stops it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.start = time.perf_counter_ns()
        self.stopped: int | None = None

    def elapsed_ns(self) -> int:
        end = self.stopped if self.stopped is not None else time.perf_counter_ns()
        return end - self.start

    def end(self) -> None:
        """Stop the clock and export the time, as Caffe2's CAFFE_AVG_EXPORTED_STAT(time_ns)."""
        self.stopped = time.perf_counter_ns()
        GLOBAL_REGISTRY.increment(f"{self.name}/time_ns/sum".encode(), self.elapsed_ns())
        GLOBAL_REGISTRY.increment(f"{self.name}/time_ns/count".encode(), 1)

    def __repr__(self) -> str:
        return f"Timer({self.name!r}, {self.elapsed_ns()} ns)"


def _timer(ctx: OpContext) -> Timer:
    return ctx.object_input(0, Timer, "timer", "TimerBegin")


@register_op("TimerBegin", inputs=0, outputs=1, side_effects=True)
def timer_begin(ctx: OpContext) -> Outputs:
    """A started timer named ``counter_name`` (default: the output's name)."""
    name = ctx.arg("counter_name", ctx.output_name(0))
    return (Timer(name.decode() if isinstance(name, bytes) else str(name)),)


@register_op("TimerEnd", inputs=1, outputs=0, side_effects=True)
def timer_end(ctx: OpContext) -> Outputs:
    """Stop the timer."""
    _timer(ctx).end()
    return ()


@register_op("TimerGet", inputs=1, outputs=1, side_effects=True)
def timer_get(ctx: OpContext) -> Outputs:
    """Nanoseconds since the timer began (int64 scalar)."""
    return (np.array(_timer(ctx).elapsed_ns(), dtype=np.int64),)


@register_op("TimerGetAndEnd", inputs=1, outputs=1, side_effects=True)
def timer_get_and_end(ctx: OpContext) -> Outputs:
    """Stop the timer and return its nanoseconds (int64 scalar)."""
    timer = _timer(ctx)
    timer.end()
    return (np.array(timer.elapsed_ns(), dtype=np.int64),)


for _type in ("TimerBegin", "TimerEnd", "TimerGet", "TimerGetAndEnd"):
    register_gradient(_type)(no_gradient)
