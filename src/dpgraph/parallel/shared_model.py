"""``shared_model=True`` (CPU only): one copy of the parameters, on the first device.

Before the update builders run, ``model.params``/``param_to_grad``/``weights``/``biases``
are pruned to the master params, so only they get update ops.  At the end, ops writing a
non-master param are deleted from both nets and reads of a non-master param are remapped
to ``"<prefix>_<dev0>/<name>"``.
"""

from __future__ import annotations

from typing import Any

from dpgraph.parallel.grouping import stripBlobName
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2


def prune_parameters(state: ParallelState) -> None:
    """Caffe2's ``_PruneParametersForSharing``."""
    model = state.model
    state.all_params_before_prune = {str(p) for p in model.GetParams("")}
    master_prefix = f"{state.namescope(state.master)}/"
    model.params = model.GetParams(master_prefix)
    keep = {str(p) for p in model.params}
    model.param_to_grad = {p: g for p, g in model.param_to_grad.items() if str(p) in keep}
    model.weights = [w for w in model.weights if str(w) in keep]
    model.biases = [b for b in model.biases if str(b) in keep]


def _modify_ops(net: Any, all_params: set[str], master: set[str], prefix: str) -> None:
    proto = net.Proto()
    kept = []
    for op in proto.op:
        if any(out in all_params and out not in master for out in op.output):
            continue
        copy = caffe2_pb2.OperatorDef()
        copy.CopyFrom(op)
        for j, blob in enumerate(copy.input):
            if blob in all_params and blob not in master:
                copy.input[j] = prefix + stripBlobName(blob)
        kept.append(copy)
    del proto.op[:]
    proto.op.extend(kept)


def remap_parameter_blobs(state: ParallelState) -> None:
    """Caffe2's ``_RemapParameterBlobsForSharedModel``."""
    model = state.model
    master_prefix = f"{state.namescope(state.master)}/"
    master = {str(p) for p in model.GetParams("")}
    for net in (model.param_init_net, model.net):
        _modify_ops(net, state.all_params_before_prune, master, master_prefix)
