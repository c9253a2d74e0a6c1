"""Parameter initialisers: Caffe2's ``modeling.initializers``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpgraph.errors import ModelConfigError, ModelError
from dpgraph.ir.blob import BlobReference, ScopedBlobReference
from dpgraph.modeling.parameter_info import ParameterInfo
from dpgraph.proto import caffe2_pb2

FLOAT = caffe2_pb2.TensorProto.FLOAT
FLOAT16 = caffe2_pb2.TensorProto.FLOAT16


class Initializer:
    """Creates a parameter with one fill op: ``init_net.<operator_name>([], name, shape=...)``."""

    def __init__(self, operator_name: str | None = None, **kwargs: Any) -> None:
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def update(self, operator_name: str, kwargs: dict[str, Any]) -> None:
        if self.operator_name is not None:
            raise ModelError("Operator name overwrites are not allowed")
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def _fill(self, init_net: Any, name: Any, shape: Any) -> BlobReference:
        if self.operator_name is None:
            raise ModelError(
                f"Initializer for {name} has no fill operator; pass e.g. "
                "Initializer('XavierFill') or an (op_name, kwargs) tuple."
            )
        return init_net.__getattr__(self.operator_name)(
            [], name, shape=shape, **self.operator_kwargs)

    def create_param(self, param_name: Any, init_net: Any, shape: Any) -> ParameterInfo:
        param = self._fill(init_net, param_name, shape)
        return ParameterInfo(param_id=None, param=param, shape=shape)


class ExternalInitializer:
    """No init op: the parameter is expected to be fed from outside."""

    def create_param(self, param_name: Any, init_net: Any, shape: Any) -> ParameterInfo:
        if isinstance(param_name, BlobReference):
            param = BlobReference(str(param_name), init_net)
        elif isinstance(param_name, str):
            param = ScopedBlobReference(param_name, init_net)
        else:
            raise ModelError(
                f"Unsupported type for param_name: {type(param_name).__name__}; "
                "use a str or BlobReference."
            )
        return ParameterInfo(param_id=None, param=param, shape=shape)


class PseudoFP16Initializer(Initializer):
    """An fp32 master copy ``<name>_fp32`` and the fp16 parameter ``<name>`` (FloatToHalf)."""

    def create_param(self, param_name: Any, init_net: Any, shape: Any) -> ParameterInfo:
        param_fp32 = self._fill(init_net, param_name + "_fp32", shape)
        param = init_net.FloatToHalf(param_fp32, param_name)
        return ParameterInfo(param_id=None, param=param, shape=shape,
                             blob_copy={FLOAT: param_fp32})


#: The early-2018 name of PseudoFP16Initializer (resnet50_trainer imported it).
pFP16Initializer = PseudoFP16Initializer


class ReversePseudoFP16Initializer(Initializer):
    """The fp32 parameter ``<name>`` and an fp16 copy ``<name>_fp16``."""

    def create_param(self, param_name: Any, init_net: Any, shape: Any) -> ParameterInfo:
        param_fp32 = self._fill(init_net, param_name, shape)
        param_fp16 = init_net.FloatToHalf(param_fp32, param_name + "_fp16")
        return ParameterInfo(param_id=None, param=param_fp32, shape=shape,
                             blob_copy={FLOAT16: param_fp16})


def update_initializer(initializer_class: Any, operator_name_and_kwargs: Any,
                       default_operator_name_and_kwargs: Any) -> Any:
    """Instantiate ``initializer_class`` (default :class:`Initializer`) with the given
    ``(op_name, kwargs)``, or with the default pair when none is given. As in Caffe2, items
    after the first two are ignored."""
    given = operator_name_and_kwargs or default_operator_name_and_kwargs
    if not (isinstance(given, (tuple, list)) and len(given) >= 2 and isinstance(given[0], str)
            and isinstance(given[1], (dict, Mapping))):  # dict first: no ABC check
        raise ModelConfigError(
            f"An initializer must be an (op_name, kwargs) pair such as ('XavierFill', {{}}) "
            f"or ('ConstantFill', {{'value': 0.0}}), got {given!r}.")
    op_name, kwargs = given[0], given[1]
    cls = initializer_class if initializer_class is not None else Initializer
    return cls(op_name, **kwargs)
