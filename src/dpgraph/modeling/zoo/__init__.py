"""Caffe2's model zoo builders (``caffe2.python.models``): ResNet / ResNeXt and ShuffleNetV2,
with Caffe2's signatures, defaults and blob names, so checkpoints and exported predictors
interoperate."""

from dpgraph.modeling.zoo.resnet import (
    RESNEXT_BLOCK_CONFIG,
    RESNEXT_STRIDES,
    ResNetBuilder,
    create_resnet50,
    create_resnet_32x32,
    create_resnext,
)
from dpgraph.modeling.zoo.shufflenet import (
    OUTPUT_CHANNELS,
    ShuffleNetV2Builder,
    create_shufflenet,
)

__all__ = [
    "OUTPUT_CHANNELS", "RESNEXT_BLOCK_CONFIG", "RESNEXT_STRIDES", "ResNetBuilder",
    "ShuffleNetV2Builder", "create_resnet50", "create_resnet_32x32", "create_resnext",
    "create_shufflenet",
]
