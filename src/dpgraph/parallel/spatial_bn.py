"""``combine_spatial_bn``: SpatialBN statistics over the whole batch of all devices.

Ops are first interleaved (op j of every device side by side).  Before each run of
SpatialBN ops, per-device ``ChannelStats`` are summed into ``<X_0>_sums_combined`` and
``<X_0>_sumsq_combined``, which every SpatialBN takes as two more inputs with
``num_batches=ndev``.  Before each run of SpatialBNGradient ops, per-device
``ChannelBackpropStats`` give the scale and bias gradients, which are summed and copied
back; each SpatialBNGradient takes them as inputs with ``num_batches=ndev``.
"""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.ir.arguments import MakeArgument
from dpgraph.parallel._emit import device_option, make_op
from dpgraph.parallel.grouping import stripBlobName
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2

OpList = list[caffe2_pb2.OperatorDef]


def interleave_ops(state: ParallelState) -> None:
    """Caffe2's ``_InterleaveOps``: op j of device 0, op j of device 1, ..."""
    proto = state.model.net.Proto()
    ndev = len(state.devices)
    per_dev = len(proto.op) // ndev
    if per_dev * ndev != len(proto.op):
        raise ParallelizeError(
            f"combine_spatial_bn: number of ops per device in original net is not uniform "
            f"({len(proto.op)} ops for {ndev} devices)."
        )
    buckets: dict[int, OpList] = {d: [] for d in range(ndev)}
    for op in proto.op:
        device = op.device_option.device_id
        if device not in buckets:
            raise ParallelizeError(
                f"combine_spatial_bn needs devices 0..{ndev - 1}; op {op.type} runs on "
                f"device {device}."
            )
        buckets[device].append(op)
    new_ops: OpList = []
    for j in range(per_dev):
        first_type = buckets[0][j].type
        for d in range(ndev):
            if len(buckets[d]) != per_dev or buckets[d][j].type != first_type:
                got = buckets[d][j].type if j < len(buckets[d]) else "nothing"
                raise ParallelizeError(
                    f"combine_spatial_bn: type mismatch {first_type} / {got} at op {j} of "
                    f"device {d}; every device must build the same ops."
                )
            new_ops.append(buckets[d][j])
    _replace_ops(proto, new_ops)


def _replace_ops(proto: caffe2_pb2.NetDef, ops: OpList) -> None:
    copies = [caffe2_pb2.OperatorDef() for _ in ops]
    for copy, op in zip(copies, ops):
        copy.CopyFrom(op)
    del proto.op[:]
    proto.op.extend(copies)


class _Reducer:
    """Builds the cross-device reduction ops for the CPU or the GPU path."""

    def __init__(self, state: ParallelState) -> None:
        self.state = state
        self.gpu = state.config.is_gpu

    def reduce(self, param: str, inputs: list[str], results: list[str] | None) -> OpList:
        if not self.gpu:
            combined = f"cpu_0/{param}_combined"
            ops = [make_op("Sum", inputs, [combined])]
            return ops + [make_op("Copy", [combined], [b]) for b in (results or [])]
        return self._gpu_reduce(param, results)

    def _gpu_reduce(self, param: str, results: list[str] | None) -> OpList:
        ndev, dtype, master = len(self.state.devices), self.state.config.device_type, "cpu_0"
        if results is None:
            results = [f"gpu_{i}/{param}_combined" for i in range(ndev)]
        copies = [f"{master}/{param}_gpu_{i}_copy" for i in range(ndev)]
        ops = [make_op("CopyGPUToCPU", [f"gpu_{i}/{param}"], [copies[i]],
                       device_option(dtype, i)) for i in range(ndev)]
        ops.append(make_op("Sum", copies, [f"{master}/{param}_combined"]))
        ops.extend(make_op("CopyCPUToGPU", [f"{master}/{param}_combined"], [results[i]],
                           device_option(dtype, i)) for i in range(ndev))
        return ops

    def device(self, op: caffe2_pb2.OperatorDef) -> caffe2_pb2.DeviceOption | None:
        if not self.gpu:
            return None
        return device_option(self.state.config.device_type, op.device_option.device_id)


def _forward_run(reducer: _Reducer, run: OpList, ndev: int) -> OpList:
    first_x = run[0].input[0]
    stats, sums, sumsqs = [], [], []
    for op in run:
        x = op.input[0]
        stats.append(make_op("ChannelStats", [x], [x + "_sums", x + "_sumsq"],
                             reducer.device(op)))
        sums.append(x + "_sums")
        sumsqs.append(x + "_sumsq")
        combined = x if reducer.gpu else first_x
        op.input.extend([combined + "_sums_combined", combined + "_sumsq_combined"])
        op.arg.extend([MakeArgument("num_batches", ndev)])
    if reducer.gpu:
        base = stripBlobName(first_x)
        reduce_ops = reducer.reduce(base + "_sums", sums, None)
        reduce_ops += reducer.reduce(base + "_sumsq", sumsqs, None)
    else:
        reduce_ops = [make_op("Sum", sums, [first_x + "_sums_combined"]),
                      make_op("Sum", sumsqs, [first_x + "_sumsq_combined"])]
    return stats + reduce_ops + run


def _backward_run(reducer: _Reducer, run: OpList, ndev: int) -> OpList:
    stats, scale_grads, bias_grads = [], [], []
    for op in run:
        stats.append(make_op("ChannelBackpropStats",
                             [op.input[0], op.input[3], op.input[4], op.input[2]],
                             [op.output[1], op.output[2]], reducer.device(op)))
        scale_grads.append(op.output[1])
        bias_grads.append(op.output[2])
        op.arg.extend([MakeArgument("num_batches", ndev)])
        op.input.extend([op.output[1], op.output[2]])
    reduce_ops = reducer.reduce(stripBlobName(scale_grads[0]), scale_grads, scale_grads)
    reduce_ops += reducer.reduce(stripBlobName(bias_grads[0]), bias_grads, bias_grads)
    return stats + reduce_ops + run


def combine_spatial_bn(state: ParallelState) -> None:
    """Interleave the ops, then rewrite every run of SpatialBN / SpatialBNGradient ops."""
    interleave_ops(state)
    proto = state.model.net.Proto()
    reducer, ndev = _Reducer(state), len(state.devices)
    new_ops: OpList = []
    run: OpList = []
    run_type = ""
    for op in list(proto.op):
        if op.type in ("SpatialBN", "SpatialBNGradient"):
            if run and op.type != run_type:
                new_ops.extend(_flush(reducer, run, run_type, ndev))
                run = []
            run_type = op.type
            run.append(op)
            continue
        if run:
            new_ops.extend(_flush(reducer, run, run_type, ndev))
            run = []
        new_ops.append(op)
    if run:
        new_ops.extend(_flush(reducer, run, run_type, ndev))
    _replace_ops(proto, new_ops)


def _flush(reducer: _Reducer, run: OpList, run_type: str, ndev: int) -> Any:
    if run_type == "SpatialBN":
        return _forward_run(reducer, run, ndev)
    return _backward_run(reducer, run, ndev)
