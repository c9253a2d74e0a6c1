"""Shared helpers for the export tests: run a net with dpgraph and an ONNX model with ORT."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from dpgraph.core import CreateOperator
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import Workspace

RTOL, ATOL = 1e-5, 1e-6


def make_net(ops: Sequence[caffe2_pb2.OperatorDef], inputs: Sequence[str],
             outputs: Sequence[str], name: str = "net") -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef()
    net.name = name
    net.op.extend(ops)
    net.external_input.extend(inputs)
    net.external_output.extend(outputs)
    return net


def op(op_type: str, inputs: Sequence[str], outputs: Sequence[str], **args: Any
       ) -> caffe2_pb2.OperatorDef:
    return CreateOperator(op_type, list(inputs), list(outputs), **args)


def run_dpgraph(net: caffe2_pb2.NetDef, params: Mapping[str, np.ndarray],
                feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``net`` in a scratch workspace (never the current one)."""
    ws = Workspace("export-test", seed=0)
    for name, value in {**params, **feeds}.items():
        ws.feed_blob(name, value, caffe2_pb2.DeviceOption())
    ws.run_net_once(net)
    return [ws.fetch_blob(name) for name in net.external_output]


def run_onnx(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def check_model(model: Any) -> None:
    onnx = pytest.importorskip("onnx")
    onnx.checker.check_model(model, full_check=True)


def assert_outputs_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                         rtol: float = RTOL, atol: float = ATOL) -> None:
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        assert np.shape(g) == np.shape(w), f"output {index}: {np.shape(g)} vs {np.shape(w)}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {index}")
