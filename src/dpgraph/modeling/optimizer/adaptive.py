"""Adaptive optimizers: Adagrad (dense, sparse, row-wise), Adam, RmsProp, FTRL, YellowFin."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import DpgraphError, ModelConfigError
from dpgraph.ir.blob import GradientSlice
from dpgraph.modeling.optimizer.base import (
    FP16_ENGINES,
    BuildUniqueMutexIter,
    Optimizer,
    current_device,
    effective_outputs,
)
from dpgraph.modeling.parameter_info import ParameterInfo
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api

core_types = caffe2_pb2.TensorProto


def _static_rows(param_init_net: Any, param: Any) -> int | None:
    """The first dimension of ``param`` from the ``shape`` argument of its fill op."""
    for op in reversed(param_init_net.Proto().op):
        if str(param) in op.output:
            for arg in op.arg:
                if arg.name == "shape" and arg.ints:
                    return int(arg.ints[0])
            return None
    return None


def _row_wise_state(param_init_net: Any, param: Any, name: str, **fill: Any) -> Any:
    """A [rows] zero blob named ``name`` (``fill``: e.g. ``dtype``, ``value``); rows from
    static shapes, else Shape/Slice."""
    fill.setdefault("value", 0.0)
    rows = _static_rows(param_init_net, param)
    if rows is not None:
        return param_init_net.ConstantFill([], name, shape=[rows], **fill)
    shape = param_init_net.Shape(param, str(param) + "_shape")
    num_rows = param_init_net.Slice([shape], str(shape) + "_numrows", starts=[0], ends=[1])
    return param_init_net.ConstantFill(num_rows, name, input_as_shape=1, **fill)


def _inferred_shape(param_init_net: Any, param: Any) -> list[int] | None:
    """The param's shape from shape inference over the init net (None when unknown)."""
    try:
        shapes, _ = api.InferShapesAndTypes([param_init_net])
    except DpgraphError:
        return None
    shape = shapes.get(str(param))
    return None if shape is None else [int(d) for d in shape]


