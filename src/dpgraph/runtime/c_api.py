"""``workspace.C``: the names Caffe2 code takes from its C++ extension module
(``caffe2.python.caffe2_pybind11_state``), over dpgraph's runtime.

* ``Workspace``: a workspace object (``Workspace()`` new, ``Workspace(parent)`` a child
  that shares the parent's blobs, ``Workspace.current``), with ``blobs``, ``nets``,
  ``create_blob``, ``create_net``, ``run``, ``fetch_blob``, ``feed_blob``.
* ``create_db`` / ``Mode``: dpgraph's DB registry (``dpgraph.db``).
* ``OpSchema.get(type)``: arity and in-place facts of a registered op.
* The module-level workspace functions (``feed_blob``, ``fetch_blob``, ``run_net``, ...).

C++-only internals (transforms, onnxifi, the memonger kernels, ...) raise
:class:`~dpgraph.errors.NotSupportedError` naming the dpgraph alternative.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

from dpgraph.errors import NotSupportedError, WorkspaceError
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops import python_op
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api, finalizers
from dpgraph.runtime.observers import (  # noqa: F401  (Caffe2's C.*_observer* functions)
    add_observer_to_net,
    num_observers_on_net,
    remove_observer_from_net,
)
from dpgraph.runtime.workspace import Workspace as RuntimeWorkspace

_child_ids = itertools.count()


class WorkspaceArgumentTypeError(WorkspaceError, TypeError):
    """A workspace call got a value it cannot store (a RuntimeError, as Caffe2's C++
    enforce, and a TypeError)."""
#: The live ``Workspace`` wrapper of each runtime workspace (weak both ways: a wrapper nobody
#: holds goes, and with it what it owns).
_wrappers: weakref.WeakKeyDictionary[Any, weakref.ref[Workspace]] = weakref.WeakKeyDictionary()


class Blob:
    """A blob of a workspace: ``fetch()``, ``feed(value, device_option=None)``.  It keeps its
    ``Workspace`` object alive (``owner``), as Caffe2's binding does."""

    def __init__(self, ws: Any, name: str, owner: Any = None) -> None:
        self._ws, self._name, self._owner = ws, name, owner

    def fetch(self) -> Any:
        return self._ws.fetch_blob(self._name)

    def feed(self, value: Any, device_option: Any = None) -> bool:
        if device_option is not None and not isinstance(device_option,
                                                        caffe2_pb2.DeviceOption):
            parsed = caffe2_pb2.DeviceOption()
            parsed.ParseFromString(device_option)
            device_option = parsed
        return self._ws.feed_blob(self._name, value, device_option)

    def tensor(self) -> TensorCPU:
        """The blob's tensor: ``data`` is the stored array itself (in-place edits show)."""
        return TensorCPU(self._ws, self._name)

    def is_tensor(self) -> bool:
        import numpy as np

        return isinstance(self._ws.get_blob(self._name), np.ndarray)

    def serialize(self, name: str) -> bytes:
        """The blob as BlobProto bytes named ``name``."""
        from dpgraph.runtime.serialization import serialize_blob

        return serialize_blob(name, self._ws.get_blob(self._name),
                              self._ws.placement(self._name))

    def deserialize(self, serialized: bytes) -> None:
        """Store the value of BlobProto bytes in this blob (tensors on the CPU)."""
        import numpy as np

        from dpgraph.runtime.serialization import deserialize_blob

        _, value = deserialize_blob(serialized)
        if isinstance(value, np.ndarray):
            self._ws.feed_blob(self._name, value, caffe2_pb2.DeviceOption())
        else:
            self._ws.set_blob(self._name, value, None)

    def __repr__(self) -> str:
        return f"Blob({self._name!r})"


