"""ShuffleNetV2 with Caffe2's blob names (``stage2_stride2left_dwconv``,
``stage3_stride1_repeat2_concat``, ``conv5``, ``last_out_L<n>``, ...)."""

from __future__ import annotations

from typing import Any

from dpgraph.modeling.brew import brew

OUTPUT_CHANNELS = {
    "0.5x": [24, 48, 96, 192, 1024],
    "1.0x": [24, 116, 232, 464, 1024],
    "1.5x": [24, 176, 352, 704, 1024],
    "2.0x": [24, 244, 488, 976, 2048],
}
_MSRA: tuple[str, dict[str, Any]] = ("MSRAFill", {})


class ShuffleNetV2Builder:
    """Builds ShuffleNetV2 into ``model`` with :meth:`create`."""

    def __init__(self, model: Any, data: Any, num_input_channels: int, num_labels: int,
                 num_groups: int = 2, width: str = "1.0x", is_test: bool = False,
                 detection: bool = False, bn_epsilon: float = 1e-5) -> None:
        self.model = model
        self.prev_blob = data
        self.num_input_channels = num_input_channels
        self.num_labels = num_labels
        self.num_groups = num_groups
        self.output_channels = OUTPUT_CHANNELS[width]
        self.stage_repeats = [3, 7, 3]
        self.is_test = is_test
        self.detection = detection
        self.bn_epsilon = bn_epsilon

    def create(self) -> Any:
        in_channels = self.output_channels[0]
        self.prev_blob = brew.conv(self.model, self.prev_blob, "stage1_conv",
                                   self.num_input_channels, in_channels, weight_init=_MSRA,
                                   kernel=3, stride=2)
        self.prev_blob = brew.max_pool(self.model, self.prev_blob, "stage1_pool", kernel=3,
                                       stride=2)
        for idx, repeat in enumerate(self.stage_repeats):
            out_channels = self.output_channels[idx + 1]
            self.add_spatial_ds_unit(in_channels, out_channels, f"stage{idx + 2}_stride2")
            for i in range(repeat):
                self.add_basic_unit(out_channels,
                                    f"stage{idx + 2}_stride1_repeat{i + 1}")
            in_channels = out_channels
        self.prev_blob = brew.conv(self.model, self.prev_blob, "conv5", in_channels,
                                   self.output_channels[4], kernel=1)
        self.prev_blob = self.model.AveragePool(self.prev_blob, "avg_pool", kernel=7)
        self.last_out = brew.fc(self.model, self.prev_blob,
                                f"last_out_L{self.num_labels}",
                                self.output_channels[4], self.num_labels)
        return self.last_out

    # --- units -------------------------------------------------------------------------
    def add_detection_unit(self, prev_blob: Any, prefix: str, in_channels: int,
                           out_channels: int, stride: int = 1) -> Any:
        """The extra depthwise 3x3 conv + bn that ShuffleNetV2 adds for detection."""
        out = self.add_dwconv3x3_bn(prev_blob, prefix + "_dwconv", in_channels, stride)
        return out

    def add_spatial_ds_unit(self, in_channels: int, out_channels: int, prefix: str) -> None:
        """The down-sampling unit: a stride-2 left branch and right branch, concatenated."""
        right = left = self.prev_blob
        out_channels = out_channels // 2
        if self.detection:
            left = self.add_detection_unit(left, prefix + "_left_detection", in_channels,
                                           in_channels)
        left = self.add_dwconv3x3_bn(left, prefix + "left_dwconv", in_channels, 2)
        left = self.add_conv1x1_bn(left, prefix + "_left_conv1", in_channels, out_channels,
                                   relu=True)
        if self.detection:
            right = self.add_detection_unit(right, prefix + "_right_detection", in_channels,
                                            in_channels)
        right = self.add_conv1x1_bn(right, prefix + "_right_conv1", in_channels,
                                    out_channels, relu=True)
        right = self.add_dwconv3x3_bn(right, prefix + "_right_dwconv", out_channels, 2)
        right = self.add_conv1x1_bn(right, prefix + "_right_conv2", out_channels,
                                    out_channels, relu=True)
        self.prev_blob = brew.concat(self.model, [right, left], prefix + "_concat")
        self.prev_blob = self.model.net.ChannelShuffle(
            self.prev_blob, prefix + "_ch_shuffle", group=self.num_groups, kernel=1)

    def add_basic_unit(self, in_channels: int, prefix: str) -> None:
        """The basic unit: split channels, transform the right half, concat, shuffle."""
        in_channels = in_channels // 2
        left = prefix + "_left"
        right = prefix + "_right"
        self.model.net.Split(self.prev_blob, [left, right])
        if self.detection:
            right = self.add_detection_unit(right, prefix + "_right_detection", in_channels,
                                            in_channels)
        right = self.add_conv1x1_bn(right, prefix + "_right_conv1", in_channels, in_channels,
                                    relu=True)
        right = self.add_dwconv3x3_bn(right, prefix + "_right_dwconv", in_channels, 1)
        right = self.add_conv1x1_bn(right, prefix + "_right_conv2", in_channels, in_channels,
                                    relu=True)
        self.prev_blob = brew.concat(self.model, [right, left], prefix + "_concat")
        self.prev_blob = self.model.net.ChannelShuffle(
            self.prev_blob, prefix + "_ch_shuffle", group=self.num_groups, kernel=1)

    def add_dwconv3x3_bn(self, prev_blob: Any, prefix: str, channels: int, stride: int
                         ) -> Any:
        blob = brew.conv(self.model, prev_blob, prefix, channels, channels,
                         weight_init=_MSRA, kernel=3, stride=stride, group=channels, pad=1)
        return brew.spatial_bn(self.model, blob, prefix + "_bn", channels,
                               epsilon=self.bn_epsilon, is_test=self.is_test)

    def add_conv1x1_bn(self, prev_blob: Any, prefix: str, in_channels: int,
                       out_channels: int, relu: bool = False) -> Any:
        blob = brew.conv(self.model, prev_blob, prefix, in_channels, out_channels,
                         weight_init=_MSRA, kernel=1)
        blob = brew.spatial_bn(self.model, blob, prefix + "_bn", out_channels,
                               epsilon=self.bn_epsilon, is_test=self.is_test)
        if relu:
            blob = brew.relu(self.model, blob, blob)
        return blob


def create_shufflenet(model: Any, data: Any, num_input_channels: int, num_labels: int,
                      label: Any = None, is_test: bool = False, no_loss: bool = False) -> Any:
    """ShuffleNetV2 1.0x; returns last_out (no_loss), (softmax, loss) with a label, else
    None (no softmax is added)."""
    builder = ShuffleNetV2Builder(model, data, num_input_channels, num_labels,
                                  is_test=is_test)
    builder.create()
    if no_loss:
        return builder.last_out
    if label is not None:
        (softmax, loss) = model.SoftmaxWithLoss([builder.last_out, label], ["softmax", "loss"])
        return (softmax, loss)
    return None
