"""Caffe2's deprecated ``cnn.CNNModelHelper``: a ModelHelper with brew wrappers."""

from __future__ import annotations

import logging
from typing import Any

from dpgraph.errors import ModelConfigError
from dpgraph.ir.device import CPU, CUDA
from dpgraph.modeling.brew import brew
from dpgraph.modeling.model_helper import ModelHelper
from dpgraph.proto import caffe2_pb2

logger = logging.getLogger("dpgraph.modeling.cnn")


class CNNModelHelper(ModelHelper):
    """ModelHelper whose arg_scope carries ``order``, ``use_cudnn`` and
    ``cudnn_exhaustive_search``, with CamelCase wrappers around brew helpers."""

    def __init__(self, order: str = "NCHW", name: str | None = None, use_cudnn: bool = True,
                 cudnn_exhaustive_search: bool = False, ws_nbytes_limit: Any = None,
                 init_params: bool = True, skip_sparse_optim: bool = False,
                 param_model: ModelHelper | None = None) -> None:
        logger.warning(
            "[====DEPRECATE WARNING====]: you are creating an object from CNNModelHelper "
            "class which will be deprecated soon. Please use ModelHelper object with brew "
            "module.")
        if order not in ("NHWC", "NCHW"):
            raise ModelConfigError(f"Cannot understand the CNN storage order {order}.")
        cnn_arg_scope: dict[str, Any] = {
            "order": order, "use_cudnn": use_cudnn,
            "cudnn_exhaustive_search": cudnn_exhaustive_search,
        }
        if ws_nbytes_limit:
            cnn_arg_scope["ws_nbytes_limit"] = ws_nbytes_limit
        super().__init__(skip_sparse_optim=skip_sparse_optim,
                         name="CNN" if name is None else name, init_params=init_params,
                         param_model=param_model, arg_scope=cnn_arg_scope)
        self.order = order
        self.use_cudnn = use_cudnn
        self.cudnn_exhaustive_search = cudnn_exhaustive_search
        self.ws_nbytes_limit = ws_nbytes_limit

    def _conv_kwargs(self) -> dict[str, Any]:
        return {"use_cudnn": self.use_cudnn, "order": self.order,
                "cudnn_exhaustive_search": self.cudnn_exhaustive_search,
                "ws_nbytes_limit": self.ws_nbytes_limit}

    def ImageInput(self, blob_in: Any, blob_out: Any, use_gpu_transform: bool = False,
                   **kwargs: Any) -> Any:
        return brew.image_input(self, blob_in, blob_out, order=self.order,
                                use_gpu_transform=use_gpu_transform, **kwargs)

    def VideoInput(self, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:
        return brew.video_input(self, blob_in, blob_out, **kwargs)

    def PadImage(self, blob_in: Any, blob_out: Any, **kwargs: Any) -> None:
        self.net.PadImage(blob_in, blob_out, **kwargs)

    def ConvNd(self, *args: Any, **kwargs: Any) -> Any:
        return brew.conv_nd(self, *args, **self._conv_kwargs(), **kwargs)

    def Conv(self, *args: Any, **kwargs: Any) -> Any:
        return brew.conv(self, *args, **self._conv_kwargs(), **kwargs)

    def ConvTranspose(self, *args: Any, **kwargs: Any) -> Any:
        return brew.conv_transpose(self, *args, **self._conv_kwargs(), **kwargs)

    def GroupConv(self, *args: Any, **kwargs: Any) -> Any:
        return brew.group_conv(self, *args, **self._conv_kwargs(), **kwargs)

    def GroupConv_Deprecated(self, *args: Any, **kwargs: Any) -> Any:
        return brew.group_conv_deprecated(self, *args, **self._conv_kwargs(), **kwargs)

    def FC(self, *args: Any, **kwargs: Any) -> Any:
        return brew.fc(self, *args, **kwargs)

    def PackedFC(self, *args: Any, **kwargs: Any) -> Any:
        return brew.packed_fc(self, *args, **kwargs)

    def FC_Prune(self, *args: Any, **kwargs: Any) -> Any:
        return brew.fc_prune(self, *args, **kwargs)

    def FC_Decomp(self, *args: Any, **kwargs: Any) -> Any:
        return brew.fc_decomp(self, *args, **kwargs)

    def FC_Sparse(self, *args: Any, **kwargs: Any) -> Any:
        return brew.fc_sparse(self, *args, **kwargs)

    def Dropout(self, *args: Any, **kwargs: Any) -> Any:
        return brew.dropout(self, *args, order=self.order, use_cudnn=self.use_cudnn, **kwargs)

    def LRN(self, *args: Any, **kwargs: Any) -> Any:
        return brew.lrn(self, *args, order=self.order, use_cudnn=self.use_cudnn, **kwargs)

    def Softmax(self, *args: Any, **kwargs: Any) -> Any:
        return brew.softmax(self, *args, use_cudnn=self.use_cudnn, **kwargs)

    def SpatialBN(self, *args: Any, **kwargs: Any) -> Any:
        return brew.spatial_bn(self, *args, order=self.order, **kwargs)

    def SpatialGN(self, *args: Any, **kwargs: Any) -> Any:
        return brew.spatial_gn(self, *args, order=self.order, **kwargs)

    def InstanceNorm(self, *args: Any, **kwargs: Any) -> Any:
        return brew.instance_norm(self, *args, order=self.order, **kwargs)

    def Relu(self, *args: Any, **kwargs: Any) -> Any:
        return brew.relu(self, *args, order=self.order, use_cudnn=self.use_cudnn, **kwargs)

    def PRelu(self, *args: Any, **kwargs: Any) -> Any:
        return brew.prelu(self, *args, **kwargs)

    def Concat(self, *args: Any, **kwargs: Any) -> Any:
        return brew.concat(self, *args, order=self.order, **kwargs)

    def DepthConcat(self, *args: Any, **kwargs: Any) -> Any:
        logger.warning("DepthConcat is deprecated. use Concat instead.")
        return self.Concat(*args, **kwargs)

    def Sum(self, *args: Any, **kwargs: Any) -> Any:
        return brew.sum(self, *args, **kwargs)

    def Transpose(self, *args: Any, **kwargs: Any) -> Any:
        return brew.transpose(self, *args, use_cudnn=self.use_cudnn, **kwargs)

    def Iter(self, *args: Any, **kwargs: Any) -> Any:
        return brew.iter(self, *args, **kwargs)

    def Accuracy(self, *args: Any, **kwargs: Any) -> Any:
        return brew.accuracy(self, *args, **kwargs)

    def MaxPool(self, *args: Any, **kwargs: Any) -> Any:
        return brew.max_pool(self, *args, use_cudnn=self.use_cudnn, order=self.order, **kwargs)

    def MaxPoolWithIndex(self, *args: Any, **kwargs: Any) -> Any:
        return brew.max_pool_with_index(self, *args, order=self.order, **kwargs)

    def AveragePool(self, *args: Any, **kwargs: Any) -> Any:
        return brew.average_pool(self, *args, use_cudnn=self.use_cudnn, order=self.order,
                                 **kwargs)

    @property
    def XavierInit(self) -> tuple[str, dict[str, Any]]:
        return ("XavierFill", {})

    def ConstantInit(self, value: float) -> tuple[str, dict[str, Any]]:
        return ("ConstantFill", {"value": value})

    @property
    def MSRAInit(self) -> tuple[str, dict[str, Any]]:
        return ("MSRAFill", {})

    @property
    def ZeroInit(self) -> tuple[str, dict[str, Any]]:
        return ("ConstantFill", {})

    def AddWeightDecay(self, weight_decay: float) -> Any:
        return brew.add_weight_decay(self, weight_decay)

    @property
    def CPU(self) -> caffe2_pb2.DeviceOption:
        option = caffe2_pb2.DeviceOption()
        option.device_type = CPU
        return option

    @property
    def GPU(self, gpu_id: int = 0) -> caffe2_pb2.DeviceOption:
        option = caffe2_pb2.DeviceOption()
        option.device_type = CUDA
        option.device_id = gpu_id
        return option
