"""The collective-schedule check: before the first run of a net with cross-rank collectives,
every rank lists the collectives it will issue on each common world (op type, engine, blobs,
shapes, dtypes, reduction and root, in net order: Parallelize chains the collectives of one
world in that order), hashes the list and compares through the rendezvous store::

    rank 0: allreduce_0_cw #3 Allreduce(gpu_0/fc_w_grad, gpu_1/fc_w_grad) [4x8 float32] sum
    rank 1: allreduce_0_cw #3 Allreduce(gpu_0/fc_b_grad, gpu_1/fc_b_grad) [8 float32] sum
    -> CollectiveMismatchError on both ranks, naming collective #3 and the ranks that differ

instead of a hang or a silently wrong sum.  Cost: one small store exchange per net instance
(one key per rank; the full lists only travel with it so that a mismatch can be named).

Off switch: ``DPGRAPH_CHECK_COLLECTIVE_SCHEDULE=0`` in the environment of every rank.
Registered as a runtime first-run check when this module is imported (Parallelize does).
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpgraph.errors import CollectiveMismatchError, CollectiveTimeoutError
from dpgraph.runtime.first_run import register_first_run_check

ENV_VAR = "DPGRAPH_CHECK_COLLECTIVE_SCHEDULE"
CROSS_RANK = frozenset({"Allreduce", "Broadcast", "Reduce", "Allgather", "ReduceScatter",
                        "Barrier"})
_SUMS = frozenset({"Allreduce", "Reduce", "ReduceScatter"})
_SAME_AS_INPUT = frozenset({"Copy", "CopyGPUToCPU", "CopyCPUToGPU", "ConstantFill", "Sum",
                            "NCCLAllreduce", "NCCLBroadcast", "Allreduce", "Broadcast",
                            "EnsureCPUOutput", "Alias"})
_CREATORS = frozenset({"CreateCommonWorld", "CloneCommonWorld"})
_COUNTERS: dict[tuple[str, int], Any] = {}


@dataclass(frozen=True)
class Channel:
    """Where a world's ranks meet: its store, this rank, the size and a timeout (s)."""

    store: Any
    rank: int
    size: int
    timeout: float
    name: str


