"""Caffe2's ``session``: Session and LocalSession."""

from dpgraph.jobs.session import CompiledRunnable, LocalSession, Session

__all__ = ["CompiledRunnable", "LocalSession", "Session"]
