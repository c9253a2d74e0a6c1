"""Parameter metadata: Caffe2's ``modeling.parameter_info``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpgraph.errors import ModelError
from dpgraph.ir.blob import BlobReference, GradientSlice

GRAD_TYPE_DENSE = "dense"
GRAD_TYPE_SPARSE = "sparse"


def _size(shape: Any) -> int:
    """The element count of ``shape`` (``np.prod``; plain int lists without numpy)."""
    if type(shape) in (list, tuple) and all(type(d) is int for d in shape):
        return math.prod(shape)
    return int(np.prod(shape))


class ParameterTags:
    """Tag strings a parameter can carry (``model.create_param(..., tags=...)``)."""

    BIAS = "BIAS"
    WEIGHT = "WEIGHT"
    COMPUTED_PARAM = "COMPUTED_PARAM"


class ParameterInfo:
    """What a model knows about one parameter blob: shape, gradient, optimizer, copies."""

    def __init__(self, param_id: int | None, param: BlobReference, key: Any = None,
                 shape: Any = None, length: int | None = None, grad: Any = None,
                 blob_copy: dict[int, BlobReference] | None = None) -> None:
        if not isinstance(param, BlobReference):
            raise ModelError(
                f"ParameterInfo needs a BlobReference, got {type(param).__name__} {param!r}; "
                "wrap the name with core.BlobReference(name)."
            )
        self.param_id = param_id
        self.name = str(param)
        self.blob = param
        self.key = key
        self.shape = shape
        self.size = None if shape is None else _size(shape)
        self.length = max(1, length if length is not None else 1)
        self.grad = grad
        self._cloned_init_net: Any = None
        self.blob_copy = blob_copy
        self.regularizer: Any = None
        self._optimizer: Any = None

    @property
    def parameter(self) -> BlobReference:
        return self.blob

    @property
    def optimizer(self) -> Any:
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        if self._optimizer is not None:
            raise ModelError(f"optimizer has already been set for parameter {self.name}")
        self._optimizer = value

    def grad_type(self) -> str | None:
        """``None`` without a gradient, else ``'sparse'`` (GradientSlice) or ``'dense'``."""
        if self.grad is None:
            return None
        return GRAD_TYPE_SPARSE if isinstance(self.grad, GradientSlice) else GRAD_TYPE_DENSE

    def cloned_init_net(self) -> tuple[Any, BlobReference]:
        """The part of the parameter's init net that computes it, and its output."""
        if not self._cloned_init_net:
            net = self.blob.Net()
            if net is None:
                raise ModelError(f"Parameter {self.name} is not bound to an init net; create it "
                                 "with model.create_param or an init-net fill op.")
            init_net, outputs = net.ClonePartial(
                f"param_{self.param_id}_{self.name}_init", inputs=[], outputs=[self.blob])
            self._cloned_init_net = (init_net, outputs[0])
        return self._cloned_init_net

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"ParameterInfo({self.name!r}, shape={self.shape}, grad={self.grad!r})"
