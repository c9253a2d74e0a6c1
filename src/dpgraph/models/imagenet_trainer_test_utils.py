"""Caffe2's ``models.imagenet_trainer_test_utils`` (from :mod:`dpgraph.memory.model_checks`)."""

from dpgraph.memory.model_checks import (
    count_blobs,
    count_shared_blobs,
    has_blob,
    test_forward_only,
    test_forward_only_fast_simplenet,
    test_shared_grads,
)

__all__ = ["count_blobs", "count_shared_blobs", "has_blob", "test_forward_only",
           "test_forward_only_fast_simplenet", "test_shared_grads"]
