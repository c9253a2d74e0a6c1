"""Caffe2's ``model_helper``: :class:`ModelHelper` and :func:`ExtractPredictorNet`."""

from __future__ import annotations

import logging
from itertools import chain
from typing import Any

from dpgraph.errors import (
    ExportError,
    ModelConfigError,
    ModelError,
    ModelStateError,
    UnknownOperatorError,
)
from dpgraph.ir import scope
from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.net import Net
from dpgraph.ir.registry import OPERATORS
from dpgraph.modeling.optimizer_context import attach_optimizer
from dpgraph.modeling.parameter_info import ParameterInfo, ParameterTags
from dpgraph.modeling.parameter_sharing import parameter_sharing_context
from dpgraph.proto import caffe2_pb2

logger = logging.getLogger("dpgraph.modeling.model_helper")

#: Ops ModelHelper creates without a warning through attribute access.
_known_working_ops = [
    "Accuracy", "Adam", "Add", "Adagrad", "SparseAdagrad", "Adadelta", "SparseAdadelta",
    "AveragedLoss", "Cast", "Checkpoint", "ConstantFill", "Copy", "CopyGPUToCPU",
    "CopyCPUToGPU", "DequeueBlobs", "EnsureCPUOutput", "ExpandDims", "Flatten", "FlattenToVec",
    "LabelCrossEntropy", "LearningRate", "MakeTwoClass", "MatMul", "NCCLAllreduce", "NHWC2NCHW",
    "PackSegments", "Print", "PRelu", "ReduceFrontSum", "Scale", "ScatterWeightedSum", "Sigmoid",
    "SortedSegmentSum", "Snapshot", "Softmax", "SoftmaxWithLoss", "SquaredL2Distance", "Squeeze",
    "StopGradient", "Summarize", "Tanh", "Transpose", "UnpackSegments", "WeightedSum",
    "YellowFin",
]

