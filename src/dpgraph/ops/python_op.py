"""Python operators: ``Python`` / ``PythonGradient`` run user functions on the blobs.

Caffe2's ``net.Python(f, grad_f)`` registers ``f`` under a token (the op's ``token``
argument) or, for distributed jobs, pickles a builder ``(func, args, kwargs)`` whose call
returns ``f`` (``pickled_builder`` / ``pickled_grad_builder``; dpgraph calls each distinct
builder once per process, so ops made from the same tuple share its state).
``f(inputs, outputs)`` (plus the workspace with ``pass_workspace``) gets Caffe2-style tensor
views: ``.data``, ``.shape``, ``.reshape(shape)``, ``.init(dims, data_type)``,
``.feed(array)``.  ``grad_f`` sees the forward inputs, the forward outputs and the output
gradients (or the ``grad_output_indices`` subset) and writes the input gradients (or the
``grad_input_indices`` subset).
"""

from __future__ import annotations

import itertools
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import numpy_dtype
from dpgraph.ops.gradient_builder import GradientBuilder

PythonFn = Callable[..., Any]

_LOCK = threading.Lock()
_TOKENS = itertools.count()
_IMPLS: dict[str, tuple[PythonFn, PythonFn | None, bool]] = {}
_BUILT: dict[bytes, PythonFn] = {}


def register_python_impl(f: PythonFn, grad_f: PythonFn | None = None,
                         python_func_type: Any = None, pass_workspace: bool = False) -> str:
    """Register ``f`` (and ``grad_f``) and return the token a ``Python`` op refers to them by.

    With ``python_func_type``, ``python_func_type(f)`` is built once and its ``forward`` and
    ``backward`` methods are used (Caffe2's stateful Python ops).
    """
    if python_func_type is not None:
        obj = python_func_type(f)
        f, grad_f = obj.forward, getattr(obj, "backward", None)
    with _LOCK:
        token = f"python_op_{next(_TOKENS)}"
        _IMPLS[token] = (f, grad_f, pass_workspace)
    return token


def python_op_arguments(f: Any, grad_f: Any = None, python_func_type: Any = None,
                        pass_workspace: bool = False) -> dict[str, Any]:
    """The arguments of a ``Python`` op running ``f``: a builder tuple ``(func, args,
    kwargs)`` is pickled (``pickled_builder``), a callable is registered (``token``)."""

    def pickled(t: Any) -> bytes | str:
        if not isinstance(t, tuple):
            return ""
        if len(t) != 3:
            raise ArgumentError("Python op: expected a builder tuple (func, args, kwargs), "
                                f"got a tuple of {len(t)} items.")
        func, args, kwargs = t
        return pickle.dumps((func, tuple(args), dict(kwargs)))

    f_builder, grad_builder = pickled(f), pickled(grad_f)
    if grad_f and bool(f_builder) != bool(grad_builder):
        raise ArgumentError("Python op: pass a builder tuple as both f and grad_f, or neither.")
    if f_builder:
        return {"pickled_builder": f_builder, "pickled_grad_builder": grad_builder,
                "pass_workspace": pass_workspace}
    return {"token": register_python_impl(f, grad_f, python_func_type, pass_workspace)}


class PythonTensor:
    """The tensor view a Python op function gets (Caffe2's ``TensorCPU``)."""

    __slots__ = ("_array",)

    def __init__(self, array: Any) -> None:
        self._array = array

    @property
    def data(self) -> np.ndarray:
        """The array itself: write into it with ``t.data[...] = x`` after ``reshape``."""
        if self._array is None:
            raise ArgumentError("Python op: this output has no data yet; call "
                                "outputs[i].reshape(shape) or outputs[i].feed(array) first.")
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self._array is None else tuple(self._array.shape)

    @property
    def _dtype(self) -> Any:
        return np.float32 if self._array is None else self._array.dtype

    def reshape(self, shape: Sequence[int]) -> None:
        """Resize to ``shape``, keeping the dtype (float32 for a fresh output)."""
        shape = tuple(int(d) for d in shape)
        if self._array is None or self._array.shape != shape:
            self._array = np.zeros(shape, self._dtype)

    def init(self, dims: Sequence[int], data_type: int) -> None:
        """Resize to ``dims`` with the ``TensorProto.DataType`` ``data_type``."""
        self._array = np.zeros(tuple(int(d) for d in dims), numpy_dtype(int(data_type), "init"))

    def feed(self, array: Any) -> bool:
        """Replace the content with a copy of ``array``."""
        self._array = np.array(array)
        return True


def _resolve(ctx: OpContext, grad: bool) -> tuple[PythonFn, bool]:
    builder = ctx.arg("pickled_grad_builder" if grad else "pickled_builder")
    if builder:
        if isinstance(builder, str):  # arguments decode ``s`` with surrogateescape
            builder = builder.encode("utf-8", "surrogateescape")
        with _LOCK:
            fn = _BUILT.get(builder)
            if fn is None:
                func, args, kwargs = pickle.loads(builder)
                fn = _BUILT[builder] = func(*args, **kwargs)
        return fn, bool(ctx.int_arg("pass_workspace", 0))
    token = ctx.str_arg("token")
    if token not in _IMPLS:
        raise ArgumentError(ctx.describe(
            f"no Python function is registered under token {token!r}; create the op with "
            "net.Python(f) or core.CreatePythonOperator(f, ...) in this process."))
    f, grad_f, pass_workspace = _IMPLS[token]
    if grad and grad_f is None:
        raise ArgumentError(ctx.describe("the Python op was created without grad_f"))
    return (grad_f if grad else f), pass_workspace  # type: ignore[return-value]


def _host(ctx: OpContext, value: Any) -> Any:
    if ctx.xp is not np and hasattr(ctx.xp, "asnumpy"):
        return ctx.xp.asnumpy(value)
    return value


def _run(ctx: OpContext, grad: bool) -> Outputs:
    fn, pass_workspace = _resolve(ctx, grad)
    inputs = [PythonTensor(_host(ctx, v)) for v in ctx.inputs]
    outputs = []
    for index in range(ctx.num_outputs):
        prev = ctx.prev_output(index)
        outputs.append(PythonTensor(None if prev is None else np.array(_host(ctx, prev))))
    if pass_workspace:
        fn(inputs, outputs, ctx.workspace)
    else:
        fn(inputs, outputs)
    result = []
    for tensor in outputs:
        array = tensor._array if tensor._array is not None else np.zeros((0,), np.float32)
        result.append(ctx.xp.asarray(array))
    return tuple(result)


@register_op("Python", side_effects=True)
def python_op(ctx: OpContext) -> Outputs:
    """Runs the registered Python function ``f(inputs, outputs)``."""
    return _run(ctx, grad=False)


@register_op("PythonGradient", side_effects=True)
def python_gradient_op(ctx: OpContext) -> Outputs:
    """Runs the registered ``grad_f(inputs + outputs + output grads, input grads)``."""
    return _run(ctx, grad=True)


@register_gradient("Python")
def _python_gradient(g: GradientBuilder) -> None:
    go_indices = [int(i) for i in g.arg("grad_output_indices", []) or []]
    gi_indices = [int(i) for i in g.arg("grad_input_indices", []) or []]
    n_in, n_out = len(g.op.input), len(g.op.output)
    inputs = [g.I(i) for i in range(n_in)] + [g.O(i) for i in range(n_out)]
    inputs += [g.GO(i) for i in (go_indices or range(n_out))]
    outputs = [g.GI(i) for i in (gi_indices or range(n_in))]
    g.add("PythonGradient", inputs, outputs)
