"""Peak memory of one iteration of a net, by a sweep over its op order.

The model is Caffe2's workspace: a blob keeps its buffer (at the largest size written to
it) across iterations until a ``Free`` op releases it.  The sweep runs the op list twice
and reports the peak of the second (steady-state) pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dpgraph.proto import caffe2_pb2

WriteSizes = list[list[int]]


def aligned_write_sizes(original: caffe2_pb2.NetDef, sizes: Mapping[str, int],
                        measured: caffe2_pb2.NetDef) -> WriteSizes:
    """Bytes written by each output of each op of ``measured``, a version of ``original``
    with renamed blobs and/or inserted ``Free`` ops (op ``i`` of the renamed net writes
    what op ``i`` of the original wrote)."""
    result: WriteSizes = []
    source = iter(original.op)
    for op in measured.op:
        if op.type == "Free":
            result.append([0] * len(op.output))
            continue
        orig = next(source)
        result.append([int(sizes.get(b, 0)) for b in orig.output])
    return result


def peak_bytes(ops: Sequence[caffe2_pb2.OperatorDef], write_sizes: WriteSizes,
               counted: Callable[[str], bool]) -> int:
    """Peak of the summed buffer sizes of the ``counted`` blobs over one steady-state
    iteration (writes grow a buffer to the size written; ``Free`` empties it)."""
    held: dict[str, int] = {}
    peak = 0
    for sweep in range(2):
        total = sum(held.values())
        for op, sizes in zip(ops, write_sizes):
            for name, size in zip(op.output, sizes):
                if not counted(name):
                    continue
                new = 0 if op.type == "Free" else max(held.get(name, 0), size)
                total += new - held.get(name, 0)
                held[name] = new
                if sweep == 1:
                    peak = max(peak, total)
    return peak
