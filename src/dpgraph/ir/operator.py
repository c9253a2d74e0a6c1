"""Operator creation: Caffe2's ``CreateOperator`` and input/output rectification."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from dpgraph.errors import BlobNameError, DeviceOptionTypeError
from dpgraph.ir import scope
from dpgraph.ir.arguments import encode_argument
from dpgraph.ir.blob import BlobReference, ScopedBlobReference
from dpgraph.proto import caffe2_pb2

#: Functions called with every OperatorDef ``CreateOperator`` builds: Caffe2's core runs a new
#: op at once in immediate mode, and the runtime (a layer up) installs that here while the
#: mode is on (``workspace.StartImmediate``).
CREATE_HOOKS: list[Callable[[caffe2_pb2.OperatorDef], None]] = []

if TYPE_CHECKING:
    from dpgraph.ir.net import Net


def _rectify_one(blob: Any, net: Net | None) -> BlobReference:
    if type(blob) is BlobReference:
        return blob
    if isinstance(blob, (str, bytes)):
        return ScopedBlobReference(blob, net=net)
    if isinstance(blob, BlobReference):  # subclasses behave like the exact type
        return blob
    raise BlobNameError(
        f"A blob must be a str, bytes or BlobReference, got {type(blob).__name__} {blob!r}."
    )


def RectifyInputOutput(blobs: Any, net: Net | None = None) -> list[BlobReference]:
    """Normalise blob arguments: strings get the current name scope, references do not."""
    if isinstance(blobs, (str, bytes, BlobReference)):
        return [_rectify_one(blobs, net)]
    if isinstance(blobs, (list, tuple)):
        return [_rectify_one(b, net) for b in blobs]
    raise BlobNameError(
        f"Blobs must be a str, bytes, BlobReference or a list of them, got "
        f"{type(blobs).__name__} {blobs!r}."
    )


_RectifyInputOutput = RectifyInputOutput


def rectified_names(blobs: Any) -> list[str]:
    """The names of ``RectifyInputOutput(blobs)``'s references (same checks and errors),
    without making the references."""
    kind = type(blobs)  # the common exact types first
    if kind is str:
        return [scope.CurrentNameScope() + blobs]
    if kind is list or kind is tuple:
        prefix = scope.CurrentNameScope()
        names = []
        for blob in blobs:
            kind = type(blob)
            names.append(prefix + blob if kind is str else blob._name
                         if kind is BlobReference else _rectified_name(blob))
        return names
    if kind is BlobReference:
        return [blobs._name]
    if isinstance(blobs, (list, tuple)):
        return [_rectified_name(b) for b in blobs]
    if isinstance(blobs, (str, bytes, BlobReference)):
        return [_rectified_name(blobs)]
    return [str(b) for b in RectifyInputOutput(blobs)]  # raises its BlobNameError


def _rectified_name(blob: Any) -> str:
    if type(blob) is str:
        return scope.CurrentNameScope() + blob
    if isinstance(blob, BlobReference):
        return str(blob)
    return str(_rectify_one(blob, None))  # bytes, str subclasses, or its BlobNameError


def _caffe2_debug() -> bool:
    """``bool(os.environ.get("CAFFE2_DEBUG"))``, read live (for every op) at a dict lookup's
    cost: on POSIX ``os.environ`` keeps its items in one ``_data`` dict (bytes keys) that
    its setters and deleters update; elsewhere, or if ``os.environ`` was replaced, the
    mapping itself is asked."""
    environ = os.environ
    if environ is _ENVIRON and _ENVIRON_DATA is not None:
        return bool(_ENVIRON_DATA.get(b"CAFFE2_DEBUG"))
    return bool(environ.get("CAFFE2_DEBUG"))


_ENVIRON = os.environ
_ENVIRON_DATA: dict[bytes, bytes] | None = getattr(os.environ, "_data", None) \
    if os.name == "posix" and type(getattr(os.environ, "_data", None)) is dict else None


def output_to_list(op_output: Any) -> list[Any]:
    """The outputs a ``net.<Op>(...)`` call returned, as a list (None -> ``[]``)."""
    if op_output is None:
        return []
    if isinstance(op_output, (list, tuple)):
        return list(op_output)
    return [op_output]


def CreateOperator(
    operator_type: str,
    inputs: Any,
    outputs: Any,
    name: str = "",
    control_input: Any = None,
    device_option: caffe2_pb2.DeviceOption | None = None,
    arg: Iterable[caffe2_pb2.Argument] | None = None,
    engine: str | None = None,
    debug_info: str | None = None,
    **kwargs: Any,
) -> caffe2_pb2.OperatorDef:
    """Build an OperatorDef (not added to any net).

    String blob names get the current name scope; the device option comes from
    ``device_option`` or the current device scope; ``random_seed`` goes into the device
    option; ``arg`` protos come first, then one Argument per keyword that is not None.
    """
    operator = caffe2_pb2.OperatorDef()
    fill_operator(operator, operator_type, rectified_names(inputs), rectified_names(outputs),
                  name, control_input, device_option, arg, engine, debug_info, **kwargs)
    return operator


def fill_operator(operator: caffe2_pb2.OperatorDef, operator_type: str, inputs: list[str],
                  outputs: list[str], /, name: str = "", control_input: Any = None,
                  device_option: caffe2_pb2.DeviceOption | None = None,
                  arg: Iterable[caffe2_pb2.Argument] | None = None, engine: str | None = None,
                  debug_info: str | None = None, **kwargs: Any) -> None:
    """:func:`CreateOperator` into the empty ``operator`` (say, ``net.op.add()``), with the
    input and output names already rectified."""
    if debug_info is not None:
        operator.debug_info = debug_info
    elif _caffe2_debug():
        operator.debug_info = "".join(traceback.format_stack())
    operator.type = operator_type
    operator.name = name
    operator.input.extend(inputs)
    operator.output.extend(outputs)
    if control_input:
        operator.control_input.extend(rectified_names(control_input))
    if device_option is not None:
        if not isinstance(device_option, caffe2_pb2.DeviceOption):
            raise DeviceOptionTypeError(
                f"CreateOperator({operator_type!r}): device_option must be a "
                f"caffe2_pb2.DeviceOption, got {type(device_option).__name__} "
                f"{device_option!r}; build one with core.DeviceOption(device_type, device_id).")
        operator.device_option.CopyFrom(device_option)
    else:
        current = scope.CurrentDeviceScope()
        if current is not None:
            operator.device_option.CopyFrom(current)
    if engine is not None:
        operator.engine = engine
    if "random_seed" in kwargs:
        operator.device_option.random_seed = kwargs.pop("random_seed")
    if arg is not None:
        operator.arg.extend(arg)
    if kwargs:
        add_argument = operator.arg.add
        for key, value in kwargs.items():
            if value is not None:
                argument = add_argument()
                argument.name = key
                encode_argument(argument, key, value)
    if CREATE_HOOKS:
        for hook in list(CREATE_HOOKS):
            hook(operator)
