"""The ``nccl`` backend: NCCL on real GPUs.

* One process driving several GPUs: CuPy's NCCL communicators (``NcclCommunicator.initAll``)
  reduce and broadcast between the local device copies.
* Several processes: ``torch.distributed``'s ``ProcessGroupNCCL`` over a prefix of the
  rendezvous store carries the cross-process step, on the first local copy.

Both are imported lazily; without them, :class:`~dpgraph.errors.MissingDependencyError` says
what to install.  NCCL has no timeouts of its own, so each collective runs in a worker thread
that is given ``timeout`` seconds before :class:`~dpgraph.errors.CollectiveTimeoutError`.

NCCL only moves GPU memory.  Host (numpy) buffers, such as the CPU staging copies of the
other-engine parameter sync and every blob on virtual GPUs, are summed on the host and cross
processes through a Gloo world on the same store (``<world>/host``), so NCCL-engine graphs
also run, unchanged, on machines without GPUs.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpgraph.collectives.base import DEFAULT_TIMEOUT_SEC, BaseBackend, check_buffers
from dpgraph.collectives.rendezvous import describe_missing, join_world
from dpgraph.errors import CollectiveError, DeviceError, MissingDependencyError


def _cupy_nccl() -> tuple[Any, Any]:
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as error:
        raise MissingDependencyError(
            "The nccl collective backend needs CuPy with NCCL: pip install cupy-cuda12x "
            "(matching your CUDA version).") from error
    return cupy, nccl


def check_available() -> None:
    """Raise unless CuPy, NCCL and at least one GPU are present."""
    cupy, _ = _cupy_nccl()
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except RuntimeError as error:  # CUDARuntimeError: no usable CUDA driver
        raise DeviceError(f"The nccl backend found no usable CUDA driver: {error}") from error
    if count < 1:
        raise DeviceError("The nccl backend needs a GPU; none is visible.")


_NCCL_TYPES = {"float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "float16": "NCCL_FLOAT16",
               "int32": "NCCL_INT32", "int64": "NCCL_INT64", "uint8": "NCCL_UINT8",
               "int8": "NCCL_INT8"}


def _run_bounded(fn: Callable[[], None], timeout: float) -> None:
    """Run ``fn`` in a worker thread; raise TimeoutError if it does not finish in time."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as error:  # handed to the caller
            failure.append(error)

    worker = threading.Thread(target=target, name="dpgraph-nccl", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"NCCL did not finish within {timeout:g}s")
    if failure:
        raise failure[0]