class TensorCPU:
    """In-place access to a tensor blob (``Blob.tensor()``)."""

    def __init__(self, ws: Any, name: str) -> None:
        self._ws, self._name = ws, name

    @property
    def data(self) -> Any:
        """The stored array (not a copy)."""
        return self._ws.get_blob(self._name)

    @property
    def _shape(self) -> list[int]:
        return list(self.data.shape)

    def init(self, dims: Any, data_type: int) -> None:
        """Replace the value with zeros of ``dims`` and TensorProto ``data_type``."""
        import numpy as np

        from dpgraph.runtime.serialization import DATA_TYPE_TO_NUMPY

        if data_type == caffe2_pb2.TensorProto.STRING:
            raise WorkspaceArgumentTypeError(
                f"TensorCPU.init({self._name!r}): string tensors cannot be initialized from "
                "Python; feed an object array of bytes instead.")
        self._ws.set_blob(self._name, np.zeros([int(d) for d in dims],
                                               DATA_TYPE_TO_NUMPY[data_type]))

    def feed(self, value: Any) -> bool:
        """Copy ``value`` into the tensor."""
        import numpy as np

        return self._ws.feed_blob(self._name, np.array(value, copy=True),
                                  caffe2_pb2.DeviceOption())

    def fetch(self) -> Any:
        """A copy of the tensor."""
        return self._ws.fetch_blob(self._name)


class Net:
    """A net instantiated in a workspace: ``run()``.  It keeps its ``Workspace`` object alive
    (``owner``), as Caffe2's binding does."""

    def __init__(self, ws: Any, name: str, owner: Any = None) -> None:
        self._ws, self._name, self._owner = ws, name, owner

    def run(self) -> bool:
        return self._ws.run_net(self._name)

    def cancel(self) -> None:
        """Stop this net's run in progress (from another thread): its blocked queue ops
        return and ``run()`` raises NetCancelledError."""
        self._ws.net(self._name).cancel()

    def __repr__(self) -> str:
        return f"Net({self._name!r})"


class _WorkspaceMeta(type):
    @property
    def current(cls) -> Workspace:
        """The current workspace (``workspace.C.Workspace.current``)."""
        return Workspace._wrap(api.current())


class Workspace(metaclass=_WorkspaceMeta):
    """A Caffe2 workspace object.  ``Workspace()`` makes a new one; ``Workspace(parent)``
    a child in which the parent's blobs are visible and new blobs are local."""

    def __init__(self, parent: Any = None) -> None:
        if parent is None:
            self._ws = RuntimeWorkspace(f"c_workspace_{next(_child_ids)}")
        elif isinstance(parent, (Workspace, RuntimeWorkspace)):
            from dpgraph.ops.control import shared_child_workspace

            parent_ws = parent._ws if isinstance(parent, Workspace) else parent
            self._ws = shared_child_workspace(parent_ws)
            self._ws.name = f"{parent_ws.name}/child_{next(_child_ids)}"
        else:
            raise TypeError(f"Workspace() takes nothing or a parent Workspace, got "
                            f"{type(parent).__name__}")
        _wrappers[self._ws] = weakref.ref(self)
        # Dropping the object destroys its nets, as destroying a Caffe2 workspace does: ops
        # close (prefetch threads end, DB readers they own close).
        finalizers.when_dropped(self, self._ws.close_nets)

    @staticmethod
    def _wrap(ws: Any) -> Workspace:
        """``ws``'s live wrapper, else a new one that owns nothing (``ws`` was not made by
        ``Workspace()``, or its wrapper is gone)."""
        known = _wrappers.get(ws)
        wrapper = known() if known is not None else None
        if wrapper is None:
            wrapper = Workspace.__new__(Workspace)
            wrapper._ws = ws
            _wrappers[ws] = weakref.ref(wrapper)
        return wrapper

    @property
    def blobs(self) -> dict[str, Blob]:
        """``{name: Blob}`` of this workspace (and, for a child, its parent's)."""
        return {name: Blob(self._ws, name, self) for name in sorted(set(self._ws._blobs))}

    @property
    def nets(self) -> dict[str, Net]:
        return {name: Net(self._ws, name, self) for name in self._ws.nets()}

    @property
    def root_folder(self) -> str:
        return self._ws.root_folder

    def create_blob(self, name: Any) -> Blob:
        self._ws.create_blob(str(name))
        return Blob(self._ws, str(name), self)

    def has_blob(self, name: Any) -> bool:
        return bool(self._ws.has_blob(str(name)))

    def fetch_blob(self, name: Any) -> Any:
        return self._ws.fetch_blob(str(name))

    def feed_blob(self, name: Any, value: Any, device_option: Any = None) -> bool:
        return self._ws.feed_blob(str(name), value, device_option)

    def remove_blob(self, name: Any) -> None:
        self._ws.remove_blob(str(name))

    def create_net(self, net: Any, overwrite: bool = False) -> Net:
        """Instantiate ``net``; as in Caffe2, every input an op reads before any op of the
        net writes it must already exist in this workspace."""
        if isinstance(net, str):
            raise TypeError("create_net takes a Net, a NetDef or serialized NetDef bytes, "
                            f"not the str {net[:40]!r}")
        proto = _net_proto(net)
        _check_inputs_exist(self._ws, proto)
        self._ws.create_net(proto, overwrite=overwrite)
        for op in proto.op:  # as Caffe2's operator constructors, create the outputs
            for name in op.output:
                self._ws.create_blob(name)
        return Net(self._ws, proto.name, self)

    def run(self, obj: Any) -> bool:
        """Run a Net/NetDef once, or a Plan/PlanDef/ExecutionStep."""
        proto = obj.Proto() if hasattr(obj, "Proto") else obj
        if isinstance(proto, caffe2_pb2.NetDef):
            return self._ws.run_net_once(proto)
        if isinstance(proto, caffe2_pb2.OperatorDef):
            return self._ws.run_operators_once([proto])
        return self._ws.run_plan(obj)

    def _run_net(self, serialized: bytes) -> bool:
        return self.run(_net_proto(serialized))

    def _run_plan(self, serialized: bytes) -> bool:
        plan = caffe2_pb2.PlanDef()
        plan.ParseFromString(serialized)
        return self._ws.run_plan(plan)

    def __repr__(self) -> str:
        return f"C.Workspace({self._ws.name!r})"


python_op.WORKSPACE_VIEW = Workspace._wrap  # pass_workspace functions get a C.Workspace


def _check_inputs_exist(ws: Any, proto: caffe2_pb2.NetDef) -> None:
    produced: set[str] = set()
    for index, op in enumerate(proto.op):
        for name in op.input:
            if name not in produced and not ws.has_blob(name):
                raise WorkspaceError(
                    f"op {index} ({op.type}) of net {proto.name!r}: Encountered a non-existing "
                    f"input blob: {name}; feed it or create it before creating the net.")
        produced.update(op.output)


def _net_proto(net: Any) -> caffe2_pb2.NetDef:
    if hasattr(net, "Proto"):
        return net.Proto()
    if isinstance(net, caffe2_pb2.NetDef):
        return net
    proto = caffe2_pb2.NetDef()
    proto.ParseFromString(net if isinstance(net, bytes) else str(net).encode("latin-1"))
    return proto


def runtime_workspace(ws: Any) -> RuntimeWorkspace:
    """The runtime Workspace of a ``C.Workspace`` (or the argument itself)."""
    return ws._ws if isinstance(ws, Workspace) else ws


@contextlib.contextmanager
def workspace_guard(ws: Any) -> Iterator[None]:
    """Make the workspace object ``ws`` current, and the previous one again on exit."""
    runtime = runtime_workspace(ws)
    previous = api.CurrentWorkspace()
    registered = runtime.name in api._workspaces
    api.SwitchWorkspace(runtime)
    try:
        yield
    finally:
        api.SwitchWorkspace(previous)
        if not registered and api._workspaces.get(runtime.name) is runtime:
            del api._workspaces[runtime.name]


