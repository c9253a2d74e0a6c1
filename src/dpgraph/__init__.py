"""dpgraph: a drop-in replacement for Caffe2's graph-level data-parallel training stack."""

import dpgraph.ops  # noqa: F401  (registers every operator)
import dpgraph.autodiff  # noqa: F401  (registers the backward pass Net.AddGradientOperators runs)
from dpgraph.errors import DpgraphError

__version__ = "0.1.0"
__all__ = ["DpgraphError", "__version__"]
