"""Caffe2's ``models.resnet`` (re-exported from :mod:`dpgraph.modeling.zoo.resnet`)."""

from dpgraph.modeling.zoo.resnet import (
    RESNEXT_BLOCK_CONFIG,
    RESNEXT_STRIDES,
    ResNetBuilder,
    create_resnet50,
    create_resnet_32x32,
    create_resnext,
    log,
)

__all__ = ["RESNEXT_BLOCK_CONFIG", "RESNEXT_STRIDES", "ResNetBuilder", "create_resnet50",
           "create_resnet_32x32", "create_resnext", "log"]
