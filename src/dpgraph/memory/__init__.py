"""Memory optimisation passes (Caffe2's memonger), exposed as :mod:`dpgraph.memonger`."""

from dpgraph.memory.assign import (
    AssignmentAlgorithm,
    LiveRange,
    Optimization,
    Statistics,
    apply_assignments,
    blob_assignments,
    collect_blob_sizes,
    compute_assignments,
    compute_assignments_dp,
    compute_assignments_greedy,
    compute_blob_assignments,
    compute_ranges,
    compute_statistics,
    get_memory_usage,
    get_updated_ranges,
)
from dpgraph.memory.estimate import estimate_memory_usage, is_compatible, verify_assignments
from dpgraph.memory.graph import (
    OpGraph,
    compute_interference_graph,
    topological_sort_traversal,
    topological_sort_traversal_longest_path,
    verify_graph_equality,
    verify_inplace_blobs,
)
from dpgraph.memory.interference import compute_dependency_graph, optimize_interference
from dpgraph.memory.sharing import (
    optimize_inference_fast,
    optimize_inference_for_dag,
    release_blobs_when_used,
    share_grad_blobs,
    verify_op_schemas,
)

__all__ = [
    "AssignmentAlgorithm", "LiveRange", "OpGraph", "Optimization", "Statistics",
    "apply_assignments", "blob_assignments", "compute_blob_assignments", "collect_blob_sizes",
    "compute_assignments",
    "compute_assignments_dp", "compute_assignments_greedy", "compute_dependency_graph",
    "compute_interference_graph", "compute_ranges", "compute_statistics",
    "estimate_memory_usage", "get_memory_usage", "is_compatible", "verify_assignments",
    "verify_op_schemas",
    "get_updated_ranges", "optimize_inference_fast", "optimize_inference_for_dag",
    "optimize_interference", "release_blobs_when_used", "share_grad_blobs",
    "topological_sort_traversal", "topological_sort_traversal_longest_path",
    "verify_graph_equality", "verify_inplace_blobs",
]
