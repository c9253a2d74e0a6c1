"""What a kernel sees when it runs: :class:`OpContext`.

A kernel is ``fn(ctx: OpContext) -> Sequence[value]`` returning one value per output.
Kernels never write blobs themselves: the executor stores the returned values only after
the kernel succeeded, so a failing op leaves its outputs untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from dpgraph.errors import ArgumentError, ShapeError
from dpgraph.ir.proto_io import check_tensor_size
from dpgraph.proto import caffe2_pb2

Outputs = Sequence[Any]
T = TypeVar("T")


class _RemoveBlob:
    """The type of :data:`REMOVE_BLOB`."""

    def __repr__(self) -> str:
        return "REMOVE_BLOB"


#: An output value meaning "remove this blob from the workspace" (Load with
#: ``allow_incomplete`` drops requested blobs it did not find and that held nothing before).
REMOVE_BLOB = _RemoveBlob()


class OpContext:
    """One operator instance, bound to a workspace and a device.

    Attributes:
        op: the OperatorDef.
        inputs: input values for this run (arrays, or opaque objects such as mutexes).
        args: decoded arguments ``{name: value}``.
        xp: the array module of the device (numpy, or CuPy on a real GPU).
        device: the effective DeviceOption.
        workspace: the runtime workspace (stateful ops only: queues, common worlds).
    """

    __slots__ = ("op", "inputs", "args", "xp", "device", "workspace", "_rng", "_state")

    def __init__(self, op: caffe2_pb2.OperatorDef, args: dict[str, Any], xp: Any,
                 device: caffe2_pb2.DeviceOption, workspace: Any = None) -> None:
        self.op = op
        self.args = args
        self.xp = xp
        self.device = device
        self.workspace = workspace
        self.inputs: list[Any] = []
        self._rng: np.random.Generator | None = None
        self._state: dict[str, Any] | None = None

    # --- arguments ---------------------------------------------------------------------
    def arg(self, name: str, default: Any = None) -> Any:
        """The argument ``name``, or ``default`` when the op does not set it."""
        return self.args.get(name, default)

    def has_arg(self, name: str) -> bool:
        return name in self.args

    def int_arg(self, name: str, default: int = 0) -> int:
        value = self.args.get(name, default)
        if isinstance(value, list) or value is None:
            raise ArgumentError(self.describe(f"argument {name!r} must be an int, got {value!r}"))
        return self._as_int(name, value)

    def _as_int(self, name: str, value: Any) -> int:
        """``value`` as an int; a string or a float with a fraction raises ArgumentError
        naming the argument (instead of Python's ValueError, or silent truncation)."""
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            return int(value)
        raise ArgumentError(self.describe(
            f"argument {name!r} must hold integers, got {type(value).__name__} {value!r}; "
            "pass whole numbers"))

    def float_arg(self, name: str, default: float = 0.0) -> float:
        value = self.args.get(name, default)
        if isinstance(value, list) or value is None:
            raise ArgumentError(self.describe(f"argument {name!r} must be a number, got {value!r}"))
        return float(value)

    def ints_arg(self, name: str, default: Sequence[int] = ()) -> list[int]:
        value = self.args.get(name, default)
        return [self._as_int(name, v)
                for v in (value if isinstance(value, (list, tuple)) else [value])]

    def floats_arg(self, name: str, default: Sequence[float] = ()) -> list[float]:
        value = self.args.get(name, default)
        return [float(v) for v in (value if isinstance(value, (list, tuple)) else [value])]

    def str_arg(self, name: str, default: str = "") -> str:
        value = self.args.get(name, default)
        return value.decode() if isinstance(value, bytes) else str(value)

    # --- blobs -------------------------------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.op.input)

    @property
    def num_outputs(self) -> int:
        return len(self.op.output)

    def input_name(self, index: int) -> str:
        return self.op.input[index]

    def output_name(self, index: int) -> str:
        return self.op.output[index]

    def prev_output(self, index: int) -> Any:
        """The value output ``index`` holds before this run (``None`` if it has none)."""
        if self.workspace is None:
            return None
        return self.workspace.get_blob_or_none(self.op.output[index], self.device)

    @property
    def rng(self) -> np.random.Generator:
        """A random generator, seeded from ``device_option.random_seed`` when set."""
        if self._rng is None:
            if self.device.HasField("random_seed"):
                self._rng = np.random.default_rng(self.device.random_seed)
            elif self.workspace is not None:
                self._rng = self.workspace.rng
            else:
                self._rng = np.random.default_rng()
        return self._rng

    # --- per-instance state ------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What the kernel keeps across runs of this op instance (Caffe2's operator members,
        such as a prefetch thread); it goes with the instance."""
        if self._state is None:
            self._state = {}
        return self._state

    def close(self) -> None:
        """The op instance is destroyed (its net deleted, replaced or run once, the workspace
        reset, the end of RunOperatorOnce): state values with a ``close()`` are closed, the
        latest first (a prefetcher before the reader it reads)."""
        state, self._state = self._state, None
        for value in reversed((state or {}).values()):
            close = getattr(value, "close", None)
            if close is not None:
                close()

    # --- errors ------------------------------------------------------------------------
    def describe(self, problem: str) -> str:
        """``problem`` prefixed with the op type and its blobs, for error messages."""
        return (f"{self.op.type} (inputs {list(self.op.input)}, outputs {list(self.op.output)}): "
                f"{problem}")

    def check_output_size(self, shape: Sequence[int], dtype: Any, index: int = 0) -> None:
        """Refuse, before allocating, an output of ``shape`` above ``max_tensor_bytes()``
        (a ResourceLimitError naming this op and the output)."""
        output = self.op.output[index] if index < len(self.op.output) else f"#{index}"
        check_tensor_size([int(d) for d in shape], np.dtype(dtype).itemsize,
                          self.describe(f"output {output!r}"))

    def fail(self, problem: str) -> ShapeError:
        """A ShapeError naming this op; ``raise ctx.fail('...')``."""
        return ShapeError(self.describe(problem))

    def object_input(self, index: int, kind: type[T], what: str, made_by: str) -> T:
        """Input ``index`` as the ``kind`` object an earlier op made (a queue, cursor,
        timer...), or a ShapeError naming the op that makes one."""
        value = self.inputs[index]
        if not isinstance(value, kind):
            raise self.fail(f"input {index} ({self.input_name(index)}) must be a {what} made "
                            f"by {made_by}, got {type(value).__name__}")
        return value
