"""Caffe2's module-level workspace API over the process's *current* workspace.

:mod:`dpgraph.workspace` re-exports these names.  The current workspace is the one piece of
global state the Caffe2 API requires.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from google.protobuf.message import Message

from dpgraph.errors import (
    DpgraphError,
    NotSupportedError,
    ProtoError,
    WorkspaceError,
    WorkspaceNameError,
)
from dpgraph.ir.blob import BlobReference, blob_name
from dpgraph.ir.registry import OPERATORS
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import fp_exceptions, numa
from dpgraph.runtime.serialization import deserialize_blob, serialize_blob
from dpgraph.runtime.shapes import infer_shapes_and_types
from dpgraph.runtime.workspace import Workspace, WorkspaceArgumentError, net_name

_registry_lock = threading.RLock()
_workspaces: dict[str, Workspace] = {"default": Workspace("default")}
_current: list[str] = ["default"]


def current() -> Workspace:
    """The current Workspace object."""
    return _workspaces[_current[0]]


def resolve(workspace: Any = None) -> Any:
    """``workspace`` when given, else the current workspace."""
    return current() if workspace is None else workspace


# --- workspaces ------------------------------------------------------------------------------
def CurrentWorkspace() -> str:
    return _current[0]


def Workspaces() -> list[str]:
    return sorted(_workspaces)


def SwitchWorkspace(name: Any, create_if_missing: bool | None = None) -> None:
    """Make workspace ``name`` (or a Workspace object) current."""
    with _registry_lock:
        if isinstance(name, Workspace):
            _workspaces.setdefault(name.name, name)
            _current[0] = name.name
            return
        name = str(name)
        if name not in _workspaces:
            if not create_if_missing:
                raise WorkspaceError(f"Workspace {name!r} does not exist; pass "
                                     "create_if_missing=True to create it.")
            _workspaces[name] = Workspace(name, root_folder=current().root_folder)
        _current[0] = name


def ResetWorkspace(root_folder: str | None = None) -> bool:
    """Drop every blob and net of the current workspace (root folder kept unless given)."""
    if root_folder is not None and not isinstance(root_folder, (str, os.PathLike)):
        raise WorkspaceArgumentError(
            f"ResetWorkspace: root_folder must be a path (str) or None, got "
            f"{type(root_folder).__name__} {root_folder!r}; nothing was reset.")
    current().reset(root_folder)
    return True


def RootFolder() -> str:
    return current().root_folder


@contextlib.contextmanager
def WorkspaceGuard(workspace_name: str) -> Iterator[None]:
    """Switch to ``workspace_name`` (created if missing) and switch back on exit."""
    previous = CurrentWorkspace()
    SwitchWorkspace(workspace_name, True)
    try:
        yield
    finally:
        SwitchWorkspace(previous)


# --- blobs -----------------------------------------------------------------------------------
def StringifyBlobName(name: Any) -> str:
    """The name of a str/bytes/BlobReference blob; anything else is a WorkspaceNameError."""
    if not isinstance(name, (str, bytes, BlobReference)):
        raise WorkspaceNameError(
            f"Expected a string or BlobReference as the blob name, got "
            f"{type(name).__name__} {name!r}.")
    return blob_name(name)


def Blobs() -> list[str]:
    return current().blobs()


def HasBlob(name: Any) -> bool:
    return current().has_blob(StringifyBlobName(name))


def CreateBlob(name: Any) -> bool:
    current().create_blob(StringifyBlobName(name))
    return True


def ResetBlob(name: Any) -> bool:
    current().reset_blob(StringifyBlobName(name))
    return True


def FeedBlob(name: Any, arr: Any, device_option: caffe2_pb2.DeviceOption | None = None) -> bool:
    """Copy ``arr`` into blob ``name`` on ``device_option`` (default: current device scope)."""
    return current().feed_blob(StringifyBlobName(name), arr, device_option)


def FetchBlob(name: Any) -> Any:
    """A host copy of a blob (bytes for string blobs); missing -> "Can't find blob"."""
    return current().fetch_blob(StringifyBlobName(name))


def FetchInt8Blob(name: Any) -> Any:
    """Caffe2's Int8 tensor fetch: dpgraph has no Int8 tensor blobs."""
    raise NotSupportedError(
        f"FetchInt8Blob({StringifyBlobName(name)!r}): dpgraph has no quantised Int8 blobs; "
        "use FetchBlob.")


def FetchBlobs(names: Iterable[Any]) -> list[Any]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise WorkspaceArgumentError(
            f"FetchBlobs takes a list of blob names, got {type(names).__name__} {names!r}; "
            "use FetchBlob for one blob.")
    return [FetchBlob(n) for n in names]


def SerializeBlob(name: Any) -> bytes:
    """The blob as BlobProto bytes."""
    ws = current()
    name = StringifyBlobName(name)
    return serialize_blob(name, ws.fetch_blob(name), ws.placement(name))


