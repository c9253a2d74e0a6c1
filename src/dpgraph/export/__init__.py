"""Export: predictor nets, ONNX models and Graphviz drawings."""

from typing import Any

from dpgraph.export.dot import render, to_dot
from dpgraph.export.predictor import (
    Predictor,
    evaluate_init_net,
    load_predictor,
    make_init_net,
    save_predictor,
)


def to_onnx(predict_net: Any, init_net_or_params: Any, inputs: Any, opset: int = 17,
            outputs: Any = None, name: str | None = None) -> Any:
    """Export a predictor to an ``onnx.ModelProto``; see :func:`dpgraph.export.onnx.to_onnx`.

    (Imported lazily so ``import dpgraph.export`` does not need the ``onnx`` package.)
    """
    from dpgraph.export.onnx import to_onnx as _to_onnx

    return _to_onnx(predict_net, init_net_or_params, inputs, opset=opset, outputs=outputs,
                    name=name)


__all__ = ["Predictor", "evaluate_init_net", "load_predictor", "make_init_net", "render",
           "save_predictor", "to_dot", "to_onnx"]
