"""Caffe2's ``core`` module: nets, blobs, operators, scopes and gradients."""

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import Any

from dpgraph.ir.analysis import (
    InferBlobDevices,
    InferOpBlobDevices,
    InferOpBlobDevicesAsDict,
    InferOpDeviceAsBlobDevices,
    get_op_ids_in_path,
    get_output_producers,
    get_ssa,
    get_undefined_blobs,
)
from dpgraph.ir.blob import BlobReference, GradientSlice, ScopedBlobReference, ScopedName
from dpgraph.ir.device import DeviceOption, IsGPUDeviceType, device_equal, device_option_equal
from dpgraph.ir.net import (
    DEFAULT_REMAP_FUNCS,
    Net,
    clone_and_bind_net,
    control_op_remap,
    recurrent_network_op_remap,
    remap_input,
)
from dpgraph.ir.operator import (
    CreateOperator,
    _RectifyInputOutput,
    output_to_list,
)
from dpgraph.ir.plan import (
    ExecutionStep,
    Plan,
    add_nets_in_order,
    execution_step,
    scoped_execution_step,
    to_execution_step,
)
from dpgraph.ir.registry import OPERATORS
from dpgraph.ir.scope import DeviceScope, EmptyDeviceScope, EmptyNameScope, NameScope
from dpgraph.ir.transforms import (
    InjectCrossDeviceCopies,
    InjectDeviceCopiesAmongNets,
    InjectDeviceCopiesAmongNetsWithoutB2D,
)
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import c_api as C  # Caffe2's core.C: the C extension module
from dpgraph.runtime.c_api import (
    SetEnginePref,
    SetGlobalEnginePref,
    SetOpEnginePref,
    TriggerLazyImport,
)


class DataType:
    """TensorProto data types by name (``core.DataType.FLOAT`` == 1)."""


for _name, _value in caffe2_pb2.TensorProto.DataType.items():
    setattr(DataType, _name, _value)


def IsOperator(op_type: str) -> bool:
    """True if ``op_type`` is registered."""
    return IsOperatorWithEngine(op_type, "DEFAULT")


#: Engines whose ops dpgraph serves with its own kernels (numpy, CuPy or a collective
#: backend); Caffe2 registered such ops under ``<type>_ENGINE_<engine>``.
SERVED_ENGINES = frozenset({"DEFAULT", "", "CUDNN", "TENSORCORE", "EIGEN", "GLOO", "NCCL",
                            "MKLDNN", "IDEEP"})


def IsOperatorWithEngine(op_type: str, engine: str) -> bool:
    """True if ``op_type`` is registered and ``engine`` is one dpgraph serves."""
    return op_type in OPERATORS and engine in SERVED_ENGINES


def RegisteredOperators() -> list[str]:
    return OPERATORS.types()


class _RegisteredOperatorSet(AbstractSet[str]):
    """Caffe2's ``core._REGISTERED_OPERATORS``: the registered op types, always current
    (dpgraph's registry needs no refresh)."""

    def __contains__(self, op_type: object) -> bool:
        return op_type in OPERATORS

    def __iter__(self) -> Iterator[str]:
        return iter(OPERATORS.types())

    def __len__(self) -> int:
        return len(OPERATORS.types())


_REGISTERED_OPERATORS = _RegisteredOperatorSet()


def _GetRegisteredOperators() -> set[str]:
    return set(OPERATORS.types())


def RefreshRegisteredOperators(trigger_lazy: bool = True) -> None:
    """dpgraph's registry is always current; runs the lazy imports (lazy_dyndep)."""
    if trigger_lazy:
        TriggerLazyImport()


def CreatePythonOperator(f: Any, inputs: Any, outputs: Any, grad_f: Any = None,
                         pass_workspace: bool = False, python_func_type: Any = None,
                         *args: Any, **kwargs: Any) -> caffe2_pb2.OperatorDef:
    """A ``Python`` OperatorDef running ``f(inputs, outputs)`` (not added to any net)."""
    from dpgraph.ir.python_funcs import register_python_impl

    kwargs["token"] = register_python_impl(f, grad_f, python_func_type, pass_workspace)
    return CreateOperator("Python", inputs, outputs, *args, **kwargs)


def get_net_name(netlike: Any) -> Any:
    """A Net's or NetDef's name; anything else is returned as it is (Caffe2)."""
    if isinstance(netlike, Net):
        return netlike.Proto().name
    if isinstance(netlike, caffe2_pb2.NetDef):
        return netlike.name
    return netlike


def GlobalInit(args: list[str]) -> bool:
    from dpgraph.workspace import GlobalInit as _global_init

    return _global_init(args)


__all__ = [
    "C",
    "ExecutionStep", "Plan", "add_nets_in_order", "execution_step", "scoped_execution_step",
    "to_execution_step",
    "BlobReference", "CreateOperator", "CreatePythonOperator", "DataType", "DeviceOption",
    "DeviceScope",
    "EmptyDeviceScope", "EmptyNameScope", "GlobalInit", "GradientSlice", "InferBlobDevices",
    "InferOpBlobDevices", "InferOpBlobDevicesAsDict", "InferOpDeviceAsBlobDevices",
    "InjectCrossDeviceCopies", "InjectDeviceCopiesAmongNets",
    "InjectDeviceCopiesAmongNetsWithoutB2D", "IsGPUDeviceType", "IsOperator",
    "IsOperatorWithEngine",
    "NameScope", "Net",
    "RefreshRegisteredOperators", "RegisteredOperators", "SetEnginePref",
    "SetGlobalEnginePref", "SetOpEnginePref", "ScopedBlobReference", "ScopedName",
    "DEFAULT_REMAP_FUNCS", "_RectifyInputOutput", "clone_and_bind_net", "get_net_name",
    "recurrent_network_op_remap", "control_op_remap", "remap_input", "device_equal",
    "device_option_equal",
    "get_op_ids_in_path", "get_output_producers", "get_ssa", "get_undefined_blobs",
    "output_to_list",
]

# --- gradients (dpgraph.autodiff) -----------------------------------------------------------
from dpgraph.autodiff import GRADIENT_REGISTRY as GradientRegistry  # noqa: E402
from dpgraph.autodiff import IR  # noqa: E402
from dpgraph.autodiff.accumulate import GradGenMeta, SparseGradGenMeta  # noqa: E402

__all__ += ["GradGenMeta", "GradientRegistry", "IR", "SparseGradGenMeta"]

# --- control-flow gradients (Do / If / While) -----------------------------------------------
import dpgraph.jobs.control_ops_grad  # noqa: E402,F401  (registers their gradient makers)

# --- Caffe2's module-level ``core.workspace`` (tests call core.workspace.RunPlan) -----------
from dpgraph import workspace  # noqa: E402,F401
