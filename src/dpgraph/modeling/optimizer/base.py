"""The :class:`Optimizer` base: per-class instance numbers, lr blobs, the iteration counter."""

from __future__ import annotations

import copy
from collections import defaultdict, namedtuple
from typing import Any

import numpy as np

from dpgraph.errors import ModelConfigError, ModelError
from dpgraph.ir import scope
from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.device import CPU, DeviceOption, IsGPUDeviceType
from dpgraph.modeling.parameter_info import ParameterInfo
from dpgraph.proto import caffe2_pb2

OPTIMIZER_ITERATION_NAME = "optimizer_iteration"
OPTIMIZER_ITERATION_LR_NAME = "optimizer_iteration_lr"
ITERATION_MUTEX_NAME = "iteration_mutex"
ITERATION_MUTEX_LR_NAME = "iteration_mutex_lr"
_LEARNING_RATE_INJECTION = "lr_injection"
FP16_ENGINES = ["SIMD_Q_FP16", "SIMD_Q_STOC_FP16", "SIMD_Q_STOC_MKL_FP16"]

AuxOptimizerParams = namedtuple("AuxOptimizerParams", ["local", "shared"])

#: ``{class name: instances created}``; process-global, like Caffe2's.
_optimizer_instance_count: defaultdict[str, int] = defaultdict(int)


def reset_optimizer_instance_count(class_name: str | None = None) -> None:
    """Test hook: restart instance numbering (of one class, or of all classes) at 0."""
    if class_name is None:
        _optimizer_instance_count.clear()
    else:
        _optimizer_instance_count.pop(class_name, None)


def BuildUniqueMutexIter(init_net: Any, net: Any, iter: Any = None, iter_mutex: Any = None,
                         iter_val: int = 0) -> BlobReference:
    """The shared int64 iteration counter (created once, on CPU) and its AtomicIter.

    param_init_net gets ``ConstantFill([], iter, shape=[1], value=iter_val, dtype=INT64)``
    and ``CreateMutex([], [iter_mutex])``; net gets ``AtomicIter([mutex, iter], [iter])``.
    """
    iter = iter if iter is not None else OPTIMIZER_ITERATION_NAME
    iter_mutex = iter_mutex if iter_mutex is not None else ITERATION_MUTEX_NAME
    if init_net.BlobIsDefined(iter):
        return init_net.GetBlobRef(iter)
    cpu = DeviceOption(CPU, extra_info=["device_type_override:cpu"])
    with scope.DeviceScope(cpu):
        iteration = init_net.ConstantFill([], iter, shape=[1], value=iter_val,
                                          dtype=caffe2_pb2.TensorProto.INT64)
        mutex = init_net.CreateMutex([], [iter_mutex])
        net.AtomicIter([mutex, iteration], [iteration])
    return iteration


