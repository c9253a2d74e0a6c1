"""Caffe2's ``functional``: ``Functional.<Op>(...)`` runs one operator eagerly."""

from dpgraph.jobs.functional import Functional, namedtupledict

__all__ = ["Functional", "namedtupledict"]