class NcclBackend(BaseBackend):
    """A common world over real GPUs (local copies through CuPy, ranks through torch)."""

    backend = "nccl"
    #: NCCL (CuPy's NcclError) and torch.distributed raise RuntimeError subclasses;
    #: ``_run_bounded`` raises TimeoutError for a collective that never completes
    peer_failures = (RuntimeError, TimeoutError)

    def __init__(self, store: Any, rank: int, size: int, name: str,
                 timeout: float = DEFAULT_TIMEOUT_SEC, engine: str = "NCCL") -> None:
        super().__init__(name, rank, size, timeout, engine)
        self.store = store
        self.members: dict[int, Any] = {}
        self._comms: dict[tuple[int, ...], list[Any]] = {}
        self._group: Any = None
        self._host: BaseBackend | None = None
        self._prefix = ""
        if size > 1:
            if store is None:
                raise CollectiveError(f"Common world {name!r}: nccl across {size} processes "
                                      "needs a store (kv_handler).")
            self._prefix, self.members = join_world(store, name, rank, size, engine, "tcp",
                                                    timeout)

    def clone(self, name: str) -> NcclBackend:
        return NcclBackend(self.store, self.rank, self.size, name, self.timeout, self.engine)

    def missing_ranks(self) -> str:
        if not self.members:
            return super().missing_ranks()
        return describe_missing(self.members, self.rank)

    def _check_dtype(self, buffers: Sequence[Any], op: str) -> None:
        if str(buffers[0].dtype) not in _NCCL_TYPES:
            raise CollectiveError(f"{self._what(op)}: NCCL cannot reduce {buffers[0].dtype}; "
                                  f"supported: {sorted(_NCCL_TYPES)}.")

    # --- local communicators -------------------------------------------------------------
    def _local_comms(self, buffers: Sequence[Any]) -> list[Any]:
        devices = tuple(int(b.device.id) for b in buffers)
        if len(set(devices)) != len(devices):
            raise CollectiveError(f"{self._what('nccl')}: two local copies live on one GPU "
                                  f"({list(devices)}); NCCL needs one copy per device.")
        if devices not in self._comms:
            _, nccl = _cupy_nccl()
            self._comms[devices] = nccl.NcclCommunicator.initAll(list(devices))
        return self._comms[devices]

    def _local(self, kind: str, buffers: Sequence[Any], root: int = 0) -> None:
        """NCCL ``kind`` ("allReduce", "reduce", "bcast") between the local copies, in place."""
        if len(buffers) == 1:
            return
        cupy, nccl = _cupy_nccl()
        comms = self._local_comms(buffers)
        dtype = getattr(nccl, _NCCL_TYPES[str(buffers[0].dtype)])
        count = int(buffers[0].size)
        nccl.groupStart()
        for comm, buffer in zip(comms, buffers):
            with cupy.cuda.Device(buffer.device.id):
                stream = cupy.cuda.get_current_stream().ptr
                ptr = buffer.data.ptr
                if kind == "allReduce":
                    comm.allReduce(ptr, ptr, count, dtype, nccl.NCCL_SUM, stream)
                elif kind == "reduce":
                    comm.reduce(ptr, ptr, count, dtype, nccl.NCCL_SUM, root, stream)
                else:
                    comm.bcast(ptr, count, dtype, root, stream)
        nccl.groupEnd()
        for buffer in buffers:
            with cupy.cuda.Device(buffer.device.id):
                cupy.cuda.get_current_stream().synchronize()

    # --- cross-process group -------------------------------------------------------------
    def _torch_group(self, device_id: int) -> tuple[Any, Any]:
        try:
            import torch
            import torch.distributed as dist
        except ImportError as error:
            raise MissingDependencyError("nccl across processes needs torch with CUDA: "
                                         "pip install torch") from error
        if not torch.cuda.is_available() or not dist.is_nccl_available():
            raise MissingDependencyError("nccl across processes needs a CUDA build of torch "
                                         "with NCCL; install one from pytorch.org.")
        if self._group is None:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = datetime.timedelta(seconds=self.timeout)
            torch.cuda.set_device(device_id)
            self._group = dist.ProcessGroupNCCL(
                dist.PrefixStore(self._prefix + "pg/", self.store), self.rank, self.size,
                options)
        return torch, dist

    def _remote(self, kind: str, buffer: Any, root: int = 0) -> None:
        torch, dist = self._torch_group(int(buffer.device.id))
        tensor = torch.as_tensor(buffer, device=f"cuda:{buffer.device.id}")
        if kind == "allreduce":
            work = self._group.allreduce([tensor])
        else:
            options = dist.BroadcastOptions()
            options.rootRank, options.rootTensor = root, 0
            work = self._group.broadcast([tensor], options)
        work.wait()
        torch.cuda.synchronize(int(buffer.device.id))

    # --- collectives -------------------------------------------------------------------
    @staticmethod
    def _on_host(buffers: Sequence[Any]) -> bool:
        return all(isinstance(b, np.ndarray) for b in buffers)

    def _host_world(self) -> BaseBackend:
        """The Gloo world that carries host buffers across processes (made on first use;
        every rank runs the same collectives, so every rank makes it at the same point)."""
        if self._host is None:
            from dpgraph.collectives import gloo

            self._host = gloo.create(store=self.store, rank=self.rank, size=self.size,
                                     name=f"{self.name}/host", timeout=self.timeout)
        return self._host

    def allreduce(self, buffers: Sequence[Any], timeout: float | None = None,
                  wire_dtype: str | None = None) -> list[Any]:
        buffers = list(buffers)
        if self._on_host(buffers):
            return super().allreduce(buffers, timeout, wire_dtype)
        check_buffers(buffers, self._what("allreduce"))
        self._check_dtype(buffers, "allreduce")

        def step() -> None:
            if self.size == 1:
                self._local("allReduce", buffers)
                return
            self._local("reduce", buffers)
            self._remote("allreduce", buffers[0])
            self._local("bcast", buffers)

        self._run("allreduce", timeout, lambda t: _run_bounded(step, t))
        return buffers

    def broadcast(self, buffers: Sequence[Any], root: int = 0,
                  timeout: float | None = None) -> list[Any]:
        buffers = list(buffers)
        if self._on_host(buffers):
            return super().broadcast(buffers, root, timeout)
        check_buffers(buffers, self._what("broadcast"))
        self._check_dtype(buffers, "broadcast")
        self._check_root(root, "broadcast")

        def step() -> None:
            if self.size > 1:
                self._remote("broadcast", buffers[0], root)
            self._local("bcast", buffers)

        self._run("broadcast", timeout, lambda t: _run_bounded(step, t))
        return buffers

    # Cross-process steps on one contiguous host buffer (see the module docstring).
    def _allreduce_host(self, buffer: np.ndarray, timeout: float) -> None:
        self._host_world()._allreduce_host(buffer, timeout)

    def _broadcast_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        self._host_world()._broadcast_host(buffer, root, timeout)

    def _reduce_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        self._host_world()._reduce_host(buffer, root, timeout)

    def _allgather_host(self, local: np.ndarray, out: np.ndarray, timeout: float) -> None:
        self._host_world()._allgather_host(local, out, timeout)

    def _barrier(self, timeout: float) -> None:
        self._host_world()._barrier(timeout)


def create(store: Any = None, rank: int = 0, size: int = 1, name: str = "nccl",
           timeout: float = DEFAULT_TIMEOUT_SEC, engine: str = "NCCL", **_: Any) -> NcclBackend:
    """Registry entry point."""
    return NcclBackend(store, rank, size, name, timeout, engine)