class AdagradOptimizer(Optimizer):
    """Adagrad: ``h = decay·h + g²; param += lr·g/(√h + ε)`` (lr negative); sparse and
    row-wise forms, weight decay (not for 1-D params), LARS, effective-lr outputs and the
    row-wise update counter of the final Caffe2."""

    def __init__(self, alpha: float = 0.01, epsilon: float = 1e-4, decay: float = 1,
                 weight_decay: float = 0.0, policy: str = "fixed",
                 sparse_dedup_aggregator: Any = None, rowWise: bool = False, engine: str = "",
                 lars: Any = None, output_effective_lr: bool = False,
                 output_effective_lr_and_update: bool = False, pruning_options: Any = None,
                 swa_options: Any = None, ema_options: Any = None, weight_scale: Any = None,
                 counter_halflife: int = -1, use_dedicated_lr_iteration_counter: bool = False,
                 **kwargs: Any) -> None:
        super().__init__()
        self.alpha = alpha
        self.epsilon = epsilon
        self.decay = decay
        self.weight_decay = float(weight_decay)
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.rowWise = rowWise
        self.engine = engine
        self.lars = lars
        self.output_effective_lr = output_effective_lr
        self.output_effective_lr_and_update = output_effective_lr_and_update
        self.counter_halflife = counter_halflife
        self.init_kwargs = kwargs
        self.use_dedicated_lr_iteration_counter = use_dedicated_lr_iteration_counter
        for name, option in (("pruning_options", pruning_options),
                             ("swa_options", swa_options), ("ema_options", ema_options),
                             ("weight_scale", weight_scale)):
            if option:
                raise ModelConfigError(
                    f"AdagradOptimizer: {name} is not supported by dpgraph (it needs "
                    "Caffe2's MaskedAdagrad / SWA / EMA / WeightScale ops); drop the option.")

    def _state(self, param_init_net: Any, param: Any, shape: list[int] | None) -> Any:
        if self.rowWise:
            if shape is not None:
                return param_init_net.ConstantFill([], str(param) + "_avg_squared_sum",
                                                   shape=[shape[0]], value=0.0)
            return _row_wise_state(param_init_net, param, str(param) + "_avg_squared_sum")
        if self.engine in FP16_ENGINES and shape is not None:
            return param_init_net.Float16ConstantFill([], str(param) + "_squared_sum",
                                                      value=0.0, shape=shape)
        return param_init_net.ConstantFill([param], str(param) + "_squared_sum", value=0.0)

    def _counter_state(self, param_init_net: Any, param: Any, shape: list[int] | None
                       ) -> tuple[Any, Any]:
        rows = shape[0] if shape else _static_rows(param_init_net, param)
        if rows is None:
            raise ModelConfigError(
                f"AdagradOptimizer(counter_halflife=...) needs the row count of {param}; "
                "create it with a fill op that has a static shape.")
        counter = param_init_net.ConstantFill([], str(param) + "_update_counter",
                                              shape=[rows], value=0.0,
                                              dtype=core_types.DOUBLE)
        prev_iter = param_init_net.ConstantFill([], str(param) + "_prev_update_iter",
                                                shape=[rows], value=0,
                                                dtype=core_types.INT64)
        return counter, prev_iter

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        sparse = isinstance(grad, GradientSlice)
        self._start_local_lr(net, param_init_net, param, grad, self.lars)
        lr, lr_iteration = self.build_lr(net, param_init_net, base_learning_rate=self.alpha,
                                         policy=self.policy, **self.init_kwargs)
        iteration = (self.build_non_lr_iter(net, param_init_net)
                     if self._use_dedicated_lr_iteration_counter else lr_iteration)
        if self.counter_halflife > 0:
            self._aux_params.shared.append(iteration)
        shape = _inferred_shape(param_init_net, param)
        weight_decay = 0.0 if shape is not None and len(shape) == 1 else self.weight_decay
        squared_sum = self._state(param_init_net, param, shape)
        self._aux_params.local.append(squared_sum)
        wd_args = {"weight_decay": weight_decay} if weight_decay > 0 else {}
        if not sparse:
            if self.rowWise:
                raise ModelConfigError(
                    "If SparseAdagrad with rowWise=True, gradient must be a gradientslice. "
                    "Please ensure that rowWise is not enabled for the dense Adagrad "
                    "optimizer.")
            extra = effective_outputs(param, self.output_effective_lr,
                                      self.output_effective_lr_and_update)
            net.Adagrad([param, squared_sum, grad, lr], [param, squared_sum, *extra],
                        epsilon=self.epsilon, decay=float(self.decay), **wd_args,
                        engine=self.engine)
            return
        if self.decay != 1.0:
            raise ModelConfigError(
                "Decay is not implemented for SparseAdagrad and must be set to 1")
        grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
        if self.counter_halflife > 0:
            counter, prev_iter = self._counter_state(param_init_net, param, shape)
            self._aux_params.local.extend([counter, prev_iter])
            net.RowWiseCounter([prev_iter, counter, grad.indices, iteration],
                               [prev_iter, counter], counter_halflife=self.counter_halflife)
        op = "RowWiseSparseAdagrad" if self.rowWise else "SparseAdagrad"
        net.__getattr__(op)([param, squared_sum, grad.indices, grad.values, lr],
                            [param, squared_sum], epsilon=self.epsilon, **wd_args,
                            engine=self.engine)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class AdamOptimizer(Optimizer):
    """Adam with ``<param>_first_moment`` / ``<param>_second_moment`` (row-wise:
    ``<param>_avg_second_moment``), RAdam for sparse gradients, learning-rate adaption."""

    def __init__(self, alpha: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, policy: str = "fixed", use_lr_adaption: bool = False,
                 lr_alpha: float = 0.01, normalized_lr_adaption: bool = True,
                 sparse_dedup_aggregator: Any = None, rowWise: bool = False, engine: str = "",
                 enableRAdam: bool = False, use_smart_decay: bool = False,
                 **kwargs: Any) -> None:
        super().__init__()
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.policy = policy
        self.use_lr_adaption = use_lr_adaption
        self.lr_alpha = lr_alpha
        self.normalized_lr_adaption = normalized_lr_adaption
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.rowWise = rowWise
        self.engine = engine
        self.enableRAdam = enableRAdam
        self.use_smart_decay = use_smart_decay
        if use_smart_decay and (rowWise or enableRAdam or use_lr_adaption):
            raise ModelConfigError(
                "AdamOptimizer: use_smart_decay works with plain sparse Adam only; drop "
                "rowWise, enableRAdam and use_lr_adaption")
        self.init_kwargs = kwargs

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, iteration = self.build_lr(net, param_init_net, base_learning_rate=self.alpha,
                                      policy=self.policy, **self.init_kwargs)
        m1 = param_init_net.ConstantFill([param], str(param) + "_first_moment", value=0.0)
        if self.rowWise:
            shape = _inferred_shape(param_init_net, param)
            if shape is not None:
                m2 = param_init_net.ConstantFill([], str(param) + "_avg_second_moment",
                                                 shape=[shape[0]], value=0.0)
            else:
                m2 = _row_wise_state(param_init_net, param,
                                     str(param) + "_avg_second_moment")
        else:
            m2 = param_init_net.ConstantFill([param], str(param) + "_second_moment", value=0.0)
        self._aux_params.shared.append(iteration)
        self._aux_params.local.append(m1)
        self._aux_params.local.append(m2)
        last_seen = self._last_seen(param_init_net, param) if self.use_smart_decay else None
        if last_seen is not None:
            self._aux_params.local.append(last_seen)
        sparse = isinstance(grad, GradientSlice)
        if self.rowWise and not sparse:
            raise ModelConfigError(
                "If SparseAdam with rowWise=True, gradient must be a gradientslice. Please "
                "ensure that rowWise is not enabled for the dense Adam optimizer.")
        outputs = [param, m1, m2]
        if self.use_lr_adaption:
            outputs.append(str(param) + "_effective_grad")
        settings = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}
        if sparse:
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            if self.rowWise:
                if self.enableRAdam:
                    raise ModelConfigError("Currently, RowWiseSparseAdam is not supported "
                                           "by RAdam!")
                net.RowWiseSparseAdam([param, m1, m2, grad.indices, grad.values, lr,
                                       iteration], outputs, **settings)
            elif last_seen is not None:
                net.SmartDecaySparseAdam(
                    [param, m1, m2, last_seen, grad.indices, grad.values, lr, iteration],
                    [*outputs, last_seen], **settings)
            else:
                net.SparseAdam([param, m1, m2, grad.indices, grad.values, lr, iteration],
                               outputs, enableRAdam=self.enableRAdam, **settings)
        else:
            net.Adam([param, m1, m2, grad, lr, iteration], outputs, **settings)
        if self.use_lr_adaption:
            net.LearningRateAdaption(
                [lr, grad.values if sparse else grad, outputs[3]], [lr],
                lr_alpha=self.lr_alpha, normalized_lr_adaption=self.normalized_lr_adaption)

    @staticmethod
    def _last_seen(param_init_net: Any, param: Any) -> Any:
        """``<param>_last_seen``: int64 zeros, one per row (the iteration each row was last
        updated at, for SmartDecaySparseAdam); a local aux."""
        return _row_wise_state(param_init_net, param, str(param) + "_last_seen", value=0,
                               dtype=caffe2_pb2.TensorProto.INT64)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class RmsPropOptimizer(Optimizer):
    """RmsProp on ``<param>_mean_squares``, then MomentumSGDUpdate with ``<param>_momentum``."""

    def __init__(self, alpha: float = 0.01, decay: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-5, policy: str = "fixed", engine: str = "",
                 **kwargs: Any) -> None:
        super().__init__()
        self.alpha = alpha
        self.decay = decay
        self.momentum = momentum
        self.epsilon = epsilon
        self.policy = policy
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            raise ModelConfigError(f"RmsPropOptimizer: alpha must be positive, got {self.alpha}")
        if isinstance(grad, GradientSlice):
            raise ModelConfigError("RmsPropOptimizer doesn't support sparse gradients")
        dev = current_device()
        one = param_init_net.ConstantFill(
            [], f"ONE_{dev.device_type}_{dev.device_id}", shape=[1], value=1.0)
        lr, _ = self.build_lr(net, param_init_net, base_learning_rate=-self.alpha,
                              policy=self.policy, **self.init_kwargs)
        # Caffe2 passes ``values`` (not ``value``) here; the fills are zeros either way.
        grad_o = param_init_net.ConstantFill([param], str(param) + "_grad_o", values=0.0)
        ms = param_init_net.ConstantFill([param], str(param) + "_mean_squares", values=0.0)
        mom = param_init_net.ConstantFill([param], str(param) + "_momentum", values=0.0)
        self._aux_params.local.append(ms)
        self._aux_params.local.append(mom)
        net.RmsProp([grad, ms, mom, one], [grad_o, ms, mom], decay=self.decay,
                    momentum=self.momentum, epsilon=self.epsilon, engine=self.engine)
        net.MomentumSGDUpdate([grad_o, mom, lr, param], [grad_o, mom, param])

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class FtrlBase(Optimizer):
    """The settings, ``<param>_*nz`` state and lr scaling FTRL and group-lasso FTRL share
    (each stays its own Optimizer subclass, as in Caffe2)."""

    def __init__(self, alpha: float = 0.01, beta: float = 1e-4, lambda1: float = 0,
                 lambda2: float = 0, sparse_dedup_aggregator: Any = None,
                 engine: str = "") -> None:
        super().__init__()
        self.alpha = alpha
        self.beta = beta
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.engine = engine

    def _nz_state(self, param_init_net: Any, param: Any, suffix: str) -> Any:
        """The zero ``<param><suffix>`` blob of shape param + [2] (a local aux param)."""
        nz = param_init_net.ConstantFill([param], str(param) + suffix, extra_shape=[2],
                                         value=0.0)
        self._aux_params.local.append(nz)
        return nz

    def _settings(self) -> dict[str, Any]:
        return {"engine": self.engine, "alpha": self.alpha, "beta": self.beta,
                "lambda1": self.lambda1, "lambda2": self.lambda2}

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale


