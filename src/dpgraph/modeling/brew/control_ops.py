"""brew's control-flow helpers: ``cond`` (If) and ``loop`` (While).

As in Caffe2, they wrap the branch and loop nets with
:func:`dpgraph.jobs.control_ops_util.add_if_op` / ``add_while_op``: each subnet runs in a
Do scope, its inputs are the blobs it reads from the lexical scope (``external_blobs``) and
its outputs the ``external_blobs`` it writes.
"""

from __future__ import annotations

from typing import Any

from dpgraph.jobs.control_ops_util import add_if_op, add_while_op


def cond(model: Any, cond_blob: Any, external_blobs: list[Any], then_model: Any,
         else_model: Any = None) -> None:
    """Add ``If(cond_blob)`` running ``then_model.net`` (or ``else_model.net``)."""
    add_if_op(model.net, cond_blob, external_blobs, then_model.net,
              None if else_model is None else else_model.net)


def loop(model: Any, cond_blob: Any, external_blobs: list[Any], loop_model: Any,
         cond_model: Any = None) -> None:
    """Add ``While(cond_blob)`` running ``loop_model.net`` (and ``cond_model.net`` before
    each check of the condition)."""
    add_while_op(model.net, cond_blob, external_blobs, loop_model.net,
                 None if cond_model is None else cond_model.net)
