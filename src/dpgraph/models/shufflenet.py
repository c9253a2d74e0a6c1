"""Caffe2's ``models.shufflenet`` (re-exported from :mod:`dpgraph.modeling.zoo.shufflenet`)."""

from dpgraph.modeling.zoo.shufflenet import (
    OUTPUT_CHANNELS,
    ShuffleNetV2Builder,
    create_shufflenet,
)

__all__ = ["OUTPUT_CHANNELS", "ShuffleNetV2Builder", "create_shufflenet"]