class Optimizer:
    """Base class: ``optimizer(net, param_init_net, param_info)`` adds the update ops."""

    def __init__(self) -> None:
        self._aux_params = AuxOptimizerParams(local=[], shared=[])
        name = type(self).__name__
        self._instance_num = _optimizer_instance_count[name]
        _optimizer_instance_count[name] += 1
        self._lr_multiplier: Any = None
        self._local_lr_multiplier: Any = None
        self._local_lr_multiplier_on_gpu = False
        self._use_dedicated_lr_iteration_counter = False

    @property
    def use_dedicated_lr_iteration_counter(self) -> bool:
        """Whether the learning rate counts its own iterations (``optimizer_iteration_lr``)."""
        return self._use_dedicated_lr_iteration_counter

    @use_dedicated_lr_iteration_counter.setter
    def use_dedicated_lr_iteration_counter(self, value: bool) -> None:
        self._use_dedicated_lr_iteration_counter = value

    def __call__(self, net: Any, param_init_net: Any, param: Any, grad: Any = None) -> None:
        if grad is None:
            if not isinstance(param, ParameterInfo):
                raise ModelError(
                    f"{type(self).__name__}: pass a ParameterInfo, or a param and its grad.")
            param_info = param
        else:
            if isinstance(param, str):
                param = BlobReference(param)
            param_info = ParameterInfo(param_id=None, param=param, grad=grad)
        self._run(net, param_init_net, param_info)

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        raise NotImplementedError("Optimizer need to implement _run function")

    # --- blob names --------------------------------------------------------------------
    def get_cpu_blob_name(self, base_str: str, node_name: str = "") -> str:
        return f"{type(self).__name__}_{self._instance_num}_{base_str}{node_name}_cpu"

    def get_gpu_blob_name(self, base_str: str, gpu_id: int, node_name: str) -> str:
        return f"{type(self).__name__}_{self._instance_num}_{base_str}{node_name}_gpu{gpu_id}"

    def make_unique_blob_name(self, base_str: str) -> str:
        """The cpu or gpu form of the name, from the current device scope."""
        current = scope.CurrentDeviceScope()
        if current is None:
            return self.get_cpu_blob_name(base_str)
        if IsGPUDeviceType(current.device_type):
            return self.get_gpu_blob_name(base_str, current.device_id, current.node_name)
        return self.get_cpu_blob_name(base_str, current.node_name)

    @property
    def attributes(self) -> dict[str, Any]:
        """A deep copy of the optimizer's attributes without ``_instance_num`` (Caffe2's)."""
        attr = copy.deepcopy(vars(self))
        attr.pop("_instance_num", None)
        return attr

    # --- learning rate -----------------------------------------------------------------
    def build_lr(self, net: Any, param_init_net: Any, base_learning_rate: float,
                 learning_rate_blob: Any = None, policy: str = "fixed", iter_val: int = 0,
                 **kwargs: Any) -> tuple[Any, Any]:
        """``LearningRate`` (base_lr = -base_learning_rate) on the shared iteration counter,
        scaled by the lr multiplier when one was added.  Returns ``(lr, iteration)``."""
        if learning_rate_blob is None:
            learning_rate_blob = self.make_unique_blob_name("lr")
        if self._use_dedicated_lr_iteration_counter:
            iteration = BuildUniqueMutexIter(param_init_net, net,
                                             iter=OPTIMIZER_ITERATION_LR_NAME,
                                             iter_mutex=ITERATION_MUTEX_LR_NAME,
                                             iter_val=iter_val)
        else:
            iteration = BuildUniqueMutexIter(param_init_net, net, iter_val=iter_val)
        if not net.BlobIsDefined(learning_rate_blob):
            lr = net.LearningRate([iteration], learning_rate_blob,
                                  base_lr=-base_learning_rate, policy=policy, **kwargs)
        else:
            lr = net.GetBlobRef(learning_rate_blob)
        if self._lr_multiplier is not None:
            multiplier = net.CopyFromCPUInput(self._lr_multiplier,
                                              self.make_unique_blob_name("lr_multiplier"))
            lr = net.Mul([lr, multiplier], self.make_unique_blob_name("scaled_lr"),
                         broadcast=1)
        if self._local_lr_multiplier is not None:
            lr = self._apply_local_lr_multiplier(net, lr)
        return lr, iteration

    def build_non_lr_iter(self, net: Any, param_init_net: Any, iter_val: int = 0) -> Any:
        """The shared ``optimizer_iteration`` counter for non-learning-rate uses when the
        learning rate has its own; a fixed ``LearningRate`` on it (its
        ``iter_placement_hint``) keeps it placed with the trainer, as in Caffe2."""
        if not self._use_dedicated_lr_iteration_counter:
            raise ModelConfigError(
                f"{type(self).__name__}.build_non_lr_iter is only for optimizers with a "
                f"dedicated learning-rate iteration counter; set "
                f"use_dedicated_lr_iteration_counter=True or use build_lr's iteration.")
        iteration = BuildUniqueMutexIter(param_init_net, net, iter_val=iter_val)
        hint = self.make_unique_blob_name("iter_placement_hint")
        if not net.BlobIsDefined(hint):
            net.LearningRate([iteration], hint, base_lr=1.0, policy="fixed")
        return iteration

    def _apply_local_lr_multiplier(self, net: Any, lr: Any) -> Any:
        current = scope.CurrentDeviceScope()
        if (current is not None and IsGPUDeviceType(current.device_type)
                and not self._local_lr_multiplier_on_gpu):
            multiplier = net.CopyFromCPUInput(
                self._local_lr_multiplier, self.make_unique_blob_name("local_lr_multiplier"))
        else:
            multiplier = self._local_lr_multiplier
        return net.Mul([lr, multiplier], self.make_unique_blob_name("local_scaled_lr"),
                       broadcast=1)

    def add_lr_multiplier(self, lr_multiplier: Any) -> None:
        """Scale every lr by the CPU blob ``lr_multiplier`` (copied to each device)."""
        self._lr_multiplier = lr_multiplier

    def _add_local_lr_multiplier(self, local_lr_multiplier: Any,
                                 is_gpu_blob: bool = False) -> None:
        self._local_lr_multiplier = local_lr_multiplier
        self._local_lr_multiplier_on_gpu = is_gpu_blob

    def _clear_local_lr_multiplier(self) -> None:
        self._local_lr_multiplier = None
        self._local_lr_multiplier_on_gpu = False

    def _start_local_lr(self, net: Any, param_init_net: Any, param: Any, grad: Any,
                        lars: float | None) -> None:
        """Caffe2's update prologue: clear the local lr multiplier, then make the LARS
        multiplier (offset ``lars``) the param's local one when set and ``grad`` is dense."""
        self._clear_local_lr_multiplier()
        if lars is not None and not isinstance(grad, GradientSlice):
            self._add_lars_multiplier(net, param_init_net, param, grad, lars)

    def create_lars_inputs(self, param_init_net: Any, weight_decay: float, trust: float,
                           lr_max: float) -> tuple[Any, Any, Any]:
        """The [1] blobs ``weight_decay``, ``trust`` and ``lr_max`` the Lars op reads."""
        wd = param_init_net.ConstantFill([], "weight_decay", shape=[1], value=weight_decay)
        trust_blob = param_init_net.ConstantFill([], "trust", shape=[1], value=trust)
        lr_max_blob = param_init_net.ConstantFill([], "lr_max", shape=[1], value=lr_max)
        return wd, trust_blob, lr_max_blob

    def _add_lars_multiplier(self, net: Any, param_init_net: Any, param: Any, grad: Any,
                             offset: float) -> None:
        """LARS as Caffe2: a ``Lars`` op (offset, lr_min=0, trust 1, lr_max float32 max, wd 0)
        whose output becomes the local lr multiplier of this param."""
        if offset < 0:
            raise ModelConfigError(f"Lars offset must be nonnegative, got {offset}")
        wd, trust, lr_max = self.create_lars_inputs(
            param_init_net, 0.0, 1.0, float(np.finfo(np.float32).max))
        multiplier = net.Lars([param, grad, wd, trust, lr_max],
                              self.make_unique_blob_name(str(param) + "_lars"),
                              offset=offset, lr_min=0.0)
        current = scope.CurrentDeviceScope()
        self._add_local_lr_multiplier(
            multiplier,
            is_gpu_blob=current is not None and IsGPUDeviceType(current.device_type))

    @staticmethod
    def dedup(net: Any, sparse_dedup_aggregator: str | None, grad: Any) -> Any:
        """Merge repeated indices of a GradientSlice when an aggregator is given."""
        if not isinstance(grad, GradientSlice):
            raise ModelError(f"dedup needs a GradientSlice gradient, got {type(grad).__name__}; "
                             "call it only for sparse gradients.")
        if sparse_dedup_aggregator:
            return net.DeduplicateGradientSlices(grad, aggregator=sparse_dedup_aggregator)
        return grad

    def get_auxiliary_parameters(self) -> AuxOptimizerParams:
        """``(local, shared)`` blobs the optimizer created (momenta, ONE, iteration...)."""
        return self._aux_params

    def scale_learning_rate(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "Optimizer Need to Implement `scale_learning_rate` method.")


def effective_outputs(param: Any, output_effective_lr: bool,
                      output_effective_lr_and_update: bool) -> list[str]:
    """The optional extra outputs of a dense update op: ``<param>_effective_lr`` and, with
    ``output_effective_lr_and_update``, ``<param>_update``."""
    if output_effective_lr_and_update:
        return [str(param) + "_effective_lr", str(param) + "_update"]
    if output_effective_lr:
        return [str(param) + "_effective_lr"]
    return []


def current_device() -> caffe2_pb2.DeviceOption:
    """The current device scope, or a plain CPU option."""
    dev = scope.CurrentDeviceScope()
    return dev if dev is not None else DeviceOption(CPU)