def enabled() -> bool:
    """False when ``DPGRAPH_CHECK_COLLECTIVE_SCHEDULE`` is 0/false/off/no."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "off", "no")


# --- the schedule of one net -----------------------------------------------------------------
class _Shapes:
    """Shape and dtype of blobs as a net's ops see them at its first run, propagated in op
    order: workspace values for blobs no earlier op writes (``<param>_grad`` falls back to
    its param's), through copies, fills, in-place collectives and bucket (un)packing for
    the others.  Unknown: ``?``."""

    def __init__(self, workspace: Any) -> None:
        self.workspace = workspace
        self.known: dict[str, str] = {}

    def describe(self, blob: str) -> str:
        if blob not in self.known:
            self.known[blob] = self._value(blob) or (
                self._value(blob[:-len("_grad")]) if blob.endswith("_grad") else None) or "?"
        return self.known[blob]

    def _value(self, blob: str) -> str | None:
        value = self.workspace.get_blob_or_none(blob)
        if value is not None and hasattr(value, "shape") and hasattr(value, "dtype"):
            return f"{'x'.join(str(d) for d in value.shape) or 'scalar'} {value.dtype}"
        return None

    def after(self, op: Any) -> None:
        """Record what ``op`` writes."""
        for index, blob in enumerate(op.output):
            self.known[blob] = self._output(op, index, blob)

    def _output(self, op: Any, index: int, blob: str) -> str:
        if op.type == "GradientBucketPack":
            return _packed([self.describe(b) for b in op.input])
        if op.type == "GradientBucketUnpack":
            return self.describe(op.input[index + 1]) if index + 1 < len(op.input) else "?"
        source = _collective_source(op, index)
        if op.type in _SAME_AS_INPUT and source is not None:
            return self.describe(source)
        if blob.endswith("_grad"):
            return self._value(blob[:-len("_grad")]) or "?"
        if blob in op.input:  # updated in place (optimizer ops): the input's shape
            return self.describe(blob)
        return "?"


def _packed(parts: Sequence[str]) -> str:
    """The description of a bucket packing blobs described by ``parts``."""
    if not parts or any(p == "?" for p in parts):
        return "?"
    count = 0
    for part in parts:
        dims = part.split(" ")[0]
        size = 1
        for d in dims.split("x") if dims != "scalar" else ():
            size *= int(d)
        count += size
    return f"{count} {parts[0].split(' ')[1]}"


def _collective_source(op: Any, index: int) -> str | None:
    if op.type in ("Allreduce", "Broadcast"):
        return op.input[index + 1] if index + 1 < len(op.input) else None
    if op.type in ("NCCLAllreduce", "NCCLBroadcast"):
        return op.input[index] if index < len(op.input) else None
    return op.input[0] if op.input else None


def _arg(op: Any, name: str) -> Any:
    for arg in op.arg:
        if arg.name == name:
            return arg.i if arg.HasField("i") else arg.s.decode() if arg.HasField("s") else None
    return None


def _entry(op: Any, shapes: _Shapes) -> str:
    blobs = list(op.input[1:])
    described = ", ".join(f"{b} [{shapes.describe(b)}]" for b in blobs)
    extra = []
    if op.type in _SUMS:
        extra.append("sum")
    if op.type in ("Broadcast", "Reduce"):
        extra.append(f"root {_arg(op, 'root') or 0}")
    engine = (op.engine or _arg(op, "engine") or "GLOO").upper()
    return f"{op.type}[{engine}]({described}) -> {list(op.output)} {' '.join(extra)}".rstrip()


def _creation(op: Any) -> str:
    engine = (op.engine or _arg(op, "engine") or "GLOO").upper()
    if op.type == "CloneCommonWorld":
        return f"CloneCommonWorld[{engine}]({op.input[0]})"
    return (f"CreateCommonWorld[{engine}](size {_arg(op, 'size')}, timeout_ms "
            f"{_arg(op, 'timeout_ms')})")


def collective_schedule(net_def: Any, workspace: Any) -> dict[str, list[str]]:
    """``{common world blob: [one line per collective, in net order]}``; a world the net
    creates (CreateCommonWorld, CloneCommonWorld) lists its creation first."""
    shapes = _Shapes(workspace)
    schedule: dict[str, list[str]] = {}
    for op in net_def.op:
        if op.type in CROSS_RANK and op.input:
            schedule.setdefault(op.input[0], []).append(_entry(op, shapes))
        elif op.type in _CREATORS and op.output:
            schedule.setdefault(op.output[0], []).append(_creation(op))
        shapes.after(op)
    return schedule


def digest(entries: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(entries).encode()).hexdigest()


# --- the exchange ----------------------------------------------------------------------------
def _channels(workspace: Any, net_def: Any) -> dict[str, Channel]:
    """The channel of every common world the net uses that spans several ranks: an existing
    world's own, or (for a world this net creates) its store handler's and arguments."""
    result: dict[str, Channel] = {}
    for name in {op.input[0] for op in net_def.op if op.type in CROSS_RANK and op.input}:
        world = workspace.get_blob_or_none(name)
        if getattr(world, "size", 1) > 1 and getattr(world, "store", None) is not None:
            result[name] = Channel(world.store, world.rank, world.size, float(world.timeout),
                                   name)
    for op in net_def.op:
        if op.type == "CreateCommonWorld" and op.input and op.output:
            store = workspace.get_blob_or_none(op.input[0])
            size, rank = _arg(op, "size") or 1, _arg(op, "rank") or 0
            timeout_ms = _arg(op, "timeout_ms") or 30000
            if size > 1 and store is not None and hasattr(store, "set"):
                result[op.output[0]] = Channel(store, rank, size, timeout_ms / 1000.0,
                                               op.output[0])
        elif op.type == "CloneCommonWorld" and op.input and op.input[0] in result:
            result[op.output[0]] = result[op.input[0]]
    return result


def _exchange(channel: Channel, key: str, payload: dict[str, Any]
              ) -> dict[int, dict[str, Any]]:
    """Publish ``payload`` under ``key/<rank>`` and read every rank's (bounded by the
    channel's timeout)."""
    store, rank, size = channel.store, channel.rank, channel.size
    store.set(f"{key}/{rank}", json.dumps(payload))
    keys = [f"{key}/{r}" for r in range(size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=channel.timeout))
    except RuntimeError as error:
        missing = [r for r in range(size) if not store.check([keys[r]])]
        raise CollectiveTimeoutError(
            f"collective-schedule check on common world {channel.name!r}: ranks {missing} "
            f"did not publish their schedule within {channel.timeout:g}s (they did not start "
            f"this net, or died). Cause: {error}") from error
    return {r: json.loads(bytes(store.get(keys[r])).decode()) for r in range(size)}


def first_difference(by_rank: Mapping[int, Sequence[str]]) -> tuple[int, dict[str, list[int]]]:
    """The first index where the ranks' lists differ and, for it, which ranks issue what."""
    longest = max(len(v) for v in by_rank.values())
    for index in range(longest):
        groups: dict[str, list[int]] = {}
        for rank in sorted(by_rank):
            entries = by_rank[rank]
            item = entries[index] if index < len(entries) else "<nothing: no collective left>"
            groups.setdefault(item, []).append(rank)
        if len(groups) > 1:
            return index, groups
    return -1, {}


def _mismatch(net: str, world: str, index: int, groups: Mapping[str, list[int]]) -> str:
    ordered = sorted(groups.items(), key=lambda kv: kv[1][0])
    lines = [f"  ranks {ranks}: {item}" for item, ranks in ordered]
    majority = max(ordered, key=lambda kv: len(kv[1]))[1]
    odd = sorted(r for _, ranks in ordered for r in ranks if ranks is not majority)
    return (f"Collective schedules differ on common world {world!r} of net {net!r}: "
            f"collective #{index} is\n" + "\n".join(lines) + "\n"
            f"Ranks {odd} differ from ranks {majority}; running the net would hang or sum "
            f"different blobs. Build the same graph on every rank (same model code, "
            f"Parallelize arguments and cost model file for gradient_bucket_mb='auto'), or "
            f"set {ENV_VAR}=0 to skip this check.")


def _groups(channels: Mapping[str, Channel]) -> list[list[str]]:
    """Worlds met through one store with this rank's (rank, size): one exchange each."""
    groups: dict[tuple[int, int, int], list[str]] = {}
    for name in sorted(channels):
        channel = channels[name]
        groups.setdefault((id(channel.store), channel.rank, channel.size), []).append(name)
    return list(groups.values())


def check_net(workspace: Any, net_def: Any) -> None:
    """Compare this net's collective schedule with every other rank's; raise
    :class:`~dpgraph.errors.CollectiveMismatchError` on every rank when they differ.

    One exchange of per-world digests; only when they differ, a second one of the lists.
    """
    if not enabled() or not any(op.type in CROSS_RANK or op.type in _CREATORS
                                for op in net_def.op):
        return
    channels = _channels(workspace, net_def)
    if not channels:
        return
    schedule = collective_schedule(net_def, workspace)
    for names in _groups(channels):
        channel = channels[names[0]]
        counter = _COUNTERS.setdefault((net_def.name, channel.size), itertools.count())
        key = f"dpgraph/schedule/{net_def.name}/{channel.size}/{next(counter)}"
        mine = {name: digest(schedule.get(name, [])) for name in names}
        digests = _exchange(channel, key, mine)
        every = sorted({n for d in digests.values() for n in d})
        differing = [n for n in every if len({d.get(n) for d in digests.values()}) > 1]
        if not differing:
            continue
        lists = _exchange(channel, f"{key}/entries",
                          {n: schedule.get(n, []) for n in differing})
        name = differing[0]
        index, groups = first_difference({r: p.get(name, []) for r, p in lists.items()})
        raise CollectiveMismatchError(_mismatch(net_def.name, name, index, groups))


register_first_run_check(check_net)