# --- DBs (dpgraph.db) --------------------------------------------------------------------------
def create_db(db_type: Any, source: Any, mode: Any) -> Any:
    """Open DB ``source`` of type ``db_type`` (``Mode.read``/``write``/``new``)."""
    from dpgraph.db import create_db as _create_db

    return _create_db(db_type, source, mode)


def registered_dbs() -> list[str]:
    """The DB types ``create_db`` knows (Caffe2's ``C.registered_dbs()``)."""
    from dpgraph.db import registered_dbs as _registered_dbs

    return list(_registered_dbs())


def __getattr__(name: str) -> Any:
    if name == "has_fbgemm":  # Save can write float tensors as bfloat16
        from dpgraph.ir.blob_size import HAS_BFLOAT16

        return HAS_BFLOAT16
    if name in ("Mode", "read", "write", "new"):
        from dpgraph.db import Mode

        return Mode if name == "Mode" else getattr(Mode, name)
    if name in ("has_cuda_support", "has_gpu_support"):
        from dpgraph.runtime.devices import NumGpuDevices

        return NumGpuDevices() > 0
    if name in _CPP_ONLY:
        raise NotSupportedError(
            f"workspace.C.{name} is a C++ internal of Caffe2 with no dpgraph equivalent; "
            f"{_CPP_ONLY[name]}")
    raise AttributeError(f"module 'workspace.C' has no attribute {name!r}")


_CPP_ONLY = {
    "memonger_compute_blob_recycling_for_dag": "use dpgraph.memonger.share_grad_blobs.",
    "optimize_inference_net": "use dpgraph.memonger.optimize_inference_fast.",
    "transform_addNNPACK": "dpgraph has no NNPACK engine.",
    "transform_fuseNNPACKConvRelu": "dpgraph has no NNPACK engine.",
    "transform_fuseConvBN": "fold batch norm into the conv weights in Python.",
    "onnxifi": "export with dpgraph.export.onnx and run under onnxruntime.",
    "run_workspace_transform": "dpgraph has no workspace transforms.",
}


# --- op schemas --------------------------------------------------------------------------------
class OpSchema:
    """Arity and in-place facts of a registered operator (``OpSchema.get(type)``)."""

    inf = 2147483647

    def __init__(self, schema: Any) -> None:
        self._schema = schema
        self.name = schema.type
        self.doc = schema.doc
        self.min_input = schema.min_inputs
        self.max_input = self.inf if schema.max_inputs is None else schema.max_inputs
        self.min_output = schema.min_outputs
        self.max_output = self.inf if schema.max_outputs is None else schema.max_outputs

    @staticmethod
    def get(op_type: str) -> OpSchema | None:
        schema = OPERATORS.get(op_type)
        return None if schema is None else OpSchema(schema)

    def num_inputs_allowed(self, n: int) -> bool:
        return self.min_input <= n <= self.max_input

    def num_outputs_allowed(self, n: int) -> bool:
        return self.min_output <= n <= self.max_output

    def num_inputs_outputs_allowed(self, n_in: int, n_out: int) -> bool:
        return self.num_inputs_allowed(n_in) and self.num_outputs_allowed(n_out)

    def CalculateOutput(self, num_input: int) -> int:
        """The output count for ``num_input`` inputs, or -1 when it is not fixed."""
        if self.min_output == self.max_output:
            return self.min_output
        return -1

    def inplace_enforced(self, input_index: int, output_index: int) -> bool:
        pairs = self._schema.extra.get("enforce_inplace", ())
        return (input_index, output_index) in {tuple(p) for p in pairs}

    def inplace_allowed(self, input_index: int, output_index: int) -> bool:
        return self._schema.allows_inplace(input_index, output_index)


# --- module-level workspace functions ----------------------------------------------------------
def feed_blob(name: Any, value: Any, device_option: Any = None) -> bool:
    return api.FeedBlob(name, value, device_option)


def fetch_blob(name: Any) -> Any:
    return api.FetchBlob(name)


def blobs() -> list[str]:
    return api.Blobs()


def has_blob(name: Any) -> bool:
    return api.HasBlob(name)


def create_blob(name: Any) -> bool:
    return api.CreateBlob(name)


def reset_blob(name: Any) -> bool:
    return api.ResetBlob(name)


def nets() -> list[str]:
    return api.Nets()


def run_net(name: Any, num_iter: int = 1, allow_fail: bool = False) -> bool:
    return api.RunNet(name, num_iter, allow_fail)


def create_net(net: Any, overwrite: bool = False) -> bool:
    return api.CreateNet(_net_proto(net), overwrite)


def run_net_once(net: Any) -> bool:
    return api.RunNetOnce(_net_proto(net))


def run_operator_once(op: Any) -> bool:
    return api.RunOperatorOnce(op)


def run_operator_multiple(op: Any, num_runs: int) -> bool:
    return api.RunOperatorMultiple(op, num_runs)


def run_plan(plan: Any) -> bool:
    return api.RunPlan(plan)


def switch_workspace(name: Any, create_if_missing: bool = False) -> None:
    api.SwitchWorkspace(name, create_if_missing)


def current_workspace() -> str:
    return api.CurrentWorkspace()


def workspaces() -> list[str]:
    return api.Workspaces()


def reset_workspace(root_folder: str | None = None) -> bool:
    return api.ResetWorkspace(root_folder)


def root_folder() -> str:
    return api.RootFolder()


def registered_operators() -> list[str]:
    return api.RegisteredOperators()


def global_init(args: Any) -> bool:
    return api.GlobalInit(args)


def num_cuda_devices() -> int:
    from dpgraph.runtime.devices import NumGpuDevices

    return NumGpuDevices()


is_asan = False
has_mkldnn = False
has_hip_support = False
use_mkldnn = False
use_trt = False
define_caffe2_no_operator_schema = False


def get_build_options() -> dict[str, str]:
    """Caffe2's build-option strings, answered for dpgraph: a pure-Python build whose
    kernels run on numpy (CuPy on real GPUs), with Gloo-style collectives and no MPI,
    NNPACK, MKL-DNN or ROCm."""
    from dpgraph.runtime.devices import real_gpu_count

    gpu = "ON" if real_gpu_count() > 0 else "OFF"
    return {"BLAS": "numpy", "BUILD_TYPE": "Release", "USE_CUDA": gpu, "USE_NCCL": gpu,
            "USE_GLOO": "ON", "USE_MPI": "OFF", "USE_NNPACK": "OFF", "USE_MKL": "OFF",
            "USE_MKLDNN": "OFF", "USE_ROCM": "OFF", "USE_OPENMP": "OFF",
            "USE_GFLAGS": "OFF", "USE_GLOG": "OFF", "CXX_FLAGS": ""}


__all__ = [
    "Blob", "Net", "OpSchema", "Workspace", "blobs", "create_blob", "create_db", "create_net",
    "current_workspace", "feed_blob", "fetch_blob", "global_init", "has_blob", "nets",
    "num_cuda_devices", "registered_operators", "reset_blob", "reset_workspace",
    "root_folder", "run_net", "run_net_once", "run_operator_once", "run_plan",
    "switch_workspace", "workspace_guard", "workspaces",
]


# --- workspace switching with workspace objects ----------------------------------------------
def SwitchWorkspace(name: Any, create_if_missing: bool | None = None) -> None:
    """``workspace.SwitchWorkspace`` also taking a ``C.Workspace`` object."""
    api.SwitchWorkspace(runtime_workspace(name), create_if_missing)


def WorkspaceGuard(workspace_name: Any) -> Any:
    """``workspace.WorkspaceGuard`` for a name or a ``C.Workspace`` object."""
    if isinstance(workspace_name, (Workspace, RuntimeWorkspace)):
        return workspace_guard(workspace_name)
    return api.WorkspaceGuard(workspace_name)


# --- FillRandomNetworkInputs -------------------------------------------------------------------
_FILL_TYPES = {
    "float": ("f", "float32"), "double": ("f", "float64"),
    "uint8_t": ("i", "uint8"), "unsigned char": ("i", "uint8"), "uint16_t": ("i", "uint16"),
    "int8_t": ("i", "int8"), "int16_t": ("i", "int16"), "int32_t": ("i", "int32"),
    "int": ("i", "int32"), "int64_t": ("i", "int64"), "long": ("i", "int64"),
    "bool": ("b", "uint8"),
}


def FillRandomNetworkInputs(net: Any, input_dims: Any, input_types: Any) -> None:
    """Create and randomly fill the inputs of ``net`` (op inputs no op of the net writes)
    in the current workspace: one ``input_dims`` / ``input_types`` entry per op that reads
    such inputs, in op order, with one shape and one type string per such input."""
    import numpy as np

    from dpgraph.errors import WorkspaceError

    proto = _net_proto(net)
    produced = {o for op in proto.op for o in op.output}
    readers = [(op, [b for b in op.input if b not in produced]) for op in proto.op]
    readers = [(op, names) for op, names in readers if names]
    if len(input_dims) != len(readers) or len(input_types) != len(readers):
        raise WorkspaceError(
            f"FillRandomNetworkInputs: {len(readers)} ops of net {proto.name!r} read network "
            f"inputs, but got {len(input_dims)} input_dims and {len(input_types)} input_types "
            "entries; give one entry per such op, in op order.")
    ws = api.current()
    for (op, names), dims, types in zip(readers, input_dims, input_types):
        if OPERATORS.get(op.type) is None:
            raise WorkspaceError(f"FillRandomNetworkInputs: op {op.type} has no schema.")
        if len(dims) != len(names) or len(types) != len(names):
            raise WorkspaceError(
                f"FillRandomNetworkInputs: op {op.type} reads {len(names)} network inputs "
                f"{names}, got {len(dims)} shapes and {len(types)} types.")
        for name, shape, type_name in zip(names, dims, types):
            if type_name not in _FILL_TYPES:
                raise WorkspaceError(f"FillRandomNetworkInputs: unknown type {type_name!r} "
                                     f"for {name}; use one of {sorted(_FILL_TYPES)}.")
            kind, dtype = _FILL_TYPES[type_name]
            if kind == "f":
                value = ws.rng.random(tuple(shape)).astype(dtype)
            elif kind == "b":
                value = ws.rng.integers(0, 2, tuple(shape)).astype(dtype)
            else:
                value = ws.rng.integers(0, 100, tuple(shape)).astype(dtype)
            ws.feed_blob(name, np.ascontiguousarray(value))


# --- engine preferences ------------------------------------------------------------------------
#: Caffe2's engine preferences; recorded for inspection.  dpgraph runs every engine's ops
#: with its own kernels, so they do not change which kernel runs.
ENGINE_PREFS: dict[str, Any] = {"global": {}, "op": {}}


def set_global_engine_pref(global_engine_pref: dict[Any, list[str]]) -> None:
    ENGINE_PREFS["global"] = dict(global_engine_pref)


def set_op_engine_pref(op_type: str, op_engine_pref: dict[Any, list[str]]) -> None:
    ENGINE_PREFS["op"][op_type] = dict(op_engine_pref)


def SetEnginePref(op_engine_pref: dict[str, Any], global_engine_pref: dict[Any, Any]) -> None:
    """``core.SetEnginePref``: per-op then global engine preferences."""
    for op_type, prefs in op_engine_pref.items():
        set_op_engine_pref(op_type, prefs)
    set_global_engine_pref(global_engine_pref)


