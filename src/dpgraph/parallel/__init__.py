"""The Parallelize pipeline: small passes that turn a one-device training graph into a
data-parallel one.  The Caffe2-named entry points live in :mod:`dpgraph.data_parallel_model`.
"""

import dpgraph.parallel.schedule_check  # noqa: F401  (registers the first-run check)
from dpgraph.collectives.rendezvous import Rendezvous
from dpgraph.parallel.config import ParallelConfig, make_config
from dpgraph.parallel.passes import Pass, parallel_pass, run_passes
from dpgraph.parallel.pipeline import parallelize
from dpgraph.parallel.state import ParallelState

__all__ = ["ParallelConfig", "ParallelState", "Pass", "Rendezvous", "make_config",
           "parallel_pass", "parallelize", "run_passes"]
