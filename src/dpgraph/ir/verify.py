"""The net verifier: ``dpgraph.ir.verify(net)``.

Checks, reporting every problem at once (op index, type and blob in each message):

- unknown op types and arity outside the op's schema;
- inputs read before any op writes them and that are not external inputs (only when the net
  declares external inputs, as Caffe2's net creation does), and undefined external outputs;
- an op on one GPU touching a blob in another GPU's name scope (``gpu_1/...`` read by an op
  on ``gpu_0``), except for ops allowed to (:func:`dpgraph.ir.analysis.may_name_other_devices`:
  copies, collectives, peer readers such as Concat, and Parallelize's ``dpm`` Sum).  CPU ops
  are not checked: every CPU device option shares host memory, and Parallelize's CPU
  all-reduce sums ``cpu_<k>/`` blobs on the first device.
  Name scopes are taken as placements only for a GPU whose own scope the net uses: a
  predictor extracted for ``gpu:1`` keeps its ``gpu_0/`` names (as Caffe2's
  ``ExtractPredictorNet`` does) and all its blobs live on GPU 1.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from dpgraph.errors import VerificationError
from dpgraph.ir.analysis import may_name_other_devices
from dpgraph.ir.device import device_key, device_name, effective_device
from dpgraph.ir.proto_io import proto_of
from dpgraph.ir.registry import OPERATORS
from dpgraph.proto import caffe2_pb2

_DEVICE_SCOPE = re.compile(r"^(cpu|gpu|ideep)_(\d+)/")
_GPU_TYPES = (caffe2_pb2.PROTO_CUDA, caffe2_pb2.PROTO_HIP)


def _where(index: int, op: caffe2_pb2.OperatorDef) -> str:
    return f"op {index} ({op.type})"


def _schema_problems(index: int, op: caffe2_pb2.OperatorDef) -> list[str]:
    schema = OPERATORS.get(op.type)
    if schema is None:
        return [f"{_where(index, op)}: unknown operator type {op.type!r}"]
    problem = schema.check_arity(len(op.input), len(op.output))
    return [f"{_where(index, op)}: {problem}"] if problem else []


def _definition_problems(proto: caffe2_pb2.NetDef, known: set[str]) -> list[str]:
    problems: list[str] = []
    defined = set(proto.external_input) | known
    check_inputs = bool(proto.external_input)
    for index, op in enumerate(proto.op):
        if check_inputs:
            problems.extend(
                f"{_where(index, op)}: input {blob!r} is not an external input and no earlier "
                "op produces it" for blob in op.input if blob not in defined)
        defined.update(op.output)
    problems.extend(f"external output {blob!r} is never produced"
                    for blob in proto.external_output if blob not in defined)
    return problems


def blob_device_scope(blob: str) -> tuple[str, int] | None:
    """``('gpu', 1)`` for ``gpu_1/fc_w``; ``None`` for an unscoped blob."""
    match = _DEVICE_SCOPE.match(blob)
    return (match.group(1), int(match.group(2))) if match else None


def _device_problems(proto: caffe2_pb2.NetDef) -> list[str]:
    default = proto.device_option if proto.HasField("device_option") else None
    scopes = {blob_device_scope(blob) for op in proto.op for blob in [*op.input, *op.output]}
    problems: list[str] = []
    for index, op in enumerate(proto.op):
        if may_name_other_devices(op):
            continue
        device = effective_device(op, default)
        device_type, device_id = device_key(device)
        if ("gpu", device_id) not in scopes:
            continue
        for blob in list(op.input) + list(op.output):
            scope = blob_device_scope(blob)
            if scope is None:
                continue
            prefix, scope_id = scope
            if prefix == "gpu" and device_type in _GPU_TYPES and scope_id != device_id:
                problems.append(
                    f"{_where(index, op)} on {device_name(device)} touches blob {blob!r} of "
                    f"device {prefix}_{scope_id}; copy it with a Copy op instead")
    return problems


def verify_problems(net: Any, known_blobs: Iterable[str] = ()) -> list[str]:
    """Every problem found in ``net`` (a Net or NetDef), as readable strings."""
    proto = proto_of(net)
    problems: list[str] = []
    for index, op in enumerate(proto.op):
        problems.extend(_schema_problems(index, op))
    problems.extend(_definition_problems(proto, set(known_blobs)))
    problems.extend(_device_problems(proto))
    return problems


def verify(net: Any, known_blobs: Iterable[str] = ()) -> None:
    """Raise :class:`~dpgraph.errors.VerificationError` listing every problem in ``net``.

    ``known_blobs`` are blobs that exist before the net runs (e.g. filled by an init net).
    """
    problems = verify_problems(net, known_blobs)
    if problems:
        name = proto_of(net).name or "<unnamed>"
        listing = "\n  ".join(problems)
        raise VerificationError(
            f"net {name!r} has {len(problems)} problem(s):\n  {listing}\nFix each one: declare "
            "blobs that exist before the net runs in external_input (or pass known_blobs=), "
            "and check op types, arities and device scopes.", problems)