_DEFAULT_ARG_SCOPE = {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": False}


class ModelHelper:
    """A training model: ``param_init_net`` builds the parameters, ``net`` computes.

    Args:
        name: model name (default ``"model"``); nets are ``name`` and ``name + '_init'``.
        init_params: brew helpers emit init ops (else parameters are external).
        allow_not_known_ops: attribute access to ops outside the known list only warns.
        skip_sparse_optim: :meth:`GetOptimizationParamInfo` skips sparse gradients.
        param_model: share this model's init net and parameter bookkeeping.
        arg_scope: defaults overriding ``{'order': 'NCHW', 'use_cudnn': True,
            'cudnn_exhaustive_search': False}`` for brew helpers.
    """

    def __init__(self, name: str | None = None, init_params: bool = True,
                 allow_not_known_ops: bool = True, skip_sparse_optim: bool = False,
                 param_model: ModelHelper | None = None,
                 arg_scope: dict[str, Any] | None = None) -> None:
        self.name = name or "model"
        self.net = Net(self.name)
        self.param_init_net: Net
        self.param_to_grad: dict[Any, Any]
        self.params: list[BlobReference]
        self._parameters_info: dict[Any, ParameterInfo]
        self._computed_params: list[BlobReference]
        if param_model is not None:
            self.param_init_net = param_model.param_init_net
            self.param_to_grad = param_model.param_to_grad
            self.params = param_model.params
            self._parameters_info = param_model._parameters_info
            self._computed_params = param_model._computed_params
        else:
            self.param_init_net = Net(self.name + "_init")
            self.param_to_grad = {}
            self.params = []
            self._parameters_info = {}
            self._computed_params = []
        self._param_info_deprecated: list[ParameterInfo] = []
        self._devices: list[Any] = []
        self.gradient_ops_added = False
        self.init_params = init_params
        self.allow_not_known_ops = allow_not_known_ops
        self.skip_sparse_optim = skip_sparse_optim
        self.weights: list[BlobReference] = []
        self.biases: list[BlobReference] = []
        self._arg_scope = dict(_DEFAULT_ARG_SCOPE)
        if arg_scope is not None:
            self._arg_scope.update(arg_scope)

    @property
    def arg_scope(self) -> dict[str, Any]:
        return self._arg_scope

    def get_name(self) -> str:
        return self.name

    # --- parameters --------------------------------------------------------------------
    def _infer_param_shape(self, param: Any) -> list[int] | None:
        for op in self.param_init_net.Proto().op:
            if str(param) in op.output:
                for arg in op.arg:
                    if arg.name == "shape":
                        return list(arg.ints)
        return None

    @staticmethod
    def _normalize_tags(tags: Any) -> set[str]:
        tags = tags or []
        return set(tags) if isinstance(tags, (list, tuple, set)) else {tags}

    def create_param(self, param_name: Any, shape: Any, initializer: Any,
                     tags: Any = None) -> BlobReference:
        """Create (or return the existing) parameter ``param_name`` with ``initializer``.

        A str name gets the current name scope (after ParameterSharing overrides); a
        BlobReference is used verbatim.  Tags pick an optimizer from UseOptimizer blocks.
        Re-creating an existing parameter with another shape raises ModelConfigError.
        """
        if isinstance(param_name, BlobReference):
            name = str(param_name)
        elif isinstance(param_name, str):
            name = parameter_sharing_context.get_parameter_name(param_name)
        else:
            raise ModelError(
                f"Unsupported type for param_name: {type(param_name).__name__}; "
                "use a str or BlobReference.")
        if name in self._parameters_info:
            existing = self._parameters_info[name]
            if existing.shape != shape:
                raise ModelConfigError(
                    f"Parameter {name} already exists with shape {existing.shape}; it cannot "
                    f"be re-created with shape {shape}. Use another blob_out name.")
            return existing.blob
        if not callable(getattr(initializer, "create_param", None)):
            raise ModelConfigError(
                f"create_param({name!r}): the initializer must be an Initializer object "
                f"(e.g. initializers.Initializer('XavierFill')), got "
                f"{type(initializer).__name__} {initializer!r}; convert an (op_name, kwargs) "
                "tuple with initializers.update_initializer(None, tuple, None).")
        param_info = initializer.create_param(
            param_name=BlobReference(name), init_net=self.param_init_net, shape=shape)
        attach_optimizer(param_info, self._normalize_tags(tags))
        self._parameters_info[name] = param_info
        self.AddParameter(param_info.blob, tags)
        return param_info.blob

    def get_param_info(self, param: Any) -> ParameterInfo | None:
        if not isinstance(param, BlobReference):
            raise ModelError(f"Param {param} is not a BlobReference")
        return self._parameters_info.get(param)

    def add_param_DEPRECATED(self, param: Any, key: Any = None, shape: Any = None,
                             length: int | None = None) -> None:
        """Old-style registration of an already-created parameter."""
        if not isinstance(param, BlobReference):
            raise ModelError(f"Param {param} must be a BlobReference!")
        self._update_param_info_deprecated()
        self.AddParameter(param)
        info = ParameterInfo(param_id=len(self._param_info_deprecated), param=param,
                             key=key, shape=shape, length=length)
        self._param_info_deprecated.append(info)

    def _update_param_info_deprecated(self) -> None:
        for param in self.params[len(self._param_info_deprecated):]:
            self._param_info_deprecated.append(ParameterInfo(
                param_id=len(self._param_info_deprecated), param=param,
                shape=self._infer_param_shape(param)))
        for info in self._param_info_deprecated:
            info.grad = self.param_to_grad.get(info.name)

    def GetParamInfo(self) -> list[ParameterInfo]:  # noqa: N802 (Caffe2 name)
        """Deprecated: ParameterInfo of every param, in order."""
        self._update_param_info_deprecated()
        return self._param_info_deprecated

    def AddParameter(self, param: Any, tags: Any = None) -> None:
        """Register ``param``: COMPUTED_PARAM goes to computed params, else to params;
        WEIGHT / BIAS also add it to ``weights`` / ``biases``."""
        if not isinstance(param, BlobReference):
            raise ModelError(
                f"AddParameter needs a BlobReference, got {type(param).__name__} {param!r}.")
        tags = self._normalize_tags(tags)
        if ParameterTags.COMPUTED_PARAM in tags:
            self._computed_params.append(param)
        else:
            self.params.append(param)
        if ParameterTags.WEIGHT in tags:
            self.weights.append(param)
        if ParameterTags.BIAS in tags:
            self.biases.append(param)

    @staticmethod
    def _NormalizeNamescope(namescope: str | None) -> str:
        if namescope is None:
            return scope.CurrentNameScope()
        if namescope == "" or namescope.endswith(scope._NAMESCOPE_SEPARATOR):
            return namescope
        return namescope + scope._NAMESCOPE_SEPARATOR

    @staticmethod
    def _filter(blobs: list[BlobReference], namescope: str) -> list[BlobReference]:
        if namescope == "":
            return blobs[:]
        return [p for p in blobs if p.GetNameScope().startswith(namescope)]

    def GetParams(self, namescope: str | None = None, top_scope: bool = False
                  ) -> list[BlobReference]:
        """Params under ``namescope`` (default: the current name scope; ``''``: all)."""
        return self._filter(self.params, self._NormalizeNamescope(namescope))

    def GetComputedParams(self, namescope: str | None = None) -> list[BlobReference]:
        return self._filter(self._computed_params, self._NormalizeNamescope(namescope))

    def GetAllParams(self, namescope: str | None = None) -> list[BlobReference]:
        return self.GetParams(namescope) + self.GetComputedParams(namescope)

    # --- nets --------------------------------------------------------------------------
    def Proto(self) -> caffe2_pb2.NetDef:
        return self.net.Proto()

    def InitProto(self) -> caffe2_pb2.NetDef:
        return self.param_init_net.Proto()

    def RunAllOnGPU(self, *args: Any, **kwargs: Any) -> None:
        self.param_init_net.RunAllOnGPU(*args, **kwargs)
        self.net.RunAllOnGPU(*args, **kwargs)

    def CreateDB(self, blob_out: Any, db: str, db_type: str, **kwargs: Any) -> Any:
        """Add ``CreateDB`` to ``param_init_net``; returns the DB reader blob."""
        return self.param_init_net.CreateDB([], blob_out, db=db, db_type=db_type, **kwargs)

    def TensorProtosDBInput(self, unused_blob_in: Any, blob_out: Any, batch_size: int,
                            db: str, db_type: str, **kwargs: Any) -> Any:
        if len(unused_blob_in) != 0:
            raise ModelError(
                "You cannot pass reader to model_helper.TensorProtosDBInput. Use "
                "model.net.TensorProtosDBInput instead to create the op.")
        from dpgraph.modeling.brew.db_input import db_input

        return db_input(self, blob_out, batch_size, db, db_type, **kwargs)  # type: ignore[call-arg]

    def GetDevices(self) -> list[Any]:
        if len(self._devices) == 0:
            raise ModelError("Use data_parallel_model to run model on multiple GPUs.")
        return self._devices

    # --- gradients ---------------------------------------------------------------------
    def AddGradientOperators(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        """Add the backward pass (once only); fill ``param_to_grad`` and each param's grad."""
        if self.gradient_ops_added:
            raise ModelStateError(
                f"You cannot run AddGradientOperators twice: model {self.name!r} already has "
                f"its backward pass (data_parallel_model.Parallelize adds it too); build a new "
                f"ModelHelper for another training graph.")
        self.Validate()
        self.gradient_ops_added = True
        try:
            grad_map = self.net.AddGradientOperators(*args, **kwargs)
        except BaseException:
            # the net is left unchanged on failure; so is the model, so a fixed call can retry
            self.gradient_ops_added = False
            raise
        self.record_gradients(grad_map)
        return self.grad_map

    def record_gradients(self, grad_map: dict[Any, Any]) -> None:
        """Remember the backward pass's ``grad_map``: fill ``param_to_grad`` and each
        param's ``ParameterInfo.grad`` (after the gradient ops were added to the net)."""
        self.grad_map: dict[Any, Any] = grad_map
        self.param_to_grad = self.get_param_to_grad(self.params)
        for param, grad in self.param_to_grad.items():
            param_info = self.get_param_info(param)
            if param_info:
                param_info.grad = grad
            else:
                self._parameters_info[param] = ParameterInfo(
                    param_id=None, param=param, grad=grad)

    def get_param_to_grad(self, params: list[Any]) -> dict[Any, Any]:
        """``{param: gradient}`` for the params that have a gradient."""
        if not self.gradient_ops_added:
            raise ModelStateError("You need to run AddGradientOperators first.")
        return {p: self.grad_map[str(p)] for p in params if str(p) in self.grad_map}

    def GetOptimizationParamInfo(self, params: list[Any] | None = None) -> list[Any]:
        """ParameterInfo of every param with a gradient (sparse ones skipped when
        ``skip_sparse_optim``)."""
        if not self.gradient_ops_added:
            raise ModelStateError("Need to call AddGradientOperators first")
        param_to_grad = self.get_param_to_grad(params) if params else self.param_to_grad
        return [
            self.get_param_info(param) for param, grad in param_to_grad.items()
            if not self.skip_sparse_optim or not isinstance(grad, GradientSlice)
        ]

    def _Validate(self) -> list[str]:
        """The names of params registered more than once (sorted)."""
        names = sorted(str(p) for p in self.params)
        dupes: list[str] = []
        for previous, current in zip(names, names[1:]):
            if previous == current and current not in dupes:
                dupes.append(current)
        return dupes

    def Validate(self) -> None:
        dupes = self._Validate()
        if dupes:
            raise ModelError(
                f"Duplicate params: {dupes}; each parameter may be added to the model once.")

    # --- complete net round trip -------------------------------------------------------
    def GetCompleteNet(self) -> Net:
        """``param_init_net`` + ``net`` in one net; init ops are tagged in debug_info."""
        new_net = self.param_init_net.Clone(self.name + "_complete_net", keep_schema=True)
        for op in new_net.Proto().op:
            op.debug_info = op.debug_info + "/param_init_net"
        new_net.AppendNet(self.net)
        if self.net.Proto().HasField("type"):
            new_net.Proto().type = self.net.Proto().type
        return new_net

    def ConstructInitTrainNetfromNet(self, net: Net) -> None:
        """Split a :meth:`GetCompleteNet` result back into ``param_init_net`` and ``net``."""
        param_op_mask, train_op_mask = [], []
        for index, op in enumerate(net.Proto().op):
            if op.debug_info.endswith("/param_init_net"):
                param_op_mask.append(index)
            else:
                train_op_mask.append(index)
        self.param_init_net = net.Clone(
            net.Name() + "/generated_param_init_net", keep_schema=True,
            op_id_mask=param_op_mask, update_external_list=True)
        self.net = net.Clone(
            net.Name() + "/generated_net", keep_schema=True,
            op_id_mask=train_op_mask, update_external_list=True)

    # --- op creation -------------------------------------------------------------------
    def __getattr__(self, op_type: str) -> Any:
        """``model.<OpType>(...)`` adds the op to ``model.net``."""
        if op_type.startswith("__") or op_type.startswith("_"):
            raise AttributeError(op_type)
        OPERATORS.require_method(op_type)
        if op_type not in _known_working_ops:
            if not self.allow_not_known_ops:
                raise UnknownOperatorError(f"Operator {op_type} is not known to be safe")
            logger.warning(
                "You are creating an op that the ModelHelper does not recognize: %s.", op_type)
        return self.net.__getattr__(op_type)

    def __dir__(self) -> list[str]:
        return sorted(set(chain(dir(type(self)), self.__dict__.keys(), _known_working_ops)))


# --- predictor extraction -------------------------------------------------------------------
def _rename_list(proto_list: Any, renames: dict[str, str]) -> None:
    new_list = [renames.get(b, b) for b in proto_list]
    del proto_list[:]
    proto_list.extend(new_list)


def _validate_predictor_op(op: caffe2_pb2.OperatorDef) -> None:
    for arg in op.arg:
        if arg.name == "is_test" and arg.i == 0:
            raise ExportError(
                "An operator had is_test=0, did you try to extract a predictor from a train "
                f"model (instead of test model)? Op was: {op.type} {list(op.input)} -> "
                f"{list(op.output)}. Build the model again with is_test=1.")


def _op_range(ops: list[caffe2_pb2.OperatorDef], input_blobs: set[str],
              output_blobs: set[str]) -> tuple[int, int]:
    firsts = [j for j, op in enumerate(ops)
              if input_blobs.intersection(op.input) and op.type != "StopGradient"]
    if not firsts:
        raise ExportError(f"No ops with input={sorted(input_blobs)}")
    lasts = [j for j, op in enumerate(ops) if output_blobs.intersection(op.output)]
    if not lasts:
        raise ExportError(f"No ops with output={sorted(output_blobs)}")
    return min(firsts), max(lasts)


def _prepare_recurrent(op: caffe2_pb2.OperatorDef, renames: dict[str, str], device: Any,
                       external_inputs: set[str], orig_external_inputs: set[str]) -> None:
    for arg in op.arg:
        if arg.name == "backward_step_net":
            arg.ClearField("n")
        elif arg.name == "step_net":
            for step_op in arg.n.op:
                _rename_list(step_op.input, renames)
                _rename_list(step_op.output, renames)
                if device is not None:
                    step_op.device_option.device_type = device.device_type
                    step_op.device_option.device_id = device.device_id
            _rename_list(arg.n.external_input, renames)
            _rename_list(arg.n.external_output, renames)
            external_inputs.update(set(arg.n.external_input) & orig_external_inputs)


def ExtractPredictorNet(net_proto: caffe2_pb2.NetDef, input_blobs: Any, output_blobs: Any,
                        device: caffe2_pb2.DeviceOption | None = None,
                        renames: dict[str, str] | None = None,
                        disabled_inputs: Any = None) -> tuple[Net, list[str]]:
    """Cut the inference part out of a training net.

    Keeps the ops between the first consumer of an input and the last producer of an
    output whose inputs are all known (so data ops and gradient/optimizer ops vanish).
    Returns ``(predict_net, parameter blob names)``.  With ``device``, the kept ops of
    ``net_proto`` are moved to it in place, as Caffe2 does.
    """
    predict_net = Net(net_proto.name + "_predict")
    predict_proto = predict_net.Proto()
    orig_external_inputs = set(net_proto.external_input)
    orig_external_outputs = set(net_proto.external_output)
    input_set = {str(b) for b in input_blobs}
    output_set = {str(b) for b in output_blobs}
    known_blobs = orig_external_inputs | input_set
    external_inputs, external_outputs = set(input_set), set(output_set)
    renames = {str(k): str(v) for k, v in (renames or {}).items()}
    if disabled_inputs is not None:
        known_blobs -= {str(b) for b in disabled_inputs}
    ops = list(net_proto.op)
    first, last = _op_range(ops, input_set, output_set)
    for op in ops[first:last + 1]:
        if not known_blobs.issuperset(op.input):
            logger.debug("Op %s had unknown inputs: %s", op.type,
                         set(op.input) - known_blobs)
            continue
        if op.type == "RecurrentNetwork":
            _prepare_recurrent(op, renames, device, external_inputs, orig_external_inputs)
        if device is not None:
            op.device_option.device_type = device.device_type
            op.device_option.device_id = device.device_id
        _validate_predictor_op(op)
        predict_proto.op.extend([op])
        known_blobs.update(op.output)
        external_inputs.update(set(op.input) & orig_external_inputs)
        external_outputs.update(set(op.output) & orig_external_outputs)
    predict_proto.external_input.extend(sorted(external_inputs))
    predict_proto.external_output.extend(sorted(external_outputs))
    _rename_list(predict_proto.external_input, renames)
    _rename_list(predict_proto.external_output, renames)
    renamed_inputs = {renames.get(b, b) for b in input_set}
    for op in predict_proto.op:
        _rename_list(op.input, renames)
        _rename_list(op.output, renames)
    return predict_net, sorted(set(predict_proto.external_input) - renamed_inputs)
