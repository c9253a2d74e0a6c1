"""The optimizers the final Caffe2 release added: Wngrad, Storm, Adadelta, group-lasso FTRL
and DecayAdagrad.  Blob names, op types and arguments are Caffe2's (``<param>_moment``,
``<param>_first_mo1ment`` with its typo, ...)."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelConfigError
from dpgraph.ir.blob import GradientSlice
from dpgraph.modeling.optimizer.adaptive import FtrlBase
from dpgraph.modeling.optimizer.base import Optimizer, effective_outputs
from dpgraph.modeling.parameter_info import ParameterInfo


class WngradOptimizer(Optimizer):
    """WNGrad: one scalar ``<param>_moment`` b per param; ``w += lr·g/(b+ε)``,
    ``b += Σg²/(b+ε)``."""

    def __init__(self, alpha: float = 1.0, epsilon: float = 1e-9, policy: str = "fixed",
                 sparse_dedup_aggregator: Any = None, engine: str = "",
                 moment_init: float = 100.0, lars: Any = None,
                 output_effective_lr: bool = False,
                 output_effective_lr_and_update: bool = False, **kwargs: Any) -> None:
        super().__init__()
        self.alpha = alpha
        self.epsilon = epsilon
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine
        self.moment_init = moment_init
        self.lars = lars
        self.output_effective_lr = output_effective_lr
        self.output_effective_lr_and_update = output_effective_lr_and_update
        self.init_kwargs = kwargs

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        self._start_local_lr(net, param_init_net, param, grad, self.lars)
        lr, _ = self.build_lr(net, param_init_net, base_learning_rate=self.alpha,
                              policy=self.policy, **self.init_kwargs)
        moment = param_init_net.ConstantFill([], str(param) + "_moment", shape=[1],
                                             value=self.moment_init)
        self._aux_params.local.append(moment)
        if isinstance(grad, GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseWngrad([param, moment, grad.indices, grad.values, lr], [param, moment],
                             epsilon=self.epsilon, engine=self.engine)
            return
        extra = effective_outputs(param, self.output_effective_lr,
                                  self.output_effective_lr_and_update)
        net.Wngrad([param, moment, grad, lr], [param, moment, *extra], epsilon=self.epsilon,
                   engine=self.engine)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class StormOptimizer(Optimizer):
    """STORM: ``<param>_moment`` and the scalar ``<param>_grad_sq_sum``."""

    def __init__(self, lr: float = 0.1, momentum: float = 10.0, beta: float = 0.1,
                 grad_sq_init: float = 0.01, policy: str = "fixed",
                 sparse_dedup_aggregator: Any = None, lars: Any = None,
                 **kwargs: Any) -> None:
        super().__init__()
        self.lr = lr
        self.momentum = momentum
        self.beta = beta
        self.grad_sq_init = grad_sq_init
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.lars = lars
        self.init_kwargs = kwargs

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.lr <= 0:
            return
        self._start_local_lr(net, param_init_net, param, grad, self.lars)
        lr, _ = self.build_lr(net, param_init_net, base_learning_rate=self.lr,
                              policy=self.policy, **self.init_kwargs)
        moment = param_init_net.ConstantFill(param, str(param) + "_moment", value=0.0)
        self._aux_params.local.append(moment)
        grad_sq_sum = param_init_net.ConstantFill([], str(param) + "_grad_sq_sum", shape=[1],
                                                  value=self.grad_sq_init)
        self._aux_params.local.append(grad_sq_sum)
        outputs = [param, moment, grad_sq_sum]
        if isinstance(grad, GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseStorm([param, moment, grad_sq_sum, grad.values, grad.indices, lr],
                            outputs, momentum=self.momentum, beta=self.beta)
        else:
            net.Storm([param, moment, grad_sq_sum, grad, lr], outputs,
                      momentum=self.momentum, beta=self.beta)

    def scale_learning_rate(self, scale: float) -> None:
        self.lr *= scale


class AdadeltaOptimizer(Optimizer):
    """Adadelta: ``<param>_squared_moment`` and ``<param>_squared_moment_update``."""

    def __init__(self, alpha: float = 0.01, epsilon: float = 1e-4, decay: float = 0.95,
                 policy: str = "fixed", sparse_dedup_aggregator: Any = None, engine: str = "",
                 **kwargs: Any) -> None:
        super().__init__()
        self.alpha = alpha
        self.epsilon = epsilon
        self.decay = decay
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, _ = self.build_lr(net, param_init_net, base_learning_rate=self.alpha,
                              policy=self.policy, **self.init_kwargs)
        moment = param_init_net.ConstantFill([param], str(param) + "_squared_moment",
                                             value=0.0)
        moment_update = param_init_net.ConstantFill(
            [param], str(param) + "_squared_moment_update", value=0.0)
        self._aux_params.local.append(moment)
        self._aux_params.local.append(moment_update)
        settings = {"epsilon": self.epsilon, "decay": self.decay, "engine": self.engine}
        outputs = [param, moment, moment_update]
        if isinstance(grad, GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseAdadelta([param, moment, moment_update, grad.indices, grad.values, lr],
                               outputs, **settings)
        else:
            net.Adadelta([param, moment, moment_update, grad, lr], outputs, **settings)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class GFtrlOptimizer(FtrlBase):
    """Group-lasso FTRL (dense only) with state ``<param>_gftrl_nz`` (param shape + [2])."""

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        nz = self._nz_state(param_init_net, param, "_gftrl_nz")
        if isinstance(grad, GradientSlice):
            raise ModelConfigError(
                f"GFtrlOptimizer: {param} has a sparse gradient; group-lasso FTRL is dense "
                "only (use FtrlOptimizer for sparse parameters).")
        net.GFtrl([param, nz, grad], [param, nz], **self._settings())


class DecayAdagradOptimizer(Optimizer):
    """Adagrad with a decayed first moment (``<param>_first_mo1ment``) and bias correction;
    sparse gradients fall back to SparseAdagrad on ``<param>_squared_sum``."""

    def __init__(self, alpha: float = 0.01, beta1: float = 0.0, beta2: float = 0.999,
                 epsilon: float = 0.1, weight_decay: float = 0.0, ema_options: Any = None,
                 bias_correction_first: bool = True, policy: str = "fixed", engine: str = "",
                 **kwargs: Any) -> None:
        super().__init__()
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.weight_decay = weight_decay
        self.bias_correction_first = bias_correction_first
        self.policy = policy
        self.engine = engine
        self.init_kwargs = kwargs
        if ema_options:
            raise ModelConfigError(
                "DecayAdagradOptimizer: ema_options is not supported by dpgraph (it needs "
                "Caffe2's EMA op); drop the option.")

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, iteration = self.build_lr(net, param_init_net, base_learning_rate=self.alpha,
                                      policy=self.policy, **self.init_kwargs)
        if isinstance(grad, GradientSlice):
            squared_sum = param_init_net.ConstantFill([param], str(param) + "_squared_sum",
                                                      value=0.0)
            self._aux_params.local.append(squared_sum)
            net.SparseAdagrad([param, squared_sum, grad.indices, grad.values, lr],
                              [param, squared_sum], epsilon=self.epsilon)
            return
        m1 = param_init_net.ConstantFill([param], str(param) + "_first_mo1ment", value=0.0)
        m2 = param_init_net.ConstantFill([param], str(param) + "_second_moment", value=0.0)
        self._aux_params.shared.append(iteration)
        self._aux_params.local.append(m1)
        self._aux_params.local.append(m2)
        net.DecayAdagrad([param, m1, m2, grad, lr, iteration], [param, m1, m2],
                         beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
                         weight_decay=self.weight_decay,
                         bias_correction_first=self.bias_correction_first)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale
