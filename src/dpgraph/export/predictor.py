"""Saving and loading predictors: the ``predict_net.pb`` + ``init_net.pb`` pair.

``save_predictor(path, predict_net, params)`` writes, into directory ``path``, the predict
net unchanged and an init net of ``GivenTensor*Fill`` ops (one per parameter, with ``shape``
and ``values`` arguments, as Caffe2's ``Net.Const`` makes them) holding the trained values.
Both are plain binary NetDefs that any reader of Caffe2's schema can parse.

``load_predictor(path)`` runs the init net in a fresh :class:`~dpgraph.runtime.Workspace`
(the caller's current workspace is not touched) and returns a :class:`Predictor`::

    predictor = load_predictor("out/")
    probabilities, = predictor.run({"data": batch})
    workspace, predict_net = predictor          # tuple-style unpacking also works
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpgraph.errors import DpgraphError, ExportError, ProtoError
from dpgraph.ir.proto_io import netdef_of, parse_proto, read_proto, write_proto
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api

PREDICT_NET_FILE = "predict_net.pb"
INIT_NET_FILE = "init_net.pb"

#: numpy dtype kind/size -> (fill op type, Argument field holding ``values``).
_FILL_FOR_DTYPE: dict[Any, tuple[str, str]] = {
    np.dtype(np.float32): ("GivenTensorFill", "floats"),
    np.dtype(np.float64): ("GivenTensorDoubleFill", "floats"),
    np.dtype(np.int32): ("GivenTensorIntFill", "ints"),
    np.dtype(np.int64): ("GivenTensorInt64Fill", "ints"),
    np.dtype(np.bool_): ("GivenTensorBoolFill", "ints"),
}
#: Init-net op types that :func:`evaluate_init_net` / the ONNX exporter understand.
FILL_OP_TYPES = frozenset({"GivenTensorFill", "GivenTensorDoubleFill", "GivenTensorIntFill",
                           "GivenTensorInt64Fill", "GivenTensorBoolFill",
                           "GivenTensorStringFill", "GivenTensorByteStringToUInt8Fill",
                           "ConstantFill"})


def fill_op(name: str, value: Any) -> caffe2_pb2.OperatorDef:
    """A ``GivenTensor*Fill`` op that recreates ``value`` as blob ``name``."""
    array = np.asarray(value)
    op = caffe2_pb2.OperatorDef()
    op.output.append(name)
    shape = op.arg.add()
    shape.name = "shape"
    shape.ints.extend(int(d) for d in array.shape)
    values = op.arg.add()
    values.name = "values"
    if array.dtype == np.uint8:  # Caffe2 packs uint8 tensors into one byte string
        op.type = "GivenTensorByteStringToUInt8Fill"
        values.strings.append(array.tobytes())
        return op
    if array.dtype.kind in "SUO":
        op.type = "GivenTensorStringFill"
        values.strings.extend(v if isinstance(v, bytes) else str(v).encode("utf-8")
                              for v in array.ravel().tolist())
        return op
    try:
        op.type, field = _FILL_FOR_DTYPE[array.dtype]
    except KeyError:
        raise ExportError(
            f"parameter {name!r} has dtype {array.dtype}, which has no GivenTensor*Fill op; "
            "cast it to float32, float64, int32, int64, bool or strings first") from None
    flat = array.ravel().astype(np.int64) if array.dtype == np.bool_ else array.ravel()
    getattr(values, field).extend(flat.tolist())
    return op


def _fetch_params(params: Iterable[Any] | Mapping[str, Any],
                  workspace: Any) -> dict[str, np.ndarray]:
    if isinstance(params, Mapping):
        return {str(name): np.asarray(value) for name, value in params.items()}
    names = list(dict.fromkeys(str(p) for p in params))
    ws = api.resolve(workspace)
    missing = [n for n in names if not ws.has_blob(n)]
    if missing:
        raise ExportError(
            f"{len(missing)} parameter(s) not in workspace {ws.name!r}: {', '.join(missing)}; "
            "run the init net (and train) before saving, or pass params as {name: array}")
    values: dict[str, np.ndarray] = {}
    for name in names:
        try:
            values[name] = np.asarray(ws.fetch_blob(name))
        except DpgraphError as error:
            raise ExportError(f"cannot fetch parameter {name!r}: {error}") from error
    return values


def make_init_net(params: Mapping[str, Any], name: str = "init") -> caffe2_pb2.NetDef:
    """An init NetDef of ``GivenTensor*Fill`` ops, one per ``{name: array}`` entry."""
    init = caffe2_pb2.NetDef()
    init.name = name
    for blob, value in params.items():
        init.op.append(fill_op(blob, value))
        init.external_output.append(blob)
    return init


def save_predictor(path: str | os.PathLike[str], predict_net: Any,
                   params: Iterable[Any] | Mapping[str, Any],
                   workspace: Any = None) -> tuple[Path, Path]:
    """Write ``predict_net.pb`` and ``init_net.pb`` into directory ``path``.

    Args:
        predict_net: a Net or NetDef (e.g. from ``ExtractPredictorNet``).
        params: parameter blob names, fetched from ``workspace`` (default: the current
            workspace), or a ``{name: array}`` dict.
    Returns:
        The paths of the predict and init net files.
    Raises:
        ExportError: a parameter is missing or has an unsupported dtype, a predict-net input
            is neither a parameter nor a declared data input, or ``path`` is not usable.
    """
    proto = netdef_of(predict_net, ExportError)
    values = _fetch_params(params, workspace)
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ExportError(f"cannot save a predictor to {os.fspath(path)!r}: it is a file, "
                          "not a directory")
    init = make_init_net(values, (proto.name or "predict") + "_init")
    predict_file, init_file = target / PREDICT_NET_FILE, target / INIT_NET_FILE
    try:
        write_proto(init, init_file)
        write_proto(proto, predict_file)
    except OSError as error:
        raise ExportError(f"cannot write the predictor to {os.fspath(path)!r}: "
                          f"{error.strerror or error}") from error
    return predict_file, init_file


def evaluate_init_net(init_net: Any) -> dict[str, np.ndarray]:
    """Run an init net in a scratch workspace and return every blob it outputs."""
    from dpgraph.runtime import Workspace

    proto = netdef_of(init_net, ExportError)
    ws = Workspace("dpgraph-init-eval", seed=0)
    try:
        ws.run_net_once(proto)
    except DpgraphError as error:
        raise ExportError(f"init net {proto.name!r} failed to run: {error}") from error
    outputs = [b for op in proto.op for b in op.output]
    return {name: np.asarray(ws.fetch_blob(name)) for name in dict.fromkeys(outputs)}


class Predictor:
    """A loaded predictor: its own workspace with the parameters, and the predict net."""

    def __init__(self, predict_net: caffe2_pb2.NetDef, init_net: caffe2_pb2.NetDef,
                 name: str = "predictor", workspace: Any = None) -> None:
        from dpgraph.runtime import Workspace

        self.predict_net = predict_net
        self.init_net = init_net
        self.workspace = workspace if workspace is not None else Workspace(name, seed=0)
        try:
            self.workspace.run_net_once(init_net)
        except DpgraphError as error:
            raise ExportError(f"init net {init_net.name!r} failed to run: {error}") from error
        params = {b for op in init_net.op for b in op.output}
        self.inputs = [b for b in predict_net.external_input if b not in params]
        self.outputs = list(predict_net.external_output)
        self._created = False

    def __iter__(self) -> Iterator[Any]:
        """``workspace, predict_net = predictor``."""
        return iter((self.workspace, self.predict_net))

    def _device(self) -> caffe2_pb2.DeviceOption:
        if self.predict_net.HasField("device_option"):
            return self.predict_net.device_option
        for op in self.predict_net.op:
            if op.HasField("device_option"):
                return op.device_option
        return caffe2_pb2.DeviceOption()

    def run(self, inputs: Mapping[str, Any] | Sequence[Any]) -> list[np.ndarray]:
        """Feed ``inputs`` ({name: array} or arrays in :attr:`inputs` order), run the predict
        net once and return its external outputs as numpy arrays."""
        if not isinstance(inputs, Mapping):
            if len(inputs) != len(self.inputs):
                raise ExportError(f"predictor takes {len(self.inputs)} input(s) "
                                  f"{self.inputs}, got {len(inputs)}")
            inputs = dict(zip(self.inputs, inputs))
        unknown = sorted(set(inputs) - set(self.inputs))
        if unknown:
            raise ExportError(f"unknown predictor input(s) {unknown}; inputs are {self.inputs}")
        device = self._device()
        for name, value in inputs.items():
            self.workspace.feed_blob(name, value, device)
        if not self._created:
            self.workspace.create_net(self.predict_net, overwrite=True)
            self._created = True
        self.workspace.run_net(self.predict_net.name)
        return [np.asarray(self.workspace.fetch_blob(name)) for name in self.outputs]


def load_predictor_db(path: str | os.PathLike[str], db_type: str = "minidb") -> Predictor:
    """A :class:`Predictor` from a DB written by ``predictor_exporter.save_to_db`` (one
    MetaNetDef reader shared with the Caffe2 exporter): global-init and predict-init nets
    run in the predictor's own workspace."""
    from dpgraph.export.metanet import GetBlobs, GetNet
    from dpgraph.export.predictor_exporter import predictor_constants as pc
    from dpgraph.export.predictor_exporter import read_meta_net_def
    from dpgraph.runtime import Workspace

    ws = Workspace(f"predictor:{Path(path).name}", seed=0)
    try:
        meta = read_meta_net_def(ws, os.fspath(path), db_type)
        ws.run_net_once(GetNet(meta, pc.GLOBAL_INIT_NET_TYPE))
        ws.run_net_once(GetNet(meta, pc.PREDICT_INIT_NET_TYPE))
    except DpgraphError as error:
        raise ExportError(f"cannot load the predictor DB {os.fspath(path)!r}: {error}"
                          ) from error
    predictor = Predictor(GetNet(meta, pc.PREDICT_NET_TYPE), caffe2_pb2.NetDef(),
                          workspace=ws)
    predictor.inputs = list(GetBlobs(meta, pc.INPUTS_BLOB_TYPE))
    return predictor


