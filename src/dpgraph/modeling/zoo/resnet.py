"""ResNet / ResNeXt builders with Caffe2's blob names (``comp_<n>_conv_<k>``,
``comp_<n>_spatbn_<k>``, ``shortcut_projection_<n>``, ``comp_<n>_sum_<k>``, ...).

Names are relative, so under ``NameScope("gpu_0")`` they become ``gpu_0/conv1_w`` etc.::

    with core.NameScope("gpu_0"):
        softmax, loss = create_resnet50(model, "data", 3, 1000, label="label")
"""

from __future__ import annotations

import logging
from typing import Any

from dpgraph.modeling.brew import brew

logging.basicConfig()
log = logging.getLogger("resnext_builder")
log.setLevel(logging.DEBUG)

RESNEXT_BLOCK_CONFIG = {
    18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3),
    152: (3, 8, 36, 3), 200: (3, 24, 36, 3),
}
RESNEXT_STRIDES = [1, 2, 2, 2]
_MSRA: tuple[str, dict[str, Any]] = ("MSRAFill", {})


class ResNetBuilder:
    """Adds ResNet components (bottleneck or simple blocks) one after the other."""

    def __init__(self, model: Any, prev_blob: Any, no_bias: Any, is_test: bool,
                 bn_epsilon: float = 1e-5, bn_momentum: float = 0.9) -> None:
        self.model = model
        self.comp_count = 0
        self.comp_idx = 0
        self.prev_blob = prev_blob
        self.is_test = is_test
        self.bn_epsilon = bn_epsilon
        self.bn_momentum = bn_momentum
        self.no_bias = 1 if no_bias else 0

    def add_conv(self, in_filters: int, out_filters: int, kernel: int, stride: int = 1,
                 group: int = 1, pad: int = 0) -> Any:
        self.comp_idx += 1
        self.prev_blob = brew.conv(
            self.model, self.prev_blob, f"comp_{self.comp_count}_conv_{self.comp_idx}",
            in_filters, out_filters, weight_init=_MSRA, kernel=kernel, stride=stride,
            group=group, pad=pad, no_bias=self.no_bias)
        return self.prev_blob

    def add_relu(self) -> Any:
        self.prev_blob = brew.relu(self.model, self.prev_blob, self.prev_blob)
        return self.prev_blob

    def add_spatial_bn(self, num_filters: int) -> Any:
        self.prev_blob = brew.spatial_bn(
            self.model, self.prev_blob, f"comp_{self.comp_count}_spatbn_{self.comp_idx}",
            num_filters, epsilon=self.bn_epsilon, momentum=self.bn_momentum,
            is_test=self.is_test)
        return self.prev_blob

    def add_bottleneck(self, input_filters: int, base_filters: int, output_filters: int,
                       stride: int = 1, group: int = 1, spatial_batch_norm: bool = True
                       ) -> int:
        """1x1 -> 3x3 (stride, group) -> 1x1 convs plus the (projected) shortcut."""
        self.comp_idx = 0
        shortcut_blob = self.prev_blob
        self.add_conv(input_filters, base_filters, kernel=1, stride=1)
        if spatial_batch_norm:
            self.add_spatial_bn(base_filters)
        self.add_relu()
        self.add_conv(base_filters, base_filters, kernel=3, stride=stride, group=group, pad=1)
        if spatial_batch_norm:
            self.add_spatial_bn(base_filters)
        self.add_relu()
        last_conv = self.add_conv(base_filters, output_filters, kernel=1)
        if spatial_batch_norm:
            last_conv = self.add_spatial_bn(output_filters)
        if output_filters != input_filters:
            shortcut_blob = brew.conv(
                self.model, shortcut_blob, f"shortcut_projection_{self.comp_count}",
                input_filters, output_filters, weight_init=_MSRA, kernel=1, stride=stride,
                no_bias=self.no_bias)
            if spatial_batch_norm:
                shortcut_blob = brew.spatial_bn(
                    self.model, shortcut_blob,
                    f"shortcut_projection_{self.comp_count}_spatbn", output_filters,
                    epsilon=self.bn_epsilon, momentum=self.bn_momentum, is_test=self.is_test)
        self.prev_blob = brew.sum(self.model, [shortcut_blob, last_conv],
                                  f"comp_{self.comp_count}_sum_{self.comp_idx}")
        self.comp_idx += 1
        self.add_relu()
        self.comp_count += 1
        return output_filters

    def add_simple_block(self, input_filters: int, num_filters: int,
                         down_sampling: bool = False, spatial_batch_norm: bool = True
                         ) -> None:
        """Two 3x3 convs plus the (projected) shortcut."""
        self.comp_idx = 0
        shortcut_blob = self.prev_blob
        self.add_conv(input_filters, num_filters, kernel=3,
                      stride=(1 if down_sampling is False else 2), pad=1)
        if spatial_batch_norm:
            self.add_spatial_bn(num_filters)
        self.add_relu()
        last_conv = self.add_conv(num_filters, num_filters, kernel=3, pad=1)
        if spatial_batch_norm:
            last_conv = self.add_spatial_bn(num_filters)
        if num_filters != input_filters:
            shortcut_blob = brew.conv(
                self.model, shortcut_blob, f"shortcut_projection_{self.comp_count}",
                input_filters, num_filters, weight_init=_MSRA, kernel=1,
                stride=(1 if down_sampling is False else 2), no_bias=self.no_bias)
            if spatial_batch_norm:
                shortcut_blob = brew.spatial_bn(
                    self.model, shortcut_blob,
                    f"shortcut_projection_{self.comp_count}_spatbn", num_filters,
                    epsilon=1e-3, is_test=self.is_test)
        self.prev_blob = brew.sum(self.model, [shortcut_blob, last_conv],
                                  f"comp_{self.comp_count}_sum_{self.comp_idx}")
        self.comp_idx += 1
        self.add_relu()
        self.comp_count += 1


