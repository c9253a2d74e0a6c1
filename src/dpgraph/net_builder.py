"""Caffe2's ``net_builder``: NetBuilder and ``ops`` (nets and steps from Python blocks)."""

from dpgraph.jobs.net_builder import NetBuilder, Operations, ops

__all__ = ["NetBuilder", "Operations", "ops"]
