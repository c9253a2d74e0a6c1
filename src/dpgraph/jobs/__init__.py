"""Caffe2's job layer and Python helpers: schema records, NetBuilder/Task/Session, control
flow, and the op-testing helpers (gradient and device checkers, hypothesis strategies).

The Caffe2-named top-level modules (``dpgraph.schema``, ``dpgraph.net_builder``, ...) are
facades over these modules.
"""
