"""Instantiated operators: everything an op needs to run, precomputed once per net.

An :class:`OpInstance` holds the schema, kernel, decoded arguments, device, array module,
blob names and an :class:`~dpgraph.ops.context.OpContext`, so running it is a few dict
look-ups, one placement check per input and the kernel call.  Kernels return their outputs;
they are stored only after the kernel succeeded, so a failing op never half-writes them.
"""

from __future__ import annotations

import sys
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpgraph.errors import (
    ArgumentError,
    BlobNotFoundError,
    DeviceError,
    DpgraphError,
    OperatorDefError,
    OperatorError,
    OperatorSchemaError,
    ResourceLimitError,
    ShapeError,
    UnknownOperatorError,
    UnregisteredOperatorError,
)
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.device import device_key, device_name, effective_device
from dpgraph.ir.registry import OPERATORS, OpSchema
from dpgraph.ops import observing
from dpgraph.ops.context import REMOVE_BLOB, OpContext
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import devices, fp_exceptions

DeviceKey = tuple[int, int]
Blobs = dict[str, Any]
Placement = dict[str, "DeviceKey | None"]
#: ``schema.extra[OUTPUT_PLACEMENT](op_key, input_keys, args) -> [key per output]``: ops whose
#: outputs do not live on the op's own device (CopyGPUToCPU, collectives).
OUTPUT_PLACEMENT = "output_placement"  # same key as dpgraph.ops.device_copy.OUTPUT_PLACEMENT

_ndarray = np.ndarray
OBSERVERS = observing.ACTIVE  # the same list: one truth test per op run


def _blob_and_references(blobs: Blobs, name: str) -> tuple[Any, int]:
    """Blob ``name``'s value and its reference count as seen here."""
    value = blobs.get(name)
    return value, sys.getrefcount(value)


#: What :func:`_blob_and_references` counts for an array only the blob table holds
#: (measured, not assumed: the count of temporaries differs across Python versions).
_SOLE_REFERENCES = _blob_and_references({"probe": np.empty(1)}, "probe")[1]


