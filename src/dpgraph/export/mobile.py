"""Caffe2's ``mobile_exporter``: a net plus trained parameters as an ``(init_net,
predict_net)`` pair of NetDefs for the mobile / C++ predictor.

The init net holds one ``GivenTensor*Fill`` per parameter (the same fill ops as
:func:`dpgraph.export.predictor.fill_op` writes for ``save_predictor``) and a ``[1, 1]``
placeholder per data input; the predict net lists the data inputs first::

    init_net, predict_net = Export(workspace, model.net, model.params)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from dpgraph.export.predictor import fill_op
from dpgraph.ir.analysis import get_ssa
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.proto_io import proto_of
from dpgraph.proto import caffe2_pb2

#: The dtypes Caffe2's mobile exporter writes (anything else is a KeyError, as there).
_MOBILE_DTYPES = {np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64),
                  np.dtype(np.uint8), np.dtype(object)}


def add_tensor(net: caffe2_pb2.NetDef, name: Any, blob: Any) -> None:
    """Append the fill op that recreates ``blob`` as ``name`` to ``net``."""
    array = np.asarray(blob)
    if array.dtype not in _MOBILE_DTYPES:
        raise KeyError(array.dtype.type)
    if array.dtype == object:
        assert all(isinstance(v, bytes) for v in array.ravel()), (
            f"string tensor {name} must hold bytes")
    net.op.append(fill_op(str(name), array))


def _input_and_output_blobs(proto: caffe2_pb2.NetDef, params: set[str]
                            ) -> tuple[list[str], list[str]]:
    _, blob_versions = get_ssa(proto)
    inputs = [b for b, v in blob_versions.items() if v == 0 and b not in params]
    used = {b for op in proto.op for b in op.input}
    outputs = [b for b, v in blob_versions.items() if v != 0 and b not in used]
    return inputs, outputs


def Export(workspace: Any, net: Any, params: Iterable[Any]
           ) -> tuple[caffe2_pb2.NetDef, caffe2_pb2.NetDef]:
    """``(init_net, predict_net)`` for ``net`` with ``params`` fetched from ``workspace``
    (the workspace module, or anything with ``FetchBlob``)."""
    params = list(params)
    predict_net = caffe2_pb2.NetDef()
    predict_net.CopyFrom(proto_of(net))
    input_blobs, output_blobs = _input_and_output_blobs(predict_net, {str(p) for p in params})
    init_net = caffe2_pb2.NetDef()
    for param in params:
        add_tensor(init_net, param, workspace.FetchBlob(param))
    for blob in input_blobs:
        init_net.op.append(CreateOperator("GivenTensorFill", [], [blob], shape=[1, 1],
                                          values=[0.0]))
    original_inputs = list(predict_net.external_input)
    del predict_net.external_input[:]
    predict_net.external_input.extend(input_blobs)
    predict_net.external_input.extend(b for b in original_inputs if b not in input_blobs)
    del predict_net.external_output[:]
    predict_net.external_output.extend(output_blobs)
    return init_net, predict_net


__all__ = ["Export", "add_tensor"]