def load_predictor(path: str | os.PathLike[str]) -> Predictor:
    """Load ``predict_net.pb`` and ``init_net.pb`` from directory ``path`` into a fresh
    workspace (:class:`ProtoError` for missing or corrupt files); a file ``path`` is read
    as a ``save_to_db`` minidb (see :func:`load_predictor_db`)."""
    folder = Path(path)
    if folder.is_file():
        return load_predictor_db(folder)
    if not folder.is_dir():
        raise ProtoError(f"predictor directory {os.fspath(path)!r} does not exist or is not "
                         f"a directory; it should hold {PREDICT_NET_FILE} and {INIT_NET_FILE}")
    predict = read_proto(caffe2_pb2.NetDef, folder / PREDICT_NET_FILE)
    init = read_proto(caffe2_pb2.NetDef, folder / INIT_NET_FILE)
    return Predictor(predict, init, name=f"predictor:{folder.name}")


def _parse_net(net: Any) -> caffe2_pb2.NetDef:
    if isinstance(net, (bytes, bytearray)):
        return parse_proto(caffe2_pb2.NetDef, bytes(net), "predict net bytes")
    return netdef_of(net, ExportError)


class WorkspacePredictor:
    """Caffe2's ``workspace.Predictor(init_net, predict_net)`` (the C++ Predictor binding).

    The init net (bytes or a NetDef) runs in the predictor's own workspace; predict-net
    external inputs it does not create start out empty.  ``run`` takes arrays bound to
    ``external_input[i]`` in order, or ``{name: array}``, and returns the external outputs.
    """

    def __init__(self, init_net: Any, predict_net: Any) -> None:
        from dpgraph.runtime import Workspace

        self.init_net = _parse_net(init_net)
        self.predict_net = _parse_net(predict_net)
        self.workspace = Workspace("predictor", seed=0)
        try:
            self.workspace.run_net_once(self.init_net)
        except DpgraphError as error:
            raise ExportError(f"Predictor: init net {self.init_net.name!r} failed: "
                              f"{error}") from error
        for name in self.predict_net.external_input:
            if not self.workspace.has_blob(name):
                self.workspace.create_blob(name)
        self.workspace.create_net(self.predict_net, overwrite=True)

    def _bind(self, inputs: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            return dict(inputs)
        names = list(self.predict_net.external_input)
        if len(inputs) > len(names):
            raise ExportError(f"Predictor.run: {len(inputs)} inputs given but the predict "
                              f"net has {len(names)} external inputs {names}")
        return dict(zip(names, inputs))

    def run(self, inputs: Mapping[str, Any] | Sequence[Any]) -> list[np.ndarray]:
        """Feed the inputs, run the predict net once, return its external outputs."""
        for name, value in self._bind(inputs).items():
            if not isinstance(value, np.ndarray):
                raise ExportError(f"Predictor.run: input {name!r} must be a numpy array, "
                                  f"got {type(value).__name__}")
            self.workspace.feed_blob(name, value)
        self.workspace.run_net(self.predict_net.name)
        return [np.asarray(self.workspace.fetch_blob(n))
                for n in self.predict_net.external_output]
