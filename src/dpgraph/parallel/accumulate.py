"""Gradient accumulation: ``Parallelize(..., accumulate_steps=k)``.

Each ``RunNet`` consumes one micro-batch.  The main net keeps the forward and backward
passes, adds each device's gradient into an accumulator and counts the micro-batch; every
k-th run an ``If`` runs the synchronisation phase — everything Parallelize would have put
after the backward pass (computed-param broadcast, gradient all-reduce, buckets,
compression, the optimizer with its iteration counter, post-sync ops)::

    ... forward, backward (loss scale 1 / (devices * hosts * k)) ...
    Sum([cpu_d/fc_w_grad_accumulated, cpu_d/fc_w_grad]) -> cpu_d/fc_w_grad_accumulated
    GradientAccumulationStep([grad_accumulation_iter],
                             [grad_accumulation_iter, grad_accumulation_sync], steps=k)
    If([grad_accumulation_sync], control_input=[...], then_net=<dpm_sync>)
      dpm_sync:  Copy(cpu_d/fc_w_grad_accumulated) -> cpu_d/fc_w_grad
                 ConstantFill(cpu_d/fc_w_grad) -> cpu_d/fc_w_grad_accumulated (zeros)
                 Sum/Copy/Allreduce ... ; Iter; LearningRate; WeightedSum ...

so no collective runs on the other k - 1 runs, the learning-rate iteration counts optimizer
steps, and after k runs the parameters are one step on the k-times-larger batch.  The
``If`` lists, as ``control_input``, the blobs the sync phase reads and the outputs no later
op of the main net reads, so the DAG executor runs it last.  With GLOO across hosts,
Caffe2's pre-training barrier (run before every ``RunNet``) runs only before the
synchronising calls: its ops move into an ``If`` on the look-ahead
``grad_accumulation_sync_next``.  Checkpoints hold the counter and
the master's accumulators: resume at a multiple of k.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.ir.blob import GradientSlice
from dpgraph.parallel._emit import device_option, emit, make_op
from dpgraph.parallel.passes import parallel_pass
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2

COUNTER = "grad_accumulation_iter"
CONDITION = "grad_accumulation_sync"
#: the barrier net's look-ahead: whether the coming main-net run synchronises
NEXT_CONDITION = "grad_accumulation_sync_next"
SUFFIX = "_accumulated"


def _enabled(config: Any) -> bool:
    return config.accumulate_steps > 1


@parallel_pass(reads=("net",), writes=("accumulate_split",), enabled=_enabled)
def mark_sync_phase(state: ParallelState) -> None:
    """Remember where the synchronisation phase starts (after the backward pass)."""
    state.accumulate_split = len(state.model.net.Proto().op)


def _dense_gradients(state: ParallelState) -> list[tuple[str, int, str, str]]:
    """``(stripped name, device, full grad, full param)`` of every gradient copy."""
    param_of = {str(g): str(p) for p, g in state.model.param_to_grad.items()
                if not isinstance(g, GradientSlice)}
    result = []
    for name in state.grad_names:
        for device, blob in state.grouped[name].items():
            if isinstance(blob, GradientSlice) or str(blob) not in param_of:
                raise ParallelizeError(
                    f"accumulate_steps={state.config.accumulate_steps}: gradient {name} on "
                    f"device {device} is sparse (a GradientSlice); accumulation needs dense "
                    "gradients. Use accumulate_steps=1 for this model.")
            result.append((name, device, str(blob), param_of[str(blob)]))
    return result


def _option(state: ParallelState, device: int, blob: str) -> caffe2_pb2.DeviceOption:
    option = state.blob_to_device.get(blob)
    return option if option is not None else device_option(state.config.device_type, device)


def _external_reads(ops: Sequence[caffe2_pb2.OperatorDef]) -> list[str]:
    """Blobs ``ops`` read before writing them, in first-read order."""
    written: set[str] = set()
    reads: dict[str, None] = {}
    for op in ops:
        for blob in (*op.input, *op.control_input):
            if blob not in written:
                reads.setdefault(blob, None)
        written.update(op.output)
    return list(reads)


def _sinks(ops: Sequence[caffe2_pb2.OperatorDef]) -> list[str]:
    """One output of every op whose outputs no later op reads (everything else runs
    before some such op)."""
    later_reads: set[str] = set()
    sinks: list[str] = []
    for op in reversed(ops):
        if op.output and not any(b in later_reads for b in op.output):
            sinks.append(op.output[0])
        later_reads.update(op.input)
        later_reads.update(op.control_input)
    return list(dict.fromkeys(reversed(sinks)))


@parallel_pass(reads=("grouped", "grad_names", "blob_to_device", "accumulate_split", "model",
                      "config.accumulate_steps"),
               writes=("net", "param_init_net"), enabled=_enabled)
def accumulate_gradients(state: ParallelState) -> None:
    """Move the synchronisation phase into an ``If`` run every k-th ``RunNet`` and
    accumulate the gradients before it."""
    assert state.accumulate_split is not None
    net, init = state.model.net, state.model.param_init_net
    proto = net.Proto()
    ops = list(proto.op)
    head, tail = ops[:state.accumulate_split], ops[state.accumulate_split:]
    cpu = device_option(caffe2_pb2.PROTO_CPU, 0)
    init_ops, add_ops, load_ops = [], [], []
    for _, device, grad, param in _dense_gradients(state):
        option = _option(state, device, grad)
        acc = grad + SUFFIX
        init_ops.append(make_op("ConstantFill", [param], [acc], option, value=0.0))
        add_ops.append(make_op("Sum", [acc, grad], [acc], option))
        load_ops += [make_op("Copy", [acc], [grad], option),
                     make_op("ConstantFill", [grad], [acc], option, value=0.0)]
    init_ops.append(make_op("ConstantFill", [], [COUNTER], cpu, shape=[1], value=0,
                            dtype=caffe2_pb2.TensorProto.INT64))
    step = make_op("GradientAccumulationStep", [COUNTER], [COUNTER, CONDITION], cpu,
                   steps=state.config.accumulate_steps)
    sync = caffe2_pb2.NetDef(name=f"{proto.name}_sync", op=[*load_ops, *tail])
    main = [*head, *add_ops, step]
    # ordering only (control inputs): the If runs on the host and reads device blobs
    # inside its subnet, where each op has its own device
    after = [b for b in dict.fromkeys([*_external_reads(sync.op), *_sinks(main)])
             if b != CONDITION]
    branch = make_op("If", [CONDITION], [], cpu, control_input=after, then_net=sync)
    del proto.op[:]
    net._recreate_lookup_tables = True  # the removed ops' outputs are no longer defined
    emit(init, *init_ops)
    emit(net, *main, branch)


@parallel_pass(reads=("model_attrs", "config.accumulate_steps"), writes=("nets",),
               enabled=lambda config: _enabled(config) and config.is_multi_host)
def gate_barrier(state: ParallelState) -> None:
    """Run the pre-training barrier net's collectives only before synchronising calls."""
    barrier = state.model_attrs.get("_barrier_net")
    if barrier is None:  # not GLOO: no barrier net
        return
    proto = barrier.Proto()
    ops = list(proto.op)
    cpu = device_option(caffe2_pb2.PROTO_CPU, 0)
    peek = make_op("GradientAccumulationStep", [COUNTER], [f"{COUNTER}_next", NEXT_CONDITION],
                   cpu, steps=state.config.accumulate_steps)
    gated = caffe2_pb2.NetDef(name=f"{proto.name}_gated", op=ops)
    branch = make_op("If", [NEXT_CONDITION], [], cpu, then_net=gated)
    del proto.op[:]
    barrier._recreate_lookup_tables = True
    emit(barrier, peek, branch)
