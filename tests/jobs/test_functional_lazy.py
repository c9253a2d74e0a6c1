"""functional (eager single ops) and lazy_dyndep (libraries loaded on first use)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, lazy, lazy_dyndep, workspace
from dpgraph.errors import ArgumentError
from dpgraph.functional import Functional


def test_functional_runs_ops_eagerly() -> None:
    x = np.array([-1.0, 2.0], np.float32)
    out = Functional.Relu(x)
    np.testing.assert_array_equal(out[0], [0.0, 2.0])
    np.testing.assert_array_equal(out["output_0"], out.output_0)
    total = Functional.Sum(x, x, x)
    np.testing.assert_array_equal(total[0], 3 * x)
    split = Functional.Split(np.arange(4, dtype=np.float32), num_output=2, axis=0)
    assert [s.tolist() for s in split] == [[0.0, 1.0], [2.0, 3.0]]
    filled = Functional.ConstantFill(shape=[2], value=1.5)
    assert filled[0].tolist() == [1.5, 1.5]
    assert not workspace.HasBlob("input_0")  # a temporary workspace
    with pytest.raises(ArgumentError, match="Number of inputs"):
        Functional.FC(x)
    with pytest.raises(ArgumentError, match="num_output explicitly"):
        Functional.Split(x)
    assert "Relu" in dir(Functional)


def test_lazy_dyndep_loads_on_refresh_and_create_net(tmp_path, capsys) -> None:
    errors = []

    def handler(error: BaseException) -> None:
        errors.append(error)
        raise ValueError("lazy load failed") from error

    lazy_dyndep.SetErrorHandler(handler)
    try:
        library = tmp_path / "libmy_custom_ops.so"
        library.write_bytes(b"")
        lazy_dyndep.RegisterOpsLibrary(str(library))
        with pytest.raises(ValueError, match="lazy load failed"):
            core.RefreshRegisteredOperators()
        core.RefreshRegisteredOperators()  # removed from the pending set after the try
        lazy_dyndep.RegisterOpsLibrary("@/does/not/exist:lib")
        assert "Ignoring @/does/not/exist:lib" in capsys.readouterr().out
        lazy_dyndep.RegisterOpsLibrary(str(library))
        with pytest.raises(ValueError, match="lazy load failed"):
            workspace.CreateNet("fake")
        assert len(errors) == 2
    finally:
        lazy_dyndep.SetErrorHandler(None)
    calls = []
    lazy.RegisterLazyImport(lambda: calls.append(1))
    lazy.TriggerLazyImport()
    assert calls == [1]
