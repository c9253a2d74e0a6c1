"""Operator families: each module registers schemas, numpy kernels and gradient makers.

Importing this package registers every op dpgraph implements.
"""

import importlib

_FAMILIES = (
    "fill", "math", "reduction", "activation", "nn", "norm", "loss", "shape", "utility", "optim",
    "learning_rate", "sparse", "queue", "device_copy", "collective", "distributed", "sequence",
    "image", "text", "python_op", "detection", "proposals", "detectron", "db", "persist",
    "image_input", "control", "recurrent", "rnn_units", "optim_adaptive", "index", "bucket",
    "dataset", "dataset_records", "timer", "compress", "lp_norm", "monitoring", "map_ops",
    "rebatching_queue", "text_file_reader", "unary", "sparse_mask",
    "segment_ids", "metrics", "row_ops", "dot_padding", "space_batch", "norm_mod", "checks_views",
    "failure",
    "feature_maps", "recsys", "ranking", "histogram",
    "quantize_rowwise", "quantized_lookup", "percentile", "quantize_random",
    "lp_pool", "im2col", "tt", "crf_viterbi",
    "rms_norm", "rmac", "roi_rotated", "sparse_reg", "segment_weighted", "stats", "coalesce",
    "distance", "roi_pool",
)

for _family in _FAMILIES:
    importlib.import_module(f"dpgraph.ops.{_family}")

# Caffe2's shape functions for ops registered above (attached by name, so it comes last).
importlib.import_module("dpgraph.ops.shape_fns")
