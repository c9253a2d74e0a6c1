"""What one training step computes and which gradients it produces, and when.

A :class:`StepProfile` holds the forward and backward FLOPs of one worker's step and the
dense gradients in the order the backward pass produces them, each with the backward FLOPs
done by the time it exists.  Profiles come from a graph (:func:`profile_from_nets`: op FLOP
counts from inferred shapes; backward = 2x forward for ops with weights, 1x otherwise) or
from the built-in ResNet-50 (:func:`resnet50_profile`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpgraph.ir.arguments import arguments_dict
from dpgraph.runtime.serialization import DATA_TYPE_TO_NUMPY
from dpgraph.runtime.shapes import infer_shapes_and_types


@dataclass(frozen=True)
class GradTiming:
    name: str
    nbytes: int
    ready_flops: float  # backward FLOPs done when this gradient exists
    op: int = -1  # the forward op whose gradient op writes it (-1: unknown)


@dataclass(frozen=True)
class StepProfile:
    name: str
    forward_flops: float
    backward_flops: float
    grads: tuple[GradTiming, ...]  # production order

    @property
    def grad_bytes(self) -> int:
        return sum(g.nbytes for g in self.grads)


def _numel(shape: Sequence[int] | None) -> int:
    return int(np.prod(shape)) if shape else 1


def op_flops(op: Any, shapes: Mapping[str, Sequence[int]]) -> float:
    """Forward FLOPs of one op (multiply-add = 2), 0 when its shapes are unknown."""
    outs = [shapes.get(b) for b in op.output]
    if not outs or outs[0] is None:
        return 0.0
    out = _numel(outs[0])
    if op.type in ("Conv", "ConvTranspose") and len(op.input) > 1 and op.input[1] in shapes:
        return 2.0 * out * _numel(shapes[op.input[1]][1:])
    if op.type == "FC" and len(op.input) > 1 and op.input[1] in shapes:
        return 2.0 * out * _numel(shapes[op.input[1]][1:])
    if op.type in ("MatMul", "BatchMatMul") and op.input[0] in shapes:
        return 2.0 * out * float(shapes[op.input[0]][-1])
    if op.type in ("MaxPool", "AveragePool"):
        kernel = arguments_dict(op.arg).get("kernel", 1)
        return float(out) * (kernel if isinstance(kernel, int) else 1) ** 2
    if op.type == "SpatialBN":
        return 10.0 * out
    return float(out)


#: Inputs that are state, not trainable params (SpatialBN's running mean and variance).
_STATE_INPUTS = {"SpatialBN": (3, 4)}


def _weights(op: Any, params: set[str]) -> list[str]:
    """The params ``op`` reads that get gradients."""
    state = _STATE_INPUTS.get(op.type, ())
    return [b for i, b in enumerate(op.input) if b in params and i not in state]


def profile_from_nets(predict_net: Any, init_net: Any, input_dims: Mapping[str, Sequence[int]],
                      name: str = "model") -> StepProfile:
    """The training step of a forward net whose params the init net creates.

    ``input_dims`` gives the shape of every external input that is not a param (the batch
    axis included).  Ops after the first gradient op (a training net) are ignored.
    """
    shapes, types = infer_shapes_and_types([init_net], blob_dimensions={})
    params = set(shapes)
    dims = {**{k: list(v) for k, v in shapes.items()}, **{k: list(v) for k, v in
                                                          input_dims.items()}}
    forward = []
    for op in predict_net.op:
        if op.type.endswith("Gradient"):
            break
        forward.append(op)
    net = type(predict_net)()
    net.op.extend(forward)
    all_shapes, _ = infer_shapes_and_types([net], blob_dimensions=dims, blob_types={
        **types, **dict.fromkeys(input_dims, 1)})
    fwd = [op_flops(op, all_shapes) for op in forward]
    timings, done, seen = [], 0.0, set()
    for index in reversed(range(len(forward))):
        weights = _weights(forward[index], params)
        done += (2.0 if weights else 1.0) * fwd[index]
        for blob in weights:
            if blob in seen:
                continue
            seen.add(blob)
            itemsize = np.dtype(DATA_TYPE_TO_NUMPY.get(types.get(blob, 1), np.float32)).itemsize
            timings.append(GradTiming(f"{blob}_grad", _numel(shapes[blob]) * itemsize, done,
                                      index))
    return StepProfile(name, float(sum(fwd)), done, tuple(timings))


# --- the built-in ResNet-50 ------------------------------------------------------------------
_Op = tuple[list[tuple[str, tuple[int, ...]]], float]


def _resnet50_ops() -> list[_Op]:
    """(params, forward FLOPs per image) of each op with parameters, in forward order: a
    conv (its weight), its spatial batch norm (scale and bias), the final FC (w and b)."""
    ops: list[_Op] = []

    def conv(name: str, cin: int, cout: int, k: int, hw_out: int) -> None:
        ops.append(([(f"{name}_w", (cout, cin, k, k))],
                    2.0 * cout * hw_out * hw_out * cin * k * k))
        ops.append(([(f"{name}_spatbn_s", (cout,)), (f"{name}_spatbn_b", (cout,))],
                    10.0 * cout * hw_out * hw_out))

    conv("conv1", 3, 64, 7, 112)
    cin, hw = 64, 56
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            out_hw = hw // stride
            prefix = f"comp_{stage}_{block}"
            conv(f"{prefix}_conv_1", cin, width, 1, out_hw)
            conv(f"{prefix}_conv_2", width, width, 3, out_hw)
            conv(f"{prefix}_conv_3", width, 4 * width, 1, out_hw)
            if block == 0:
                conv(f"shortcut_projection_{stage}", cin, 4 * width, 1, out_hw)
            cin, hw = 4 * width, out_hw
    ops.append(([("last_out_w", (1000, 2048)), ("last_out_b", (1000,))], 2.0 * 1000 * 2048))
    return ops


def resnet50_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """ResNet-50's 161 parameter shapes (25.6 M values), in forward order."""
    return [param for params, _ in _resnet50_ops() for param in params]


def resnet50_profile(batch: int = 32) -> StepProfile:
    """ResNet-50 on 224x224 images, ``batch`` images per worker, float32 gradients (an op's
    gradients all exist once its gradient op ran)."""
    ops = _resnet50_ops()
    forward = batch * sum(flops for _, flops in ops)
    timings: list[GradTiming] = []
    done = 0.0
    for index in reversed(range(len(ops))):
        params, flops = ops[index]
        done += 2.0 * batch * flops
        timings.extend(GradTiming(f"{name}_grad", 4 * _numel(shape), done, index)
                       for name, shape in params)
    return StepProfile(f"resnet50 (batch {batch}/worker)", forward, done, tuple(timings))
