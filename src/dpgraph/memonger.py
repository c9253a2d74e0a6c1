"""Caffe2's ``memonger`` under its names: blob recycling and memory planning passes.

A facade over :mod:`dpgraph.memory`; see there for the algorithms.
"""

import logging

from dpgraph.memory import (
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
    compute_interference_graph,
    compute_ranges,
    compute_statistics,
    estimate_memory_usage,
    get_memory_usage,
    get_updated_ranges,
    is_compatible,
    optimize_inference_fast,
    optimize_inference_for_dag,
    optimize_interference,
    release_blobs_when_used,
    share_grad_blobs,
    topological_sort_traversal,
    topological_sort_traversal_longest_path,
    verify_assignments,
    verify_graph_equality,
    verify_inplace_blobs,
)

__all__ = [
    "AssignmentAlgorithm", "LiveRange", "Optimization", "Statistics", "apply_assignments",
    "blob_assignments", "compute_blob_assignments", "collect_blob_sizes",
    "compute_assignments", "compute_assignments_dp",
    "compute_assignments_greedy", "compute_interference_graph", "compute_ranges",
    "compute_statistics", "estimate_memory_usage", "get_memory_usage", "get_updated_ranges",
    "is_compatible", "optimize_inference_fast", "verify_assignments",
    "optimize_inference_for_dag", "optimize_interference", "release_blobs_when_used",
    "share_grad_blobs", "topological_sort_traversal", "topological_sort_traversal_longest_path",
    "verify_graph_equality", "verify_inplace_blobs",
]

log = logging.getLogger("memonger")