def _head(model: Any, last_out: Any, label: Any, no_loss: bool) -> Any:
    if no_loss:
        return last_out
    if label is not None:
        (softmax, loss) = model.SoftmaxWithLoss([last_out, label], ["softmax", "loss"])
        return (softmax, loss)
    return brew.softmax(model, last_out, "softmax")


def create_resnext(model: Any, data: Any, num_input_channels: int, num_labels: int,
                   num_layers: int, num_groups: int, num_width_per_group: int,
                   label: Any = None, is_test: bool = False, no_loss: bool = False,
                   no_bias: Any = 1, conv1_kernel: int = 7, conv1_stride: int = 2,
                   final_avg_kernel: int = 7, log: Any = None, bn_epsilon: float = 1e-5,
                   bn_momentum: float = 0.9) -> Any:
    """ResNeXt-``num_layers``: conv1 / pool1, four stages of bottlenecks, global average
    pool and ``last_out_L<num_labels>``; returns (softmax, loss), softmax or last_out."""
    if num_layers not in RESNEXT_BLOCK_CONFIG:
        log.error(f"{num_layers}-layer is invalid for resnext config")
    block_config = RESNEXT_BLOCK_CONFIG[num_layers]
    num_filters = ([64, 64, 128, 256, 512] if num_layers in (18, 34)
                   else [64, 256, 512, 1024, 2048])
    num_features = num_filters[-1]
    conv_blob = brew.conv(model, data, "conv1", num_input_channels, num_filters[0],
                          weight_init=_MSRA, kernel=conv1_kernel, stride=conv1_stride, pad=3,
                          no_bias=no_bias)
    bn_blob = brew.spatial_bn(model, conv_blob, "conv1_spatbn_relu", num_filters[0],
                              epsilon=bn_epsilon, momentum=bn_momentum, is_test=is_test)
    relu_blob = brew.relu(model, bn_blob, bn_blob)
    max_pool = brew.max_pool(model, relu_blob, "pool1", kernel=3, stride=2, pad=1)
    builder = ResNetBuilder(model, max_pool, no_bias=no_bias, is_test=is_test,
                            bn_epsilon=1e-5, bn_momentum=0.9)
    inner_dim = num_groups * num_width_per_group
    dim_in = num_filters[0]
    for stage, num_blocks in enumerate(block_config):
        for block in range(num_blocks):
            dim_in = builder.add_bottleneck(
                dim_in, inner_dim, num_filters[stage + 1],
                stride=RESNEXT_STRIDES[stage] if block == 0 else 1, group=num_groups)
        inner_dim *= 2
    final_avg = brew.average_pool(model, builder.prev_blob, "final_avg",
                                  kernel=final_avg_kernel, stride=1, global_pooling=True)
    last_out = brew.fc(model, final_avg, f"last_out_L{num_labels}", num_features,
                       num_labels)
    return _head(model, last_out, label, no_loss)


def create_resnet50(model: Any, data: Any, num_input_channels: int, num_labels: int,
                    label: Any = None, is_test: bool = False, no_loss: bool = False,
                    no_bias: Any = 0, conv1_kernel: int = 7, conv1_stride: int = 2,
                    final_avg_kernel: int = 7) -> Any:
    """ResNet-50 (ResNeXt with one group of width 64); convs have biases by default."""
    return create_resnext(model, data, num_input_channels=num_input_channels,
                          num_labels=num_labels, num_layers=50, num_groups=1,
                          num_width_per_group=64, label=label, is_test=is_test,
                          no_loss=no_loss, no_bias=no_bias, conv1_kernel=conv1_kernel,
                          conv1_stride=conv1_stride, final_avg_kernel=final_avg_kernel)


def create_resnet_32x32(model: Any, data: Any, num_input_channels: int, num_groups: int,
                        num_labels: int, is_test: bool = False) -> Any:
    """The CIFAR-style ResNet (6·num_groups + 2 layers) for 32x32 inputs; returns softmax."""
    brew.conv(model, data, "conv1", num_input_channels, 16, kernel=3, stride=1)
    brew.spatial_bn(model, "conv1", "conv1_spatbn", 16, epsilon=1e-3, is_test=is_test)
    brew.relu(model, "conv1_spatbn", "relu1")
    filters = [16, 32, 64]
    builder = ResNetBuilder(model, "relu1", no_bias=0, is_test=is_test)
    prev_filters = 16
    for groupidx in range(0, 3):
        for blockidx in range(0, 2 * num_groups):
            builder.add_simple_block(
                prev_filters if blockidx == 0 else filters[groupidx], filters[groupidx],
                down_sampling=(blockidx == 0 and groupidx > 0))
        prev_filters = filters[groupidx]
    brew.average_pool(model, builder.prev_blob, "final_avg", kernel=8, stride=1)
    brew.fc(model, "final_avg", "last_out", 64, num_labels)
    return brew.softmax(model, "last_out", "softmax")
