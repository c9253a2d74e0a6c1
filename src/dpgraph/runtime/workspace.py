"""The :class:`Workspace`: blobs with their placements, instantiated nets, random state.

Library code may use a Workspace directly; :mod:`dpgraph.workspace` is the Caffe2-style
facade over the process's *current* workspace.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from dpgraph.collectives.services import SERVICES, CollectiveServices
from dpgraph.db.services import SERVICES as STORAGE_SERVICES
from dpgraph.db.services import StorageServices
from dpgraph.errors import (
    BlobNotFoundError,
    DpgraphError,
    NetCancelledError,
    OperatorFailedError,
    WorkspaceError,
    did_you_mean,
)
from dpgraph.ir import scope
from dpgraph.ir.arrays import is_shared_storage
from dpgraph.ir.device import device_key, device_name
from dpgraph.ir.proto_io import (
    ProtoLimitError,
    check_nesting,
    check_tensor_size,
    nested_nets,
    parse_proto,
)
from dpgraph.ops.fill import NUMPY_DTYPES
from dpgraph.ops.queue import cancel_blocking_waits, forget_cancelled
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import devices, observers
from dpgraph.runtime.executor import SimpleExecutor, make_executor
from dpgraph.runtime.first_run import run_first_run_checks
from dpgraph.runtime.operator import OpInstance, interned_key, net_entropy
from dpgraph.runtime.serialization import tensor_proto_to_numpy

logger = logging.getLogger("dpgraph.runtime")

DeviceKey = tuple[int, int]


class MissingBlobError(BlobNotFoundError, WorkspaceError):
    """A blob is not in the workspace (a KeyError and, as in Caffe2, a RuntimeError)."""


# What ``RunNet(..., allow_fail=True)`` turns into False: an op reporting failure (Caffe2's
# RunOnDevice returning false), a cancelled run, and an input missing at run time (Caffe2
# refuses that net earlier, at CreateNet). An exception a kernel throws propagates, as in Caffe2.
_RUN_FAILURES = (OperatorFailedError, NetCancelledError, BlobNotFoundError)


class WorkspaceArgumentError(WorkspaceError, TypeError):
    """A workspace call got an argument of the wrong type (a TypeError, as Caffe2's C++
    bindings raised, and a WorkspaceError)."""


class NetInstance:
    """A net created in a workspace: a snapshot of its NetDef, its ops and its executor."""

    def __init__(self, proto: caffe2_pb2.NetDef, workspace: Workspace) -> None:
        self.proto = caffe2_pb2.NetDef()
        self.proto.CopyFrom(proto)
        self.name = self.proto.name
        self.workspace = workspace
        net_device = self.proto.device_option if self.proto.HasField("device_option") else None
        entropy = net_entropy(workspace.seed, next(workspace._instantiations), self.name)
        self.ops = [OpInstance(op, i, self.name, net_device, workspace, entropy)
                    for i, op in enumerate(self.proto.op)]
        self.executor = make_executor(self.proto.type, self.ops, self.proto.num_workers,
                                      self.name)
        self.checked = False
        self.observers: list[observers.NetObserver] = []  # net.AddObserver's
        self._cancelled = threading.Event()
        self._forget = False  # cancel() marked this net's threads (see run())
        self._runner: int | None = None  # the thread in run(), while it runs

    def run(self) -> None:
        if not self.checked:  # once per created net (and per RunNetOnce)
            self.checked = True
            run_first_run_checks(self.workspace, self.proto)
        if self._cancelled.is_set():  # clearing takes the event's lock: only when set
            self._cancelled.clear()
        self._runner = threading.get_ident()
        try:
            if self.observers:
                observers.run_observed(self.observers, self._run_executor)
            else:
                self._run_executor()
        except Exception as error:
            if self._cancelled.is_set():
                raise self._cancelled_error() from error
            raise
        finally:
            if self._forget:  # only a cancel() marked threads (enumerating them costs)
                self._forget = False
                forget_cancelled(self._threads())
            self._runner = None
        if self._cancelled.is_set():
            raise self._cancelled_error()

    def _run_executor(self) -> None:
        self.executor.run(self.workspace._blobs, self.workspace._placement)

    def cancel(self) -> None:
        """Stop a run in progress (Caffe2's ``NetBase::Cancel``): ops blocked on a queue
        return, and ``run()`` raises :class:`NetCancelledError`."""
        self._cancelled.set()
        cancel_blocking_waits(self._threads())
        self._forget = True  # after marking: a run ending in between forgets at its next end

    def _threads(self) -> list[int]:
        """The threads that run this net's ops: the caller of run() and the executor's."""
        prefix = f"dpgraph-{self.name}-"
        idents = [t.ident for t in threading.enumerate()
                  if t.name.startswith(prefix) and t.ident is not None]
        return idents + ([self._runner] if self._runner is not None else [])

    def _cancelled_error(self) -> NetCancelledError:
        return NetCancelledError(f"Net {self.name!r} was cancelled while running; run it again "
                                 f"to start over.")

    def close(self) -> None:
        self.executor.close()
        for op in self.ops:
            op.close()


def check_net_limits(proto: caffe2_pb2.NetDef) -> None:
    """Refuse, before any op runs, a net nesting nets deeper than ``max_nesting_depth()``
    or with a filler op declaring a tensor above ``max_tensor_bytes()``."""
    check_nesting(proto)
    pending = [proto]
    while pending:
        net = pending.pop()
        pending.extend(nested_nets(net))
        for index, op in enumerate(net.op):
            if op.input or not op.type.endswith("Fill"):
                continue
            shape = next((list(arg.ints) for arg in op.arg if arg.name == "shape"), None)
            if not shape or any(d < 0 for d in shape):
                continue  # the kernel names a bad shape when the op runs
            check_tensor_size(shape, _declared_itemsize(op), (
                f"op {index} ({op.type}) of net {net.name!r}, output "
                f"{list(op.output)[:1]}"))


#: Execution steps may nest as deep as protobuf lets a parsed PlanDef nest them.
MAX_STEP_DEPTH = 100


def check_plan_limits(plan: caffe2_pb2.PlanDef) -> None:
    """Refuse, before anything runs, a plan whose steps nest deeper than protobuf allows in
    a file (a Python-built plan could otherwise exhaust the stack) or whose nets break
    :func:`check_net_limits`."""
    pending = [(step, 1) for step in plan.execution_step]
    while pending:
        step, depth = pending.pop()
        if depth > MAX_STEP_DEPTH:
            raise ProtoLimitError(
                f"plan {plan.name!r}: execution steps nest more than {MAX_STEP_DEPTH} levels "
                f"deep (at step {step.name!r}); flatten the substeps.")
        pending.extend((sub, depth + 1) for sub in step.substep)
    for net in plan.network:
        check_net_limits(net)


def _declared_itemsize(op: caffe2_pb2.OperatorDef) -> int:
    dtype = next((arg.i for arg in op.arg if arg.name == "dtype" and arg.HasField("i")), None)
    numpy_type = NUMPY_DTYPES.get(dtype) if dtype is not None else None
    return max(np.dtype(numpy_type).itemsize, 1) if numpy_type is not None else 4


def check_net_definition(proto: caffe2_pb2.NetDef) -> None:
    """Caffe2's creation checks: undefined inputs (when external_input is declared) and
    external outputs nobody produces; then the resource limits."""
    check_net_limits(proto)
    known = set(proto.external_input)
    for index, op in enumerate(proto.op):
        if proto.external_input:
            for blob in op.input:
                if blob not in known:
                    raise WorkspaceError(
                        f"op {index} ({op.type}) of net {proto.name!r}: Source for input "
                        f"{blob!r} is unknown: it is neither an external input of the net nor "
                        "the output of an earlier op; add it to external_input.")
        known.update(op.output)
    for blob in proto.external_output:
        if blob not in known:
            raise WorkspaceError(
                f"Did not find output {blob!r} of net {proto.name!r}: no op produces it and it "
                "is not an external input.")


def as_net_proto(net: Any) -> caffe2_pb2.NetDef:
    """A NetDef from a Net (``Proto()``), a NetDef or serialised bytes."""
    if isinstance(net, caffe2_pb2.NetDef):
        return net
    if hasattr(net, "Proto"):
        return net.Proto()
    if isinstance(net, (bytes, str)):
        data = net.encode("latin-1") if isinstance(net, str) else net
        return parse_proto(caffe2_pb2.NetDef, data, "serialized NetDef")
    raise WorkspaceError(f"Expected a Net, NetDef or serialised NetDef, got {type(net).__name__}.")


class Workspace:
    """Blobs (each recording the device it lives on), nets and a random generator."""

    #: stores and collective backends for the distributed ops' kernels (``ctx.workspace``)
    collectives: CollectiveServices = SERVICES
    #: DB readers, DBs and the image pipeline for the DB, persistence and ImageInput kernels
    storage: StorageServices = STORAGE_SERVICES

    def __init__(self, name: str = "default", root_folder: str = ".",
                 seed: int | None = None) -> None:
        self.name = name
        self.root_folder = root_folder
        self._blobs: dict[str, Any] = {}
        self._placement: dict[str, DeviceKey | None] = {}
        self._nets: dict[str, NetInstance] = {}
        entropy: Any = np.random.SeedSequence().entropy
        self.seed = int(entropy) % (2**63) if seed is None else int(seed)
        self.rng = np.random.default_rng(self.seed)
        self._instantiations = itertools.count()
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"Workspace({self.name!r}, {len(self._blobs)} blobs, {len(self._nets)} nets)"

    # --- blobs ---------------------------------------------------------------------------
    def blobs(self) -> list[str]:
        return sorted(self._blobs)

    def has_blob(self, name: Any) -> bool:
        return str(name) in self._blobs

    def _missing_blob(self, name: str) -> MissingBlobError:
        """Caffe2's "Can't find blob: NAME", plus close matches and how to create it."""
        return MissingBlobError(
            f"Can't find blob: {name}.{did_you_mean(name, self._blobs)} Feed it with "
            f"workspace.FeedBlob or run the net that produces it first.")

    def create_blob(self, name: Any) -> None:
        """Create an empty blob if it does not exist."""
        self._blobs.setdefault(str(name), None)
        self._placement.setdefault(str(name), None)

    def reset_blob(self, name: Any) -> None:
        name = str(name)
        if name not in self._blobs:
            raise self._missing_blob(name)
        self._blobs[name] = None
        self._placement[name] = None

    def remove_blob(self, name: Any) -> None:
        self._blobs.pop(str(name), None)
        self._placement.pop(str(name), None)

    def placement(self, name: Any) -> DeviceKey | None:
        """The device a blob lives on (``None`` for empty and non-tensor blobs)."""
        name = str(name)
        if name not in self._blobs:
            raise self._missing_blob(name)
        return self._placement[name]

    def get_blob_or_none(self, name: str, device: Any = None) -> Any:
        """The stored value (no copy), or ``None`` (OpContext protocol)."""
        return self._blobs.get(name)

    def get_blob(self, name: Any) -> Any:
        """The stored value without copying; missing -> BlobNotFoundError."""
        name = str(name)
        try:
            return self._blobs[name]
        except KeyError:
            raise self._missing_blob(name) from None

    def set_blob(self, name: Any, value: Any, device: DeviceKey | None = devices.CPU_KEY) -> None:
        """Store ``value`` as is on placement ``device`` (no conversion, no copy)."""
        self._blobs[str(name)] = value
        self._placement[str(name)] = interned_key(device) \
            if device is not None and devices.is_array(value) else None

    def feed_blob(self, name: Any, value: Any,
                  device_option: caffe2_pb2.DeviceOption | None = None) -> bool:
        """Copy ``value`` into blob ``name`` on the device of ``device_option`` (default:
        the current device scope).  Accepts arrays, str/bytes and TensorProtos."""
        if device_option is None:
            device_option = scope.CurrentDeviceScope()
        if device_option is not None and not isinstance(device_option,
                                                        caffe2_pb2.DeviceOption):
            raise WorkspaceArgumentError(
                f"FeedBlob({str(name)!r}): device_option must be a caffe2_pb2.DeviceOption, got "
                f"{type(device_option).__name__} {device_option!r}; build one with "
                "core.DeviceOption(device_type, device_id).")
        key = device_key(device_option)
        name = str(name)
        if isinstance(value, caffe2_pb2.TensorProto):
            _check_tensor_proto(value, name)
            try:
                value = tensor_proto_to_numpy(value)
            except DpgraphError as error:
                raise type(error)(f"FeedBlob({name!r}): {error} Check the TensorProto's dims, "
                                  "data_type and data field, or feed a numpy array.") from error
        if isinstance(value, str):
            value = value.encode("utf-8")
        if isinstance(value, bytes):
            self.set_blob(name, value, None)
            return True
        array = _as_array(value, name)
        devices.check_device(key, f"FeedBlob({name!r}): ")
        if devices.is_gpu(key) and array.dtype == np.float64:
            warnings.warn(f"FeedBlob({name!r}): feeding a float64 array to {device_name(key)}; "
                          "CUDA ops usually expect float32.", stacklevel=3)
        if not self._write_into_shared_storage(name, array, key):
            self.set_blob(name, devices.to_device(array, key), key)
        return True

    def _write_into_shared_storage(self, name: str, array: np.ndarray, key: DeviceKey) -> bool:
        """Feeding a blob whose storage other blobs share (UnsafeCoalesce) an array of the
        same shape and dtype writes into that storage, as Caffe2's FeedBlob reuses a tensor's
        memory; True when it did."""
        old = self._blobs.get(name)
        if old is None or not is_shared_storage(old) or old.shape != array.shape or \
                old.dtype != array.dtype or self._placement.get(name) != key:
            return False
        old[...] = devices.to_device(array, key)
        return True

    def fetch_blob(self, name: Any) -> Any:
        """A host copy of a blob's value (bytes for string blobs)."""
        name = str(name)
        if name not in self._blobs:
            raise self._missing_blob(name)
        value = self._blobs[name]
        if value is None:
            raise WorkspaceError(f"Blob {name!r} is empty (created but never written, or freed)"
                                 " and cannot be fetched.")
        if isinstance(value, bytes):
            return value
        if devices.is_array(value):
            return np.array(devices.to_host(value), copy=True)
        return value  # opaque objects (queues, mutexes) are returned as they are

    # --- nets ----------------------------------------------------------------------------
    def create_net(self, net: Any, overwrite: bool = False,
                   input_blobs: Iterable[Any] | None = None) -> NetInstance:
        proto = as_net_proto(net)
        for blob in input_blobs or ():
            self.create_blob(blob)
        with self._lock:
            if proto.name in self._nets and not overwrite:
                raise WorkspaceError(
                    "I respectfully refuse to overwrite an existing net of the same name "
                    f"\"{proto.name}\", unless you explicitly specify overwrite=True.")
            check_net_definition(proto)
            instance = NetInstance(proto, self)
            old = self._nets.pop(proto.name, None)
            if old is not None:
                old.close()
            self._nets[proto.name] = instance
        return instance

    def net(self, name: Any) -> NetInstance:
        name = net_name(name)
        try:
            return self._nets[name]
        except KeyError:
            raise WorkspaceError(f"Can't find net {name}; create it with CreateNet first."
                                 ) from None

    def nets(self) -> list[str]:
        return sorted(self._nets)

    def has_net(self, name: Any) -> bool:
        return net_name(name) in self._nets

    def delete_net(self, name: Any) -> None:
        instance = self._nets.pop(net_name(name), None)
        if instance is not None:
            instance.close()

    def run_net(self, name: Any, num_iter: int = 1, allow_fail: bool = False) -> bool:
        instance = self.net(name)
        if isinstance(num_iter, bool) or not isinstance(num_iter, (int, np.integer)):
            raise WorkspaceArgumentError(
                f"RunNet({instance.name!r}): num_iter must be an int, got "
                f"{type(num_iter).__name__} {num_iter!r}.")
        try:
            for _ in range(num_iter):
                instance.run()
        except _RUN_FAILURES:
            if allow_fail:
                logger.warning("Net %s failed (allow_fail=True)", instance.name, exc_info=True)
                return False
            raise
        return True

    def run_net_once(self, net: Any) -> bool:
        """Instantiate a temporary net (with CreateNet's checks) and run it once."""
        proto = as_net_proto(net)
        check_net_definition(proto)
        instance = NetInstance(proto, self)
        try:
            instance.run()
        finally:
            instance.close()
        return True

    def run_operators_once(self, ops: Iterable[caffe2_pb2.OperatorDef]) -> bool:
        for op in ops:
            self.run_operator_multiple(op, 1)
        return True

    def run_operator_multiple(self, op: caffe2_pb2.OperatorDef, num_runs: int) -> bool:
        """Instantiate ``op`` once and run that instance ``num_runs`` times (so state an
        operator keeps across runs carries over, as in Caffe2)."""
        instance = OpInstance(op, 0, "", None, self,
                              net_entropy(self.seed, next(self._instantiations), ""))
        executor = SimpleExecutor([instance])
        try:
            for _ in range(num_runs):
                executor.run(self._blobs, self._placement)
        finally:
            instance.close()
        return True

    def run_plan(self, plan: Any) -> bool:
        from dpgraph.runtime.plan import run_plan

        if isinstance(plan, (bytes, str)):
            data = plan.encode("latin-1") if isinstance(plan, str) else plan
            plan = parse_proto(caffe2_pb2.PlanDef, data, "serialized PlanDef")
        proto = plan.Proto() if hasattr(plan, "Proto") else plan
        if isinstance(proto, caffe2_pb2.PlanDef):
            check_plan_limits(proto)
        run_plan(self, plan)
        return True

    def close_nets(self) -> None:
        """Destroy every net instance: their ops close (prefetch threads end, the readers
        they own close); the blobs stay."""
        with self._lock:
            for instance in self._nets.values():
                instance.close()
            self._nets.clear()

    def reset(self, root_folder: str | None = None) -> None:
        """Drop every blob and net (Caffe2's ResetWorkspace)."""
        with self._lock:
            self.close_nets()
            self._blobs.clear()
            self._placement.clear()
        if root_folder is not None:
            os.makedirs(root_folder, exist_ok=True)
            self.root_folder = root_folder


def net_name(net: Any) -> str:
    """The name of a Net, NetDef or string."""
    if isinstance(net, caffe2_pb2.NetDef):
        return net.name
    if hasattr(net, "Name"):
        return str(net.Name())
    return net.decode() if isinstance(net, bytes) else str(net)


def _check_tensor_proto(proto: caffe2_pb2.TensorProto, name: str) -> None:
    """Refuse a fed TensorProto declaring bad or oversized dims before decoding it."""
    numpy_type = NUMPY_DTYPES.get(proto.data_type) if proto.HasField("data_type") else np.float32
    itemsize = np.dtype(numpy_type).itemsize if numpy_type is not None else 1
    check_tensor_size(list(proto.dims), max(itemsize, 1), f"FeedBlob({name!r}): the TensorProto")


def _as_array(value: Any, name: str) -> np.ndarray:
    if devices.is_array(value):
        array = value
    else:
        try:
            array = np.asarray(value)
        except Exception as error:
            raise WorkspaceError(f"FeedBlob({name!r}): cannot feed a {type(value).__name__} "
                                 f"({error}); feed a numpy array, a string or a TensorProto."
                                 ) from None
    if array.dtype.kind in "cmMV":
        raise WorkspaceError(f"FeedBlob({name!r}): numpy dtype {array.dtype} has no Caffe2 "
                             "tensor type; convert it (e.g. to float32, int64 or strings) "
                             "first.")
    if array.dtype.kind in "SU":
        flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v)
                for v in array.reshape(-1).tolist()]
        obj = np.empty(len(flat), dtype=object)
        obj[:] = flat
        array = obj.reshape(array.shape)
    elif array.dtype.kind == "O" and not isinstance(value, np.ndarray):
        raise WorkspaceError(f"FeedBlob({name!r}): cannot feed a {type(value).__name__}; "
                             "feed a numpy array, a string or a TensorProto.")
    elif array.dtype.kind == "O":
        array = _string_tensor(array, name)
    return array


def _string_tensor(array: np.ndarray, name: str) -> np.ndarray:
    """An object array as Caffe2's string tensor: bytes elements (str is UTF-8 encoded);
    any other element is refused, as Caffe2's feeder did."""
    values = array.reshape(-1).tolist()
    bad = [v for v in values if not isinstance(v, (str, bytes))]
    if bad:
        raise WorkspaceError(
            f"FeedBlob({name!r}): an object array must hold only bytes or str (a string "
            f"tensor), but it holds {type(bad[0]).__name__} {bad[0]!r}; feed a numeric "
            f"dtype array instead.")
    if not any(isinstance(v, str) for v in values):
        return array
    encoded = np.empty(len(values), dtype=object)
    encoded[:] = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
    return encoded.reshape(array.shape)
