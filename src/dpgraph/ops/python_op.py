"""Python operators: ``Python`` / ``PythonGradient`` run user functions on the blobs.

Caffe2's ``net.Python(f, grad_f)`` registers ``f`` under a token (the op's ``token``
argument) or, for distributed jobs, pickles a builder ``(func, args, kwargs)`` whose call
returns ``f`` (``pickled_builder`` / ``pickled_grad_builder``).  As in Caffe2 (whose
PythonOp constructor calls it), the builder is called once per operator *instance*: each
net instantiation (``CreateNet``, ``RunNetOnce``, every concurrent task instance) builds
its own function, which then serves every run of that instance.  A pickled builder is only
unpickled if this process made it or the caller opted in (docs/security.md).
``f(inputs, outputs)`` (plus the workspace with ``pass_workspace``) gets Caffe2-style tensor
views: ``.data``, ``.shape``, ``.reshape(shape)``, ``.init(dims, data_type)``,
``.feed(array)``.  ``grad_f`` sees the forward inputs, the forward outputs and the output
gradients (or the ``grad_output_indices`` subset) and writes the input gradients (or the
``grad_input_indices`` subset).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError
from dpgraph.ir.python_funcs import (  # noqa: F401  (register_python_impl: re-exported)
    PythonFn,
    build_pickled,
    python_op_arguments,
    register_python_impl,
    resolve_python_function,
)
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import numpy_dtype
from dpgraph.ops.gradient_builder import GradientBuilder


#: What a ``pass_workspace`` function receives for the running workspace.  The runtime's
#: Caffe2 binding (``workspace.C``) sets this to its ``C.Workspace`` wrapper, so the
#: function sees ``ws.blobs[name].fetch()``, ``ws.create_blob`` and friends, as in Caffe2.
def _as_is(workspace: Any) -> Any:
    return workspace


WORKSPACE_VIEW: Callable[[Any], Any] = _as_is


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


#: Keys under which an op instance keeps its resolved function in its own ``ctx.args``
#: (a per-instance dict no argument name can clash with).
_INSTANCE_FN = {False: "\0python_fn", True: "\0python_grad_fn"}


def _resolve(ctx: OpContext, grad: bool) -> tuple[PythonFn, bool]:
    """The function of this op instance: a pickled builder is called on the instance's
    first run (once per instance, as Caffe2's PythonOp constructor does), a token is looked
    up in the registry."""
    cached = ctx.args.get(_INSTANCE_FN[grad])
    if cached is None:
        builder = ctx.args.get("pickled_grad_builder" if grad else "pickled_builder")
        if builder:
            cached = (build_pickled(builder, ctx.describe),
                      bool(int(ctx.args.get("pass_workspace", 0))))
        else:
            cached = resolve_python_function(ctx.args, grad, ctx.describe)
        ctx.args[_INSTANCE_FN[grad]] = cached
    return cached


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
        fn(inputs, outputs, WORKSPACE_VIEW(ctx.workspace))
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
