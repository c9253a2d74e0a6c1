"""SGD optimizers: plain, momentum/Nesterov, multi-precision and fp16 variants."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelConfigError
from dpgraph.ir.blob import GradientSlice
from dpgraph.modeling.optimizer.base import Optimizer, current_device
from dpgraph.modeling.parameter_info import ParameterInfo
from dpgraph.proto import caffe2_pb2

FLOAT = caffe2_pb2.TensorProto.FLOAT
FLOAT16 = caffe2_pb2.TensorProto.FLOAT16


def _check_lr(name: str, base_learning_rate: float) -> None:
    if base_learning_rate <= 0:
        raise ModelConfigError(
            f"{name}: Expect positive base learning rate, got {base_learning_rate}")


class SgdOptimizer(Optimizer):
    """``param -= lr * grad`` (WeightedSum), or MomentumSGDUpdate when momentum > 0."""

    def __init__(self, base_learning_rate: float = 0.01, policy: str = "fixed",
                 momentum: float = 0.0, nesterov: Any = True, sparse_dedup_aggregator: Any = None,
                 lars: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.base_learning_rate = base_learning_rate
        self.policy = policy
        self.momentum = momentum
        self.nesterov = nesterov
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.lars = lars
        self.init_kwargs = kwargs

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.base_learning_rate == 0:
            return
        _check_lr("SgdOptimizer", self.base_learning_rate)
        self._start_local_lr(net, param_init_net, param, grad, self.lars)
        # WeightedSum needs a negative lr; MomentumSGDUpdate takes a positive one.
        lr_sign = -1 if self.momentum else 1
        lr, _ = self.build_lr(net, param_init_net,
                              base_learning_rate=self.base_learning_rate * lr_sign,
                              policy=self.policy, **self.init_kwargs)
        dev = current_device()
        one = param_init_net.ConstantFill(
            [], f"ONE_{dev.device_type}_{dev.device_id}{dev.node_name}", shape=[1], value=1.0)
        self._aux_params.shared.append(one)
        momentum_data = None
        if self.momentum > 0:
            momentum_data = param_init_net.ConstantFill(param, str(param) + "_momentum",
                                                        value=0.0)
            self._aux_params.local.append(momentum_data)
        if isinstance(grad, GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            if momentum_data is not None:
                net.SparseMomentumSGDUpdate(
                    [grad.values, momentum_data, lr, param, grad.indices],
                    [grad.values, momentum_data, param],
                    momentum=self.momentum, nesterov=self.nesterov)
            else:
                net.ScatterWeightedSum([param, one, grad.indices, grad.values, lr], param)
        elif momentum_data is not None:
            net.MomentumSGDUpdate([grad, momentum_data, lr, param],
                                  [grad, momentum_data, param],
                                  momentum=self.momentum, nesterov=self.nesterov)
        else:
            net.WeightedSum([param, one, grad, lr], param)

    def scale_learning_rate(self, scale: float) -> None:
        self.base_learning_rate *= scale


class MultiPrecisionSgdOptimizer(SgdOptimizer):
    """Momentum SGD on the fp32 master copy of an fp16 param, then FloatToHalf."""

    def __init__(self, base_learning_rate: float = 0.1, momentum: float = 0.0,
                 policy: str = "fixed", nesterov: Any = True, sparse_dedup_aggregator: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(base_learning_rate=base_learning_rate, policy=policy,
                         momentum=momentum, nesterov=nesterov,
                         sparse_dedup_aggregator=sparse_dedup_aggregator, **kwargs)

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param = param_info.blob
        copies = param_info.blob_copy
        param_fp32 = copies.get(FLOAT) if copies is not None else None
        if param_fp32 is None:
            return SgdOptimizer._run(self, net, param_init_net, param_info)
        grad = param_info.grad
        if self.base_learning_rate == 0:
            return None
        _check_lr("MultiPrecisionSgdOptimizer", self.base_learning_rate)
        lr, _ = self.build_lr(net, param_init_net, base_learning_rate=-self.base_learning_rate,
                              policy=self.policy, **self.init_kwargs)
        momentum_data = param_init_net.ConstantFill(param_fp32, str(param) + "_momentum",
                                                    value=0.0)
        self._aux_params.local.append(momentum_data)
        if isinstance(grad, GradientSlice):
            raise ModelConfigError("MultiPrecisionSgd does not support sparse gradients")
        grad_fp32 = net.HalfToFloat(grad, grad + "_fp32")
        net.MomentumSGDUpdate([grad_fp32, momentum_data, lr, param_fp32],
                              [grad_fp32, momentum_data, param_fp32],
                              momentum=self.momentum, nesterov=self.nesterov)
        net.FloatToHalf(param_fp32, param)
        return None


class FP16SgdOptimizer(SgdOptimizer):
    """Momentum SGD with weight decay through FP16/FP32MomentumSGDUpdate."""

    def __init__(self, base_learning_rate: float = 0.1, momentum: float = 0.0,
                 policy: str = "fixed", nesterov: Any = True, weight_decay: float = 0.0001,
                 sparse_dedup_aggregator: Any = None, **kwargs: Any) -> None:
        super().__init__(base_learning_rate=base_learning_rate, policy=policy,
                         momentum=momentum, nesterov=nesterov,
                         sparse_dedup_aggregator=sparse_dedup_aggregator, **kwargs)
        self.weight_decay = weight_decay

    @staticmethod
    def _pick_copies(param_info: ParameterInfo, fp32_update: bool) -> tuple[Any, Any, bool]:
        """``(param, param_fp32, update in fp32)``."""
        if fp32_update or param_info.blob_copy is None:
            return param_info.blob, param_info.blob, True
        if FLOAT in param_info.blob_copy:
            return param_info.blob, param_info.blob_copy[FLOAT], False
        if FLOAT16 in param_info.blob_copy:
            return param_info.blob_copy[FLOAT16], param_info.blob, False
        raise ModelConfigError(
            f"Unrecognized parameter format to be updated by FP16 Optimizer. Parameter: "
            f"{param_info.name}")

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo,
             fp32_update: bool = False) -> None:
        if str(param_info.blob).find("spatbn") != -1:
            fp32_update = True
        param, param_fp32, fp32_flag = self._pick_copies(param_info, fp32_update)
        grad = param_info.grad
        if self.base_learning_rate == 0:
            return
        _check_lr("FP16SgdOptimizer", self.base_learning_rate)
        lr, _ = self.build_lr(net, param_init_net, base_learning_rate=-self.base_learning_rate,
                              policy=self.policy, **self.init_kwargs)
        momentum_fp32 = param_init_net.ConstantFill(param_fp32, str(param) + "_momentum_fp32",
                                                    value=0.0)
        momentum = param_init_net.FloatToHalf(momentum_fp32, str(param) + "_momentum")
        self._aux_params.local.append(momentum)
        if isinstance(grad, GradientSlice):
            raise ModelConfigError("FP16Sgd does not support sparse gradients")
        if not fp32_flag:
            net.FP16MomentumSGDUpdate([grad, momentum, lr, param], [grad, momentum, param],
                                      momentum=self.momentum, nesterov=self.nesterov,
                                      weight_decay=self.weight_decay)
        else:
            net.FP32MomentumSGDUpdate([grad, momentum_fp32, lr, param],
                                      [grad, momentum_fp32, param],
                                      momentum=self.momentum, nesterov=self.nesterov,
                                      weight_decay=self.weight_decay)


class WeightDecayBuilder(Optimizer):
    """``grad += weight_decay * param`` with per-device ``ONE_<t>_<id>``/``wd_<t>_<id>``."""

    def __init__(self, weight_decay: float) -> None:
        # As in Caffe2, no Optimizer.__init__: no instance number is taken (the builder
        # never names blobs after itself) and there are no auxiliary parameters.
        self.weight_decay = weight_decay
        self._lr_multiplier = None
        self._local_lr_multiplier = None
        self._local_lr_multiplier_on_gpu = False

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        dev = current_device()
        one = param_init_net.ConstantFill(
            [], f"ONE_{dev.device_type}_{dev.device_id}", shape=[1], value=1.0)
        wd = param_init_net.ConstantFill(
            [], f"wd_{dev.device_type}_{dev.device_id}", shape=[1], value=self.weight_decay)
        if isinstance(param_info.grad, GradientSlice):
            raise ModelConfigError("Weight decay does not yet support sparse gradients")
        net.WeightedSum([param_info.grad, one, param_info.blob, wd], param_info.grad)
