"""StatRegistry ops and the Put ops: counters, reset on export, private registries,
magnitude expansion, bounds and defaults."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.stats import INT64_MAX, INT64_MIN, StatRegistry
from dpgraph.ops.testing import run_op


def _export(*inputs, reset: int = 1) -> dict:
    names = [f"r{i}" for i in range(len(inputs))]
    keys, values, stamps = run_op(CreateOperator("StatRegistryExport", names, ["k", "v", "t"],
                                                 reset=reset), list(inputs))
    assert keys.dtype == object and values.dtype == np.int64 and stamps.dtype == np.int64
    assert len(keys) == len(values) == len(stamps)
    return dict(zip(keys.tolist(), values.tolist()))


def _put(op_type: str, value: np.ndarray, **args) -> None:
    run_op(CreateOperator(op_type, ["value"], [], **args), [value])


def test_private_registry_update_and_export_reset() -> None:
    (reg,) = run_op(CreateOperator("StatRegistryCreate", [], ["reg"]), [])
    assert isinstance(reg, StatRegistry)
    keys = np.array(["test_stats/a", "test_stats/b"])
    update = CreateOperator("StatRegistryUpdate", ["k", "v", "reg"], [])
    for _ in range(2):
        run_op(update, [keys, np.array([3, 4], np.int64), reg])
    assert _export(reg, reset=0) == {b"test_stats/a": 6, b"test_stats/b": 8}
    assert _export(reg) == {b"test_stats/a": 6, b"test_stats/b": 8}
    assert _export(reg) == {b"test_stats/a": 0, b"test_stats/b": 0}  # reset, still listed
    with pytest.raises(Exception, match="entries"):
        run_op(update, [keys, np.array([1], np.int64), reg])


def test_put_ops_write_the_global_registry() -> None:
    _export()  # reset whatever earlier tests left
    _put("IncrementPut", np.array([1.5]), stat_name="test_put_inc", magnitude_expand=10)
    _put("IncrementPut", np.array([2.0], np.float32), stat_name="test_put_inc",
         magnitude_expand=10)
    _put("AveragePut", np.array([7], np.int32), stat_name="test_put_avg")
    _put("AveragePut", np.zeros(0), stat_name="test_put_avg", default_value=3.0)
    for v in (5, 8, 4):
        _put("StdDevPut", np.array([float(v)]), stat_name="test_put_sd")
    stats = _export()
    assert stats[b"test_put_inc/stat_value"] == 35
    assert stats[b"test_put_avg/stat_value/sum"] == 10
    assert stats[b"test_put_avg/stat_value/count"] == 2
    sd = {k.split(b"/")[-1]: v for k, v in stats.items() if k.startswith(b"test_put_sd/")}
    # offsets follow Caffe2's compare-exchange: 5 (first), 5, then 4 (the third value)
    assert sd == {b"sum": 17, b"count": 3, b"sumoffset": 0 + 3 + 0,
                  b"sumsqoffset": 0 + 9 + 0}


def test_put_bounds_nan_and_errors() -> None:
    _export()
    _put("AveragePut", np.array([10.0]), stat_name="test_put_b", magnitude_expand=10 ** 18,
         bound=1)
    _put("IncrementPut", np.array([-1e20]), stat_name="test_put_lo", magnitude_expand=10 ** 12,
         bound=1)
    _put("IncrementPut", np.array([np.nan]), stat_name="test_put_nan", bound=1)
    stats = _export()
    assert stats[b"test_put_b/stat_value/sum"] == INT64_MAX
    assert stats[b"test_put_lo/stat_value"] == INT64_MIN
    assert stats[b"test_put_nan/stat_value"] == 0
    with pytest.raises(Exception, match="too large"):
        _put("IncrementPut", np.array([10.0]), stat_name="x", magnitude_expand=10 ** 18)
    with pytest.raises(Exception, match="default_value"):
        _put("IncrementPut", np.zeros(0), stat_name="x")
    _put("IncrementPut", np.array([1.0]))  # stat_name defaults to the input's name
    assert _export()[b"value/stat_value"] == 1
