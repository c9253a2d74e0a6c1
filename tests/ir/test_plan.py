"""ExecutionStep / Plan builders and running them."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import NetError


def test_execution_step_defaults_and_plan_nets() -> None:
    init, body = core.Net("plan_init"), core.Net("plan_body")
    step = core.execution_step("s", [init, body])
    assert step.Proto().num_iter == 1
    assert list(step.Proto().network) == [init.Name(), body.Name()]
    stop = core.execution_step("stop", body, should_stop_blob="done")
    assert not stop.Proto().HasField("num_iter") and stop.Proto().should_stop_blob == "done"
    outer = core.execution_step("outer", [step, stop], concurrent_substeps=True)
    assert outer.Proto().concurrent_substeps and len(outer.Proto().substep) == 2
    plan = core.Plan("p")
    plan.AddStep(outer)
    assert [n.Name() for n in plan.Nets()] == [init.Name(), body.Name()]
    with core.NameScope("scope"):
        assert core.scoped_execution_step("x", body).Proto().name == "scope/x"


def test_step_holds_nets_or_substeps_not_both() -> None:
    step = core.execution_step("mixed", core.Net("plan_a"))
    with pytest.raises(NetError):
        step.AddSubstep(core.execution_step("sub", core.Net("plan_b")))
    with pytest.raises(NetError):
        core.execution_step("bad", [3])


def test_run_plan_counts_iterations() -> None:
    workspace.ResetWorkspace()
    init = core.Net("plan_run_init")
    init.ConstantFill([], "counter", shape=[1], value=0.0)
    init.ConstantFill([], "one", shape=[1], value=1.0)
    body = core.Net("plan_run_body")
    body.Add(["counter", "one"], "counter")
    plan = core.Plan("plan_run")
    plan.AddStep(core.execution_step("init", init))
    plan.AddStep(core.execution_step("loop", body, num_iter=7))
    workspace.RunPlan(plan)
    np.testing.assert_array_equal(workspace.FetchBlob("counter"), [7.0])