class RuntimeOpContext(OpContext):
    """OpContext whose unseeded random generator is derived from a per-op seed, and which
    lets kernels write into the arrays their output blobs hold from the previous run.

    Each op gets its own stream (workspace seed, net instantiation, op index), so the
    simple and the DAG executors draw the same numbers whatever order ops run in.
    """

    __slots__ = ("_entropy", "_blobs", "_reusable")

    def __init__(self, *args: Any, entropy: Sequence[int] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._entropy = list(entropy)
        self._blobs: Blobs | None = None
        inputs, outputs = set(self.op.input), list(self.op.output)
        #: Output names whose old array may be overwritten: not read by this op and not
        #: written twice by it (None where either holds).
        self._reusable = tuple(None if n in inputs or outputs.count(n) > 1 else n
                               for n in outputs)

    def reusable_output(self, index: int, shape: tuple[int, ...], dtype: Any
                        ) -> np.ndarray | None:
        """The array output ``index``'s blob holds from an earlier run, for the kernel to
        write this run's value into (as Caffe2 reuses an output tensor's memory), or None.

        Only a C-contiguous, writable numpy array that owns its memory, has ``shape`` and
        ``dtype`` and is referenced by nothing but the blob table qualifies: not an input
        of this op, not another blob, not the base of a view, not held by user code (fetched
        blobs are copies).  A kernel asks only after all its checks passed, so a failing op
        still leaves its outputs untouched.
        """
        name = self._reusable[index] if index < len(self._reusable) else None
        if name is None or self._blobs is None:
            return None
        value, references = _blob_and_references(self._blobs, name)
        if references != _SOLE_REFERENCES or type(value) is not _ndarray or \
                value.shape != shape or value.dtype != dtype or value.base is not None or \
                not value.flags.c_contiguous or not value.flags.writeable:
            return None
        return value

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:
            if self.device.HasField("random_seed"):
                self._rng = np.random.default_rng(self.device.random_seed)
            else:
                self._rng = np.random.default_rng(self._entropy)
        return self._rng


MISSING = object()


def _describe_value(value: Any, key: DeviceKey | None) -> str:
    where = device_name(key) if key is not None else "any device"
    if value is MISSING:
        return "missing"
    if value is None:
        return "empty"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{list(shape)} {getattr(value, 'dtype', '?')} on {where}"
    return f"{type(value).__name__}"


_mixed_classes: dict[type, type] = {}


def _error_class(cause: BaseException) -> type[OperatorError]:
    """OperatorError mixed with the cause's class, so ``except ShapeError`` still works."""
    if isinstance(cause, OperatorError):  # already one (e.g. QueueClosedError): keep its class
        return type(cause)
    cause_type = type(cause)
    if not isinstance(cause, Exception):
        return OperatorError
    cls = _mixed_classes.get(cause_type)
    if cls is None:
        try:
            cls = type(f"OperatorError[{cause_type.__name__}]", (OperatorError, cause_type),
                       {"__str__": lambda self: str(self.args[0]) if self.args else "",
                        "__init__": lambda self, msg: Exception.__init__(self, msg),
                        "__module__": "dpgraph.errors"})
        except TypeError:  # incompatible layouts (e.g. OSError subclasses)
            cls = OperatorError
        _mixed_classes[cause_type] = cls
    return cls


class OpInstance:
    """One operator of an instantiated net."""

    __slots__ = ("index", "op", "type", "schema", "kernel", "ctx", "key", "inputs", "outputs",
                 "control", "cross", "placement_fn", "real_gpu", "net_name", "n_out", "mutex",
                 "empty_inputs", "out_keys")

    def __init__(self, op: caffe2_pb2.OperatorDef, index: int, net_name: str,
                 net_device: caffe2_pb2.DeviceOption | None, workspace: Any,
                 entropy: Sequence[int]) -> None:
        self.index, self.op, self.type, self.net_name = index, op, op.type, net_name
        self.schema = _lookup_schema(op, index, net_name)
        self.kernel: Callable[..., Any] = self.schema.kernel  # type: ignore[assignment]
        device = effective_device(op, net_device)
        self.key: DeviceKey = interned_key(device_key(device))
        try:
            xp = devices.array_module(self.key)
        except DeviceError as error:
            raise DeviceError(f"{self._where()}: {error}") from None
        self.ctx = RuntimeOpContext(op, arguments_dict(op.arg), xp, device, workspace,
                                    entropy=[*entropy, index])
        self.inputs = tuple(op.input)
        self.outputs = tuple(op.output)
        self.n_out = len(self.outputs)
        self.control = tuple(op.control_input)
        self.cross = self.schema.cross_device
        self.placement_fn: Callable[..., list[DeviceKey]] | None = self.schema.extra.get(
            OUTPUT_PLACEMENT)
        self.real_gpu = devices.is_gpu(self.key) and xp is not np
        # resolved once here rather than on every run
        mutex = self.schema.mutex_input
        self.mutex: int | None = mutex if mutex is not None and mutex < len(self.inputs) \
            else None
        self.empty_inputs = self.schema.empty_inputs
        self.out_keys = (self.key,) * self.n_out

    def close(self) -> None:
        """The instance is destroyed: what its kernel keeps (a prefetch) is released."""
        self.ctx.close()

    def _where(self) -> str:
        net = f" of net {self.net_name!r}" if self.net_name else ""
        return f"Operator {self.index} ({self.type}){net} on {device_name(self.key)}"

    # --- running -------------------------------------------------------------------------
    def run(self, blobs: Blobs, placement: Placement) -> None:
        """Read inputs, check placements, run the kernel, store the outputs (all under the
        op's mutex input, when its schema names one)."""
        if self.mutex is None and not OBSERVERS:
            self._run(blobs, placement)
        elif OBSERVERS:  # a net with observers runs: they hear of this run
            start = time.perf_counter()
            try:
                with observing.running(self):
                    self._run_guarded(blobs, placement)
            finally:
                observing.report(self, time.perf_counter() - start)
        else:
            self._run_guarded(blobs, placement)

    def _run_guarded(self, blobs: Blobs, placement: Placement) -> None:
        """``_run`` under the lock of the op's mutex input (when it names one that has)."""
        lock = None if self.mutex is None else \
            getattr(blobs.get(self.inputs[self.mutex]), "lock", None)
        if lock is None:
            self._run(blobs, placement)
            return
        with lock:
            self._run(blobs, placement)

    def _run(self, blobs: Blobs, placement: Placement) -> None:
        try:
            values = list(map(blobs.__getitem__, self.inputs))
        except KeyError:
            raise self._missing(blobs, placement) from None
        key, cross, names = self.key, self.cross, self.inputs
        for index, value in enumerate(values):
            if value is None:
                if index in self.empty_inputs:
                    continue
                raise self.failure(BlobNotFoundError(
                    f"input blob {names[index]!r} is empty (created but never written, or "
                    f"freed)."), values, placement)
            if not cross:
                where = placement.get(names[index])  # keys are interned: mostly identical
                if where is not key and where is not None and where != key and \
                        not devices.can_read(key, where):
                    raise self.failure(self._device_error(names[index], where), values,
                                       placement)
        if self.real_gpu and not self.cross:
            values = _host_inputs_to_device(values, key)
        ctx = self.ctx
        ctx.inputs = values
        ctx._blobs = blobs
        try:
            if self.real_gpu:
                with devices.device_context(key):
                    outs = self.kernel(ctx)
            elif fp_exceptions.state.active:  # GlobalInit --caffe2_operator_throw_if_fp_*
                outs = fp_exceptions.run_kernel(self.kernel, ctx)
            else:
                outs = self.kernel(ctx)
            if outs is None or len(outs) != self.n_out:
                raise OperatorSchemaError(
                    f"the kernel returned {0 if outs is None else len(outs)} values for "
                    f"{self.n_out} outputs.")
        except Exception as error:
            failure = self.failure(error, values, placement)
            raise failure from failure.__cause__
        finally:
            ctx.inputs = []
        if self.n_out == 1 and self.placement_fn is None and type(outs[0]) is _ndarray:
            name = self.outputs[0]  # the usual single array output, stored right here
            blobs[name] = outs[0]
            placement[name] = key
            return
        self._store(blobs, placement, values, outs)

    def _store(self, blobs: Blobs, placement: Placement, values: list[Any],
               outs: Sequence[Any]) -> None:
        if self.placement_fn is None:
            keys: Sequence[DeviceKey] = self.out_keys
        else:
            keys = self.placement_fn(self.key, [placement.get(n) for n in self.inputs],
                                     self.ctx.args)
        if self.n_out > 1:
            outs = _unshared(outs)
        for name, value, key in zip(self.outputs, outs, keys):
            if type(value) is not _ndarray:
                if isinstance(value, np.generic):
                    value = np.asarray(value)
                elif value is REMOVE_BLOB:
                    blobs.pop(name, None)
                    placement.pop(name, None)
                    continue
                elif not devices.is_array(value):
                    blobs[name] = value
                    placement[name] = None
                    continue
            blobs[name] = value
            placement[name] = key

    # --- errors --------------------------------------------------------------------------
    def _missing(self, blobs: Blobs, placement: Placement) -> OperatorError:
        missing = [n for n in self.inputs if n not in blobs]
        return self.failure(BlobNotFoundError(
            f"Encountered a non-existing input blob: {missing[0]!r}; feed it with "
            f"workspace.FeedBlob or run the net that produces it first."),
            [blobs.get(n, MISSING) for n in self.inputs], placement)

    def _device_error(self, name: str, where: DeviceKey) -> DeviceError:
        return DeviceError(
            f"input blob {name!r} lives on {device_name(where)} but the op runs on "
            f"{device_name(self.key)}, which cannot read it; insert a Copy (or CopyGPUToCPU/"
            f"CopyCPUToGPU) op, or run the op on {device_name(where)}.")

    def failure(self, cause: BaseException, values: Sequence[Any],
                placement: Placement | None = None) -> OperatorError:
        """An OperatorError naming this op, its blobs and device, for ``cause``."""
        from dpgraph.ir.net import operator_tracebacks

        raw = isinstance(cause, (ValueError, IndexError)) and not isinstance(cause, DpgraphError) \
            and not self.type.startswith("Python")  # user code raised: no guessing
        cause = _typed_cause(cause, self.type)
        # a failed check of the op's inputs or arguments is Caffe2's EnforceNotMet: scripts
        # and tests look for its "[enforce fail at ...]" prefix
        enforce = f"[enforce fail at {self.type}] " if isinstance(
            cause, (ShapeError, ArgumentError)) else ""
        lines = [f"{self._where()} failed: {enforce}{type(cause).__name__}: {cause}"]
        lines.append("  inputs: " + ", ".join(
            f"{n} ({_describe_value(v, (placement or {}).get(n))})"
            for n, v in zip(self.inputs, values)) if self.inputs else "  inputs: none")
        lines.append(f"  outputs: {', '.join(self.outputs) or 'none'}")
        if raw:
            lines.append(_raw_failure_hint(self.type))
        elif isinstance(cause, (ShapeError, ArgumentError)) and "hint:" not in str(cause):
            lines.append(f"  hint: fix the input blobs or the arguments of {self.type} named "
                         f"above (see dpgraph.ir.registry.OPERATORS.lookup({self.type!r}).doc).")
        stack = operator_tracebacks.get(self.net_name, {}).get(self.index) \
            if self.net_name else None
        if stack:
            lines.append("  op created at (most recent call last):")
            lines.extend(f'    File "{file}", line {line}, in {function}'
                         for file, line, function in reversed(stack[:4]))
        error = _error_class(cause)("\n".join(lines))
        for attribute, value in (("op_index", self.index), ("op_type", self.type),
                                 ("net_name", self.net_name), ("device", device_name(self.key))):
            setattr(error, attribute, value)
        error.__cause__ = cause
        return error


def _typed_cause(cause: BaseException, op_type: str) -> BaseException:
    """The typed error for an untyped kernel failure: numpy's MemoryError becomes a
    :class:`ResourceLimitError`, a bare ValueError (numpy refusing a shape) a
    :class:`ShapeError`; Python ops (user code) and typed errors stay as they are."""
    if isinstance(cause, DpgraphError) or op_type.startswith("Python"):
        return cause
    if isinstance(cause, MemoryError):
        typed: BaseException = ResourceLimitError(
            f"{cause} — the op needs more memory than this machine can give; check the "
            "shapes and arguments that size its outputs, or use a smaller batch")
    elif type(cause) is ValueError:
        typed = ShapeError(str(cause))
    else:
        return cause
    typed.__cause__ = cause
    return typed


def _unshared(outs: Sequence[Any]) -> Sequence[Any]:
    """``outs`` with any array returned for two outputs copied for the second: two blobs
    never share one array, so a kernel updating one blob in place cannot change another."""
    if len(outs) == 2 and outs[0] is not outs[1]:
        return outs
    if len(outs) == 3 and outs[0] is not outs[1] and outs[0] is not outs[2] and \
            outs[1] is not outs[2]:
        return outs
    seen: set[int] = set()
    result: list[Any] | None = None
    for index, value in enumerate(outs):
        if id(value) in seen and hasattr(value, "copy") and devices.is_array(value):
            result = list(outs) if result is None else result
            result[index] = value.copy()
        seen.add(id(value))
    return outs if result is None else result


def _raw_failure_hint(op_type: str) -> str:
    """What to do when a kernel failed inside numpy/Python rather than with a checked
    error: some input does not fit the op, so point at the listed shapes and the doc."""
    forward = op_type[:-len("Gradient")] if op_type.endswith("Gradient") else ""
    mirror = (f" (a gradient op: its inputs must mirror those of the forward {forward} op "
              f"and its output gradients)") if forward else ""
    return (f"  hint: an input's shape or dtype listed above does not fit {op_type}{mirror}; "
            f"fix that blob or the op's arguments (see "
            f"dpgraph.ir.registry.OPERATORS.lookup({op_type!r}).doc).")


def _host_inputs_to_device(values: list[Any], key: DeviceKey) -> list[Any]:
    """On a real GPU, host arrays a GPU op reads (counters, learning rates) are copied to
    the op's GPU so the kernel sees one array type."""
    return [devices.to_device(v, key) if type(v) is _ndarray else v for v in values]


def _lookup_schema(op: caffe2_pb2.OperatorDef, index: int, net_name: str) -> OpSchema:
    where = f"op {index} of net {net_name!r}" if net_name else f"op {index}"
    try:
        schema = OPERATORS.lookup(op.type)
    except UnknownOperatorError as error:
        raise UnregisteredOperatorError(f"{error} ({where}, inputs {list(op.input)}, outputs "
                                        f"{list(op.output)})") from None
    problem = schema.check_arity(len(op.input), len(op.output))
    if problem:
        raise OperatorDefError(f"{problem} ({where}: inputs {list(op.input)}, outputs "
                               f"{list(op.output)}).")
    if schema.kernel is None:
        raise OperatorDefError(f"Operator {op.type} ({where}) has no kernel in dpgraph; "
                               "register one with dpgraph.ir.registry.register_op, or remove "
                               "the op from the net.")
    return schema


_KEYS: dict[DeviceKey, DeviceKey] = {}


def interned_key(key: DeviceKey) -> DeviceKey:
    """One tuple object per device key, so placement checks mostly compare identities."""
    return _KEYS.setdefault(key, key)


def net_entropy(seed: int, counter: int, net_name: str) -> list[int]:
    """Entropy for the per-op generators of one net instantiation."""
    return [seed, counter, zlib.crc32(net_name.encode())]


def is_dpgraph_error(error: BaseException) -> bool:
    return isinstance(error, DpgraphError)