class FtrlOptimizer(FtrlBase):
    """FTRL-proximal with state ``<param>_ftrl_nz`` (param shape + [2])."""

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        nz = self._nz_state(param_init_net, param, "_ftrl_nz")
        settings = self._settings()
        if isinstance(grad, GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseFtrl([param, nz, grad.indices, grad.values], [param, nz], **settings)
        else:
            net.Ftrl([param, nz, grad], [param, nz], **settings)


class YellowFinOptimizer(Optimizer):
    """YellowFin (auto-tuned momentum SGD) with per-param state blobs; the ``YellowFin`` op
    itself is not implemented by dpgraph's kernels, so running the graph needs one."""

    SCALARS_MEMORY_SIZE = 5

    def __init__(self, alpha: float = 0.1, mu: float = 0.0, beta: float = 0.999,
                 curv_win_width: int = 20, zero_debias: bool = True,
                 epsilon: float = 0.1 ** 6, policy: str = "fixed",
                 sparse_dedup_aggregator: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.alpha = alpha
        self.mu = mu
        self.beta = beta
        self.curv_win_width = curv_win_width
        self.zero_debias = zero_debias
        self.epsilon = epsilon
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.init_kwargs = kwargs

    def _state(self, param_init_net: Any, param: Any) -> list[Any]:
        """``[param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars_memory]``."""
        def like(suffix: str) -> Any:
            return param_init_net.ConstantFill([param], param + suffix, value=0.0)

        def sized(suffix: str, size: int, value: float) -> Any:
            return param_init_net.ConstantFill([], param + suffix, shape=[size], value=value)

        moment = like("_moment")
        curv_win = sized("_curv_win", self.curv_win_width, 0.0)
        g_avg, g2_avg = like("_g_avg"), like("_g2_avg")
        lr_avg, mu_avg = sized("_lr_avg", 1, self.alpha), sized("_mu_avg", 1, self.mu)
        scalars = sized("_scalars_memory", self.SCALARS_MEMORY_SIZE, 0.0)
        return [param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars]

    def _run(self, net: Any, param_init_net: Any, param_info: ParameterInfo) -> None:
        param, grad = param_info.blob, param_info.grad
        state = self._state(param_init_net, param)
        if self.alpha <= 0:
            raise ModelConfigError(f"YellowFinOptimizer: alpha must be positive, got "
                                   f"{self.alpha}")
        if isinstance(grad, GradientSlice):
            raise ModelConfigError("YellowFin does not support sparse gradients")
        iteration = BuildUniqueMutexIter(param_init_net, net, iter_val=0)
        self._aux_params.shared.append(iteration)
        self._aux_params.local.extend(state[1:])
        net.YellowFin(state + [grad, iteration], state, beta=self.beta, epsilon=self.epsilon,
                      curv_win_width=self.curv_win_width, zero_debias=self.zero_debias)

    def scale_learning_rate(self, scale: float) -> None:
        self.alpha *= scale
