"""Device options: construction, comparison and naming (``cpu_0``, ``gpu_3``)."""

from __future__ import annotations

from collections.abc import Iterable

from dpgraph.errors import DeviceOptionError, DeviceOptionTypeError
from dpgraph.proto import caffe2_pb2

CPU = caffe2_pb2.PROTO_CPU
CUDA = caffe2_pb2.PROTO_CUDA
IDEEP = caffe2_pb2.PROTO_IDEEP
HIP = caffe2_pb2.PROTO_HIP
_GPU_TYPES = frozenset({CUDA, HIP})


def DeviceOption(
    device_type: int,
    device_id: int = 0,
    random_seed: int | None = None,
    node_name: str | None = None,
    numa_node_id: int | None = None,
    extra_info: Iterable[str] | None = None,
) -> caffe2_pb2.DeviceOption:
    """Build a DeviceOption; type and id are always set explicitly, as in Caffe2."""
    option = caffe2_pb2.DeviceOption()
    try:
        option.device_type = device_type
        option.device_id = device_id
    except (TypeError, ValueError) as error:
        raise DeviceOptionTypeError(
            f"DeviceOption(device_type={device_type!r}, device_id={device_id!r}): both must "
            f"be int32 values, e.g. DeviceOption(caffe2_pb2.CUDA, 0) or "
            f"DeviceOption(workspace.GpuDeviceType, 0) ({error})."
        ) from None
    if node_name is not None:
        option.node_name = node_name
    if random_seed is not None:
        option.random_seed = random_seed
    if numa_node_id is not None:
        if device_type != CPU:
            raise DeviceOptionError(
                f"numa_node_id is only valid for CPU device options, got device_type "
                f"{device_type}; drop numa_node_id or use caffe2_pb2.CPU."
            )
        option.numa_node_id = numa_node_id
    if extra_info is not None:
        option.extra_info.extend(extra_info)
    return option


def IsGPUDeviceType(device_type: int) -> bool:
    """True for CUDA and HIP."""
    return device_type in _GPU_TYPES


def device_option_equal(
    opt1: caffe2_pb2.DeviceOption | None,
    opt2: caffe2_pb2.DeviceOption | None,
    ignore_node_name: bool = True,
    ignore_random_seed: bool = True,
) -> bool:
    """Caffe2's loose comparison: CPU equals CPU whatever the id."""
    if not opt1 or not opt2:
        return opt1 == opt2
    if not ignore_node_name and opt1.node_name != opt2.node_name:
        return False
    if not ignore_random_seed and opt1.random_seed != opt2.random_seed:
        return False
    if not opt1.device_type or not opt2.device_type:
        return opt1.device_type == opt2.device_type
    return opt1.device_id == opt2.device_id


def device_equal(src: caffe2_pb2.DeviceOption, dst: caffe2_pb2.DeviceOption) -> bool:
    """Same type and same id."""
    return src.device_type == dst.device_type and src.device_id == dst.device_id


DeviceKey = tuple[int, int]


def device_key(option: caffe2_pb2.DeviceOption | None) -> DeviceKey:
    """``(device_type, device_id)``, with every CPU option mapped to ``(0, id)``."""
    if option is None:
        return (CPU, 0)
    return (option.device_type, option.device_id)


_TYPE_NAMES: dict[int, str] = {CPU: "cpu", CUDA: "gpu", HIP: "gpu", IDEEP: "ideep",
               caffe2_pb2.PROTO_MKLDNN: "mkldnn"}


def device_name(option: caffe2_pb2.DeviceOption | DeviceKey | None) -> str:
    """A readable device name such as ``cpu_0`` or ``gpu_3``."""
    device_type, device_id = (
        option if isinstance(option, tuple) else device_key(option)
    )
    return f"{_TYPE_NAMES.get(device_type, f'device{device_type}')}_{device_id}"


def effective_device(
    op: caffe2_pb2.OperatorDef, net_default: caffe2_pb2.DeviceOption | None = None
) -> caffe2_pb2.DeviceOption:
    """The device an op runs on: its own option, else the net's, else CPU."""
    if op.HasField("device_option"):
        return op.device_option
    if net_default is not None:
        return net_default
    return caffe2_pb2.DeviceOption()
