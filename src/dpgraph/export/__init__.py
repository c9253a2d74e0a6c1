"""Export: predictor nets, ONNX models and Graphviz drawings."""

from dpgraph.export.dot import render, to_dot

__all__ = ["render", "to_dot"]
