"""numpy reference of the Adagrad family and the sparse-op check built on it (Caffe2's
``operator_test/adagrad_test_helper``, used by its adagrad tests).

:func:`ref_adagrad` is one Adagrad step of the facts' formulas::

    g' = g + wd·w          (wd scaled by halflife/count when a row counter is given)
    h' = decay·h + g'²     (row-wise: decay·h + mean(g'²))
    w' = w + lr·g'/(√h' + ε)

:func:`adagrad_sparse_test_helper` runs ``SparseAdagrad`` / ``RowWiseSparseAdagrad`` on a
random subset of rows and compares it with the reference applied row by row.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from dpgraph.ir.device import CUDA
from dpgraph.ir.operator import CreateOperator


def _cast(values: tuple[Any, ...], using_fp16: bool) -> tuple[Any, ...]:
    dtype = np.float16 if using_fp16 else np.float32
    return tuple(np.asarray(v).astype(dtype) for v in values)


def ref_adagrad(param_in: Any, mom_in: Any, grad: Any, lr: Any, epsilon: float,
                using_fp16: bool = False, output_effective_lr: bool = False,
                output_effective_lr_and_update: bool = False, decay: float = 1.0,
                row_wise: bool = False, weight_decay: float = 0.0,
                counter_halflife: int = -1, count: Any = None) -> tuple[Any, ...]:
    """One Adagrad step: ``(param, moment)``, plus the effective lr (and the update) when
    asked; float16 results with ``using_fp16`` (computed in float32), else float32.
    ``count`` (the row's update counter) only matters with ``counter_halflife > 0``."""
    param = np.asarray(param_in).astype(np.float32) if using_fp16 else param_in
    moment = np.asarray(mom_in).astype(np.float32) if using_fp16 else mom_in
    if count and count > 0 and counter_halflife > 0:
        weight_decay = weight_decay * counter_halflife / count
    g = grad + weight_decay * param
    squared = np.mean(np.square(g)) if row_wise else np.square(g)
    new_moment = decay * moment + squared
    effective_lr = lr / (np.sqrt(new_moment) + epsilon)
    update = effective_lr * g
    new_param = param + update
    if output_effective_lr_and_update:
        return _cast((new_param, new_moment, effective_lr, update), using_fp16)
    if output_effective_lr:
        return _cast((new_param, new_moment, effective_lr), using_fp16)
    return _cast((new_param, new_moment), using_fp16)


def _put(target: np.ndarray, index: Any, value: Any) -> None:
    """``target[index] = value`` with ``value`` reshaped to the slot (numpy 2 refuses to
    store a 1-element array into a scalar slot)."""
    target[index] = np.reshape(value, np.shape(target[index]))


def _random_rows(grad: np.ndarray) -> np.ndarray:
    """Distinct row indices, fewer than the rows of ``grad`` (none when it is empty)."""
    if grad.size == 0:
        return np.empty(shape=(0,), dtype=np.int64)
    return np.random.choice(np.arange(grad.shape[0]), size=np.random.randint(grad.shape[0]),
                            replace=False)


def _sparse_reference(ref: Any, epsilon: float, weight_decay: float,
                      counter_halflife: int) -> Any:
    """The sparse op's reference: ``ref`` applied to each indexed row."""

    def reference(param: Any, momentum: Any, indices: Any, grad: Any, lr: Any,
                  count: Any = None, ref_using_fp16: bool = False) -> tuple[Any, Any]:
        step = partial(ref, using_fp16=True) if ref_using_fp16 else ref
        param_out, momentum_out = np.copy(param), np.copy(momentum)
        for i, row in enumerate(indices):
            new_param, new_moment = step(
                param[row], momentum[row], grad[i], lr, epsilon, weight_decay=weight_decay,
                counter_halflife=counter_halflife,
                count=None if count is None else count[row])
            _put(param_out, row, new_param)
            _put(momentum_out, row, new_moment)
        return param_out, momentum_out

    return reference


def adagrad_sparse_test_helper(parent_test: Any, inputs: Any, lr: float, epsilon: float,
                               engine: Any, ref_adagrad: Any, gc: Any, dc: Any,
                               row_wise: bool = False, weight_decay: float = 0.0,
                               counter_halflife: int = -1) -> None:
    """Check ``SparseAdagrad`` (``RowWiseSparseAdagrad`` with ``row_wise``) against
    ``ref_adagrad`` on a random subset of ``grad``'s rows; with ``counter_halflife != -1``
    a random per-row ``count`` is the op's sixth input. On a GPU device (not row-wise) the
    check is repeated with float16 param and moment."""
    param, momentum, grad = inputs
    if row_wise:  # one moment per row
        momentum = momentum.reshape(momentum.shape[0], -1)[:, 0]
    momentum = np.abs(momentum)
    lr_blob = np.array([lr], dtype=np.float32)
    count = np.random.rand(param.shape[0]) if counter_halflife != -1 else None
    indices = _random_rows(grad)
    grad = grad[indices]
    op_inputs = ["param", "momentum", "indices", "grad", "lr"]
    op = CreateOperator(
        "RowWiseSparseAdagrad" if row_wise else "SparseAdagrad",
        op_inputs if count is None else [*op_inputs, "count"], ["param", "momentum"],
        epsilon=epsilon, weight_decay=weight_decay, counter_halflife=counter_halflife,
        engine=engine, device_option=gc)
    reference = _sparse_reference(ref_adagrad, epsilon, weight_decay, counter_halflife)
    on_gpu = gc is not None and gc.device_type == CUDA
    for using_fp16 in ([False, True] if on_gpu and not row_wise else [False]):
        dtype = np.float16 if using_fp16 else np.float32
        parent_test.assertReferenceChecks(
            gc, op,
            [param.astype(dtype), momentum.astype(dtype), indices, grad, lr_blob, count,
             using_fp16],
            reference)