def DeserializeBlob(name: Any, serialized: bytes) -> bool:
    """Store the value of BlobProto bytes into blob ``name`` on the CPU."""
    try:
        _, value = deserialize_blob(serialized)
    except DpgraphError as error:
        raise type(error)(f"DeserializeBlob({StringifyBlobName(name)!r}): {error}") from error
    if isinstance(value, bytes):
        current().set_blob(StringifyBlobName(name), value, None)
    else:
        current().feed_blob(StringifyBlobName(name), value, caffe2_pb2.DeviceOption())
    return True


class _BlobDict:
    """``workspace.blobs``: a dict-like view of the current workspace's blobs."""

    def __getitem__(self, name: Any) -> Any:
        return FetchBlob(name)

    def __setitem__(self, name: Any, value: Any) -> None:
        FeedBlob(name, value)

    def __len__(self) -> int:
        return len(Blobs())

    def __iter__(self) -> Iterator[str]:
        return iter(Blobs())

    def __contains__(self, name: Any) -> bool:
        return HasBlob(name)

    def keys(self) -> list[str]:
        return Blobs()

    def items(self) -> list[tuple[str, Any]]:
        return [(n, FetchBlob(n)) for n in Blobs()]


blobs = _BlobDict()


# --- nets, operators, plans ------------------------------------------------------------------
def StringifyProto(obj: Any) -> Any:
    """str/bytes pass through; protobuf messages serialise; objects with Proto() too."""
    if isinstance(obj, (str, bytes)):
        return obj
    if isinstance(obj, Message):
        return obj.SerializeToString()
    if hasattr(obj, "Proto"):
        return obj.Proto().SerializeToString()
    raise ProtoError(f"Unexpected argument to StringifyProto of type {type(obj).__name__}; "
                     "pass a str, bytes, a protobuf message or an object with Proto().")


def StringifyNetName(name: Any) -> str:
    """The name of a net given as a string or a Net object (not a NetDef, as in Caffe2)."""
    if not isinstance(name, (str, bytes)) and not hasattr(name, "Name"):
        raise WorkspaceNameError(
            f"Expected a string or Net as the net name, got {type(name).__name__}; pass "
            "net.name for a NetDef (create it with CreateNet first).")
    return net_name(name)


def GetNetName(net: Any) -> str:
    """The name of a net given as a string, Net or NetDef."""
    if isinstance(net, (str, bytes, caffe2_pb2.NetDef)) or hasattr(net, "Name"):
        return net_name(net)
    raise WorkspaceNameError(f"Not a Net object: {net!r}")


def CreateNet(net: Any, overwrite: bool = False, input_blobs: Iterable[Any] | None = None
              ) -> bool:
    """Create ``net`` (Net, NetDef or bytes) in the current workspace."""
    current().create_net(net, overwrite, [StringifyBlobName(b) for b in input_blobs or ()])
    return True


def RunNet(name: Any, num_iter: int = 1, allow_fail: bool = False) -> bool:
    """Run a created net ``num_iter`` times. With allow_fail, an op reporting failure (``Fail``,
    a queue op on a closed queue), a cancelled run or a missing input returns False instead of
    raising; an exception an op's kernel throws still propagates, as in Caffe2."""
    return current().run_net(StringifyNetName(name), num_iter, allow_fail)


def BenchmarkNet(name: Any, warmup_runs: int, main_runs: int, run_individual: bool
                 ) -> list[float]:
    """Time a created net like Caffe2: ``[ms per run of the whole net, *ms per op]``.

    The net runs ``warmup_runs`` untimed times, then ``main_runs`` timed times; with
    ``run_individual`` each op is then also run ``main_runs`` times on its own, in op order,
    and its mean time follows (one value per op).
    """
    instance = current().net(StringifyNetName(name))
    for label, count in (("warmup_runs", warmup_runs), ("main_runs", main_runs)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise WorkspaceError(f"BenchmarkNet({instance.name!r}): {label} must be an int "
                                 f">= 0, got {count!r}.")
    for _ in range(warmup_runs):
        instance.run()
    start = time.perf_counter()
    for _ in range(main_runs):
        instance.run()
    results = [_ms_per_run(time.perf_counter() - start, main_runs)]
    if run_individual:
        ws = instance.workspace
        per_op = [0.0] * len(instance.ops)
        for _ in range(main_runs):
            for index, op in enumerate(instance.ops):
                start = time.perf_counter()
                op.run(ws._blobs, ws._placement)
                per_op[index] += time.perf_counter() - start
        results.extend(_ms_per_run(t, main_runs) for t in per_op)
    return results


def _ms_per_run(seconds: float, runs: int) -> float:
    """Mean milliseconds per run; 0 for no runs (where Caffe2 divided by zero)."""
    return seconds * 1e3 / runs if runs else 0.0


def RunNetOnce(net: Any) -> bool:
    return current().run_net_once(net)


def RunOperatorOnce(operator: Any) -> bool:
    return current().run_operators_once([_as_op(operator)])


def RunOperatorMultiple(operator: Any, num_runs: int) -> bool:
    """Create ``operator`` once and run it ``num_runs`` times."""
    return current().run_operator_multiple(_as_op(operator), int(num_runs))


def RunOperatorsOnce(operators: Iterable[Any]) -> bool:
    for op in operators:
        RunOperatorOnce(op)
    return True


def _as_op(operator: Any) -> caffe2_pb2.OperatorDef:
    if isinstance(operator, caffe2_pb2.OperatorDef):
        return operator
    if isinstance(operator, bytes):
        proto = caffe2_pb2.OperatorDef()
        proto.ParseFromString(operator)
        return proto
    raise WorkspaceError(f"Expected an OperatorDef, got {type(operator).__name__}.")


def RunPlan(plan_or_step: Any) -> bool:
    return current().run_plan(plan_or_step)


def Nets() -> list[str]:
    return current().nets()


def InferShapesAndTypes(nets: Iterable[Any], blob_dimensions: Mapping[str, Any] | None = None,
                        nets_proto: bool = False, blob_types: Mapping[str, int] | None = None
                        ) -> tuple[dict[str, list[int]], dict[str, int]]:
    """``(shapes, types)`` of the nets' blobs; see :mod:`dpgraph.runtime.shapes`."""
    if not isinstance(nets, Iterable) or hasattr(nets, "Proto") or \
            isinstance(nets, caffe2_pb2.NetDef):
        raise WorkspaceArgumentError(
            f"InferShapesAndTypes takes a list of nets, got {type(nets).__name__}; pass [net].")
    return infer_shapes_and_types(nets, current(), blob_dimensions, blob_types)


def RegisteredOperators() -> list[str]:
    return OPERATORS.types()


# --- GlobalInit ------------------------------------------------------------------------------
_KNOWN_FLAGS = frozenset({
    "caffe2_log_level", "caffe2_gpu_memory_tracking", "caffe2_gpu_memory_report_interval_mb",
    "caffe2_cuda_memory_pool", "caffe2_cub_bin_growth", "caffe2_cub_min_bin",
    "caffe2_cub_max_bin", "caffe2_cub_max_managed_mb", "caffe2_cub_print_allocation_events",
    "caffe2_print_blob_sizes_at_exit", "caffe2_keep_on_shrink",
    "caffe2_max_keep_on_shrink_memory", "caffe2_mkl_num_threads", "caffe2_omp_num_threads",
    "caffe2_use_fatal_for_enforce", "caffe2_print_stacktraces",
    "caffe2_report_cpu_memory_usage", "caffe2_cpu_allocator_do_zero_fill",
    "caffe2_cpu_allocator_do_junk_fill", "caffe2_disable_implicit_engine_preference",
    "caffe2_handle_executor_threads_exceptions", "caffe2_serialize_fp16_as_bytes",
    "caffe2_tensor_chunk_size", "caffe2_max_tensor_serializer_threads",
    "caffe2_workspace_stack_debug", "caffe2_net_async_max_gpus",
    "caffe2_net_async_max_numa_nodes", "caffe2_net_async_thread_pool_size",
    "caffe2_net_async_names_to_trace", "caffe2_net_async_tracing_nth",
    "caffe2_net_async_inference_mode", "caffe2_streams_per_gpu", "caffe2_dag_net_collect_stats",
    "caffe2_override_executor", "caffe2_cudnn_ws_nbytes_limit",
    "caffe2_simple_net_benchmark_run_whole_net", "caffe2_quit_on_unsupported_cpu_feature",
    "caffe2_version", "caffe2_engine",
    "v", "minloglevel", "logtostderr", "alsologtostderr", "stderrthreshold", "log_dir",
}) | fp_exceptions.FLAGS | {numa.NUMA_FLAG}
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}


def GlobalInit(args: Iterable[str]) -> bool:
    """Accept Caffe2's command-line flags; ``--caffe2_log_level`` sets dpgraph's log level.

    The first element is the program name, as in Caffe2.  Unknown flags give a warning.
    """
    args = list(args)
    for arg in args[1:]:
        if not arg.startswith("-"):
            continue
        flag, _, value = arg.lstrip("-").partition("=")
        if flag not in _KNOWN_FLAGS:
            warnings.warn(f"GlobalInit: unknown flag {arg!r} ignored.", stacklevel=2)
            continue
        if flag == "caffe2_log_level" and value:
            try:
                level = int(value)
            except ValueError:
                warnings.warn(f"GlobalInit: {arg!r} needs an integer level.", stacklevel=2)
                continue
            logging.getLogger("dpgraph").setLevel(
                logging.DEBUG if level < 0 else _LOG_LEVELS.get(level, logging.CRITICAL))
        elif flag in ("caffe2_omp_num_threads", "caffe2_mkl_num_threads") and value:
            os.environ.setdefault("OMP_NUM_THREADS", value)
        elif flag in fp_exceptions.FLAGS:
            fp_exceptions.set_flag(flag, value)
    return True
