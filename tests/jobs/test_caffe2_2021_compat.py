"""Pieces Caffe2's 2021 tests rely on: hypothesis_test_util's settings/floats wrappers and
relaxed profiles, core._REGISTERED_OPERATORS."""

from __future__ import annotations

import hypothesis
import numpy as np

from dpgraph import core
from dpgraph import hypothesis_test_util as hu


def test_settings_drops_retired_arguments_and_converts_timeout() -> None:
    s = hu.settings(max_examples=3, min_satisfying_examples=1, timeout=2)
    assert s.max_examples == 3 and s.deadline.total_seconds() == 2.0
    assert hu.settings(deadline=None, timeout=5).deadline is None  # deadline wins


def test_floats_are_float32_with_float32_bounds() -> None:
    assert hu.to_float32(0.1) == float(np.float32(0.1)) != 0.1
    strategy = hu.floats(min_value=0.1, max_value=1.1)

    @hypothesis.given(strategy)
    @hypothesis.settings(max_examples=20, database=None)
    def check(value: float) -> None:
        assert float(np.float32(0.1)) <= value <= float(np.float32(1.1))
        assert float(np.float32(value)) == value

    check()
    assert repr(hu.floats(width=64, min_value=0.1)) == "floats(min_value=0.1)"  # kept


def test_dev_profile_suppresses_too_slow_and_differing_executors() -> None:
    profile = hypothesis.settings.get_profile("dev")
    suppressed = set(profile.suppress_health_check)
    assert hypothesis.HealthCheck.too_slow in suppressed
    if hasattr(hypothesis.HealthCheck, "differing_executors"):
        assert hypothesis.HealthCheck.differing_executors in suppressed
        assert hypothesis.HealthCheck.differing_executors in set(
            hypothesis.settings.get_profile("debug").suppress_health_check)


def test_registered_operators_set_is_live() -> None:
    ops = core._REGISTERED_OPERATORS
    assert "Relu" in ops and "NoSuchOpAnywhere" not in ops
    assert len(ops) == len(core.RegisteredOperators()) and "FC" in set(ops)
    assert core._GetRegisteredOperators() == set(core.RegisteredOperators())


BUILT: list[int] = []


def _counting_builder(amount: float):  # noqa: ANN201 - a Python-op builder
    BUILT.append(1)

    def f(inputs, outputs) -> None:  # noqa: ANN001
        outputs[0].feed(inputs[0].data + amount)
    return f


def test_python_op_builder_called_once_per_op_instance() -> None:
    from dpgraph import workspace

    BUILT.clear()
    net = core.Net("k_py_builder")
    net.Python((_counting_builder, [2.0], {}))(["k_x"], ["k_y"])
    workspace.FeedBlob("k_x", np.ones(2, np.float32))
    workspace.CreateNet(net)
    workspace.RunNet(net, 3)
    assert len(BUILT) == 1  # one instance, three runs
    np.testing.assert_array_equal(workspace.FetchBlob("k_y"), [3.0, 3.0])
    workspace.RunNetOnce(net)
    workspace.RunNetOnce(net)
    assert len(BUILT) == 3  # each RunNetOnce instantiates the net
