"""dpgraph's graph IR: scopes, device options, blobs, operators, nets and analyses."""

from dpgraph.ir.blob import BlobReference, GradientSlice, ScopedBlobReference, ScopedName
from dpgraph.ir.device import DeviceOption, IsGPUDeviceType, device_option_equal
from dpgraph.ir.net import Net
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.registry import OPERATORS, OpSchema, register_gradient, register_op

__all__ = [
    "BlobReference", "CreateOperator", "DeviceOption", "GradientSlice", "IsGPUDeviceType",
    "Net", "OPERATORS", "OpSchema", "ScopedBlobReference", "ScopedName",
    "device_option_equal", "register_gradient", "register_op",
]

from dpgraph.ir.text import format_net, parse_net  # noqa: E402
from dpgraph.ir.verify import verify, verify_problems  # noqa: E402

__all__ += ["format_net", "parse_net", "verify", "verify_problems"]
