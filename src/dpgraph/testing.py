"""Helpers for users' own graph-structure tests.

``assert_nets_equal`` compares two nets and, on failure, shows a unified diff of their
text form (see :mod:`dpgraph.ir.text`); ``ops_by_device``, ``collectives`` and ``count_ops``
answer the usual structural questions; ``assert_matches_snapshot`` compares a net with a
text snapshot file that is rewritten on request (``DPGRAPH_UPDATE_SNAPSHOTS=1``)::

    def test_parallelize_graph(tmp_path):
        model = build_and_parallelize()
        assert count_ops(model.net, type="Sum") == 4
        assert_matches_snapshot(model.net, "snapshots/mlp_4dev.txt")

As in Caffe2, net names are unique per process (a second ``ModelHelper(name="mlp")`` gets net
``mlp_1``) and optimizers number their blobs (``SgdOptimizer_3_lr_cpu0``): compare with
``ignore_names=True`` and call ``optimizer.reset_optimizer_instance_count()`` before building
a model whose snapshot must not depend on what ran earlier in the process.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dpgraph.ir.analysis import collectives, count_ops, is_collective, op_types, ops_by_device
from dpgraph.ir.proto_io import proto_of
from dpgraph.ir.registry import OPERATORS
from dpgraph.ir.text import format_net, format_op
from dpgraph.proto import caffe2_pb2

__all__ = [
    "UPDATE_ENV", "assert_matches_snapshot", "assert_nets_equal", "collectives", "count_ops",
    "describe_ops", "is_collective", "op_types", "ops_by_device", "registered_op_types",
]

UPDATE_ENV = "DPGRAPH_UPDATE_SNAPSHOTS"
# ``gpu_3/`` scopes, ``gpu:3`` and Caffe2's per-device names such as ``SgdOptimizer_0_lr_gpu3``.
_DEVICE_ID = re.compile(r"(?<![A-Za-z0-9])(gpu|cpu|ideep|hip)([_:]?)(\d+)(?![0-9])")
def _normalised(net: Any, ignore_names: bool, ignore_device_ids: bool,
                ignore_arg_order: bool) -> caffe2_pb2.NetDef:
    proto = caffe2_pb2.NetDef()
    proto.CopyFrom(proto_of(net))
    if ignore_names:
        proto.ClearField("name")
        for op in proto.op:
            op.ClearField("name")
    for op in proto.op:
        if ignore_arg_order:
            ordered = sorted(op.arg, key=lambda a: a.name)
            del op.arg[:]
            op.arg.extend(ordered)
        if ignore_device_ids and op.HasField("device_option"):
            op.device_option.ClearField("device_id")
    if ignore_device_ids and proto.HasField("device_option"):
        proto.device_option.ClearField("device_id")
    return proto


def _text(proto: caffe2_pb2.NetDef, ignore_device_ids: bool) -> str:
    text = format_net(proto)
    return _DEVICE_ID.sub(r"\1\2*", text) if ignore_device_ids else text


def assert_nets_equal(a: Any, b: Any, ignore_names: bool = False,
                      ignore_device_ids: bool = False, ignore_arg_order: bool = False) -> None:
    """Assert two nets (Net or NetDef) are equal; the error shows a readable text diff.

    Args:
        ignore_names: ignore the net's and ops' ``name`` fields.
        ignore_device_ids: ignore device ids (in device options, in ``gpu_3/`` scopes and in
            per-device blob names such as the optimizer's ``..._lr_gpu3``).
        ignore_arg_order: compare op arguments as sets rather than sequences.
    """
    left = _text(_normalised(a, ignore_names, ignore_device_ids, ignore_arg_order),
                 ignore_device_ids)
    right = _text(_normalised(b, ignore_names, ignore_device_ids, ignore_arg_order),
                  ignore_device_ids)
    if left != right:
        diff = "".join(difflib.unified_diff(left.splitlines(True), right.splitlines(True),
                                            "first", "second"))
        raise AssertionError(f"nets differ:\n{diff}")


def assert_matches_snapshot(net: Any, path: str | os.PathLike[str],
                            update: bool | None = None, **options: bool) -> None:
    """Compare ``net`` with the text snapshot at ``path``.

    The snapshot is (re)written when it does not exist yet, when ``update`` is true, or when
    the environment variable ``DPGRAPH_UPDATE_SNAPSHOTS=1`` is set.  ``options`` are passed
    to :func:`assert_nets_equal`.
    """
    from dpgraph.ir.text import parse_net

    snapshot = Path(path)
    if update is None:
        update = os.environ.get(UPDATE_ENV, "") not in ("", "0")
    if update or not snapshot.exists():
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        snapshot.write_text(format_net(proto_of(net)))
        return
    assert_nets_equal(parse_net(snapshot.read_text()), net, **options)


def describe_ops(ops: Iterable[caffe2_pb2.OperatorDef]) -> str:
    """The text lines of some ops, for assertion messages."""
    return "\n".join(format_op(op) for op in ops)


def registered_op_types() -> list[str]:
    """Every registered operator type."""
    return OPERATORS.types()
