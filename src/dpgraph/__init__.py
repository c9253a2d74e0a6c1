"""dpgraph: a drop-in replacement for Caffe2's graph-level data-parallel training stack."""

import dpgraph.autodiff  # noqa: F401  (registers the backward pass Net.AddGradientOperators runs)
import dpgraph.jobs.control_ops_grad  # noqa: F401  (Do/If/While gradient makers)
import dpgraph.ops  # noqa: F401  (registers every operator)
from dpgraph.errors import DpgraphError

__version__ = "0.1.0"
__all__ = ["DpgraphError", "__version__"]