def SetGlobalEnginePref(global_engine_pref: dict[Any, Any]) -> None:
    set_global_engine_pref(global_engine_pref)


def SetOpEnginePref(op_type: str, op_engine_pref: dict[Any, Any]) -> None:
    set_op_engine_pref(op_type, op_engine_pref)


# --- lazy imports (Caffe2's ``lazy`` module) ---------------------------------------------------
_LAZY_IMPORTS: list[Any] = []


def RegisterLazyImport(lazy: Any) -> None:
    """Register a function to call before operators are looked up."""
    _LAZY_IMPORTS.append(lazy)


def TriggerLazyImport() -> None:
    """Call every registered lazy-import function."""
    for lazy in list(_LAZY_IMPORTS):
        lazy()


def CreateNet(net: Any, overwrite: bool = False, input_blobs: Any = None) -> bool:
    """``workspace.CreateNet``: triggers the lazy imports first, as Caffe2's does.

    Unlike Caffe2 (whose operator constructors refuse inputs that do not exist yet), a net
    may be created before its inputs are fed; a missing input fails when the net runs.
    ``C.Workspace.create_net`` keeps Caffe2's check."""
    TriggerLazyImport()
    return api.CreateNet(net, overwrite, input_blobs)


# --- background plans and blob sizes (workspace.RunPlanInBackground / GetBlobSizeBytes) ---
class BackgroundPlan:
    """Caffe2's ``C.BackgroundPlan``: a plan running on its own thread in a workspace."""

    def __init__(self, workspace: RuntimeWorkspace, plan: Any) -> None:
        import threading

        self._error: BaseException | None = None
        self._succeeded = False
        self._thread = threading.Thread(target=self._run, args=(workspace, plan),
                                        name="dpgraph-background-plan", daemon=True)
        self._thread.start()

    def _run(self, workspace: RuntimeWorkspace, plan: Any) -> None:
        try:
            self._succeeded = bool(workspace.run_plan(plan))
        except BaseException as error:  # noqa: BLE001 - reported by is_succeeded
            self._error = error

    def is_done(self) -> bool:
        return not self._thread.is_alive()

    def is_succeeded(self) -> bool:
        """Whether the finished plan succeeded (Caffe2 refuses to answer while it runs)."""
        if not self.is_done():
            raise WorkspaceError("BackgroundPlan.is_succeeded: the plan is still running; "
                                 "poll is_done() first.")
        return self._succeeded and self._error is None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the plan finishes (or ``timeout`` seconds); True when done."""
        self._thread.join(timeout)
        return self.is_done()


def run_plan_in_background(plan: Any) -> BackgroundPlan:
    """Start ``plan`` (PlanDef, its bytes, Plan or ExecutionStep) in the current workspace."""
    from dpgraph.ir.plan import ExecutionStep, Plan

    if isinstance(plan, ExecutionStep):
        plan = Plan(plan)
    if isinstance(plan, bytes):
        proto = caffe2_pb2.PlanDef()
        proto.ParseFromString(plan)
        plan = proto
    return BackgroundPlan(api.current(), plan)


RunPlanInBackground = run_plan_in_background

#: ``sizeof(std::string)`` in Caffe2's (libstdc++, 64-bit) builds: a string tensor's size
#: counts it once per element plus the characters.
_STRING_ELEMENT_BYTES = 32


def GetBlobSizeBytes(name: Any) -> int:
    """Caffe2's blob size: a tensor's bytes (string tensors: elements × sizeof(std::string)
    plus their lengths); 0 for blobs that are not tensors."""
    import numpy as np

    value = api.FetchBlob(name)
    if not isinstance(value, np.ndarray):
        return 0
    if value.dtype.kind in "OSU":
        return int(value.size * _STRING_ELEMENT_BYTES
                   + sum(len(item) for item in value.reshape(-1)))
    return int(value.nbytes)
