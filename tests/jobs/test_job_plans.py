"""core.ExecutionStep / Plan / to_execution_step and their runs (Caffe2 semantics)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import NetError
from dpgraph.net_builder import ops
from dpgraph.proto import caffe2_pb2
from dpgraph.task import Task


def _counter_net(name: str, blob: str) -> core.Net:
    net = core.Net(name)
    net.Add([blob, "plan_one"], blob)
    return net


def test_create_plan_from_task_has_nine_nets_and_round_trips() -> None:
    with Task(num_instances=2) as task:
        with ops.task_init():
            ops.Const(1)
        with ops.task_instance_init():
            ops.Const(2)
        with ops.loop(100):
            ops.Copy(ops.Const(3), "plan_copy_out")
        with ops.task_instance_exit():
            ops.Const(4)
        with ops.task_exit():
            ops.Const(5)
    plan = core.Plan(task.get_step())
    assert len(plan.Proto().network) == 9
    assert len(plan.Proto().execution_step) == 1
    assert any(s.name == "%s:parallel" for s in plan.Proto().execution_step[0].substep)
    again = core.Plan.create_from_proto(plan.Proto())
    assert len(again.Proto().network) == 9
    for old, new in zip(plan.Proto().network, again.Proto().network):
        assert new.name.startswith(old.name)


def test_step_is_frozen_once_used_and_names_are_unique() -> None:
    step = core.ExecutionStep(None, core.Net("plan_frozen"))
    other = core.ExecutionStep(None)
    assert step.Name() != other.Name() and step.Name().startswith("step")
    core.Plan("p").AddStep(step)
    with pytest.raises(NetError, match="Cannot mutate"):
        step.SetIter(3)
    with pytest.raises(NetError, match="both should_stop_blob and num_iter"):
        core.execution_step("x", core.Net("plan_x"), num_iter=2,
                            should_stop_blob=core.BlobReference("s"))
    a, b = core.Net("plan_same"), core.Net("plan_same2")
    b.Proto().name = a.Name()
    with pytest.raises(NetError, match="Different nets with same name"):
        core.execution_step("dup", [a, b])
    empty = core.execution_step("outer", [core.ExecutionStep("empty")])
    assert not empty.HasSubsteps()


def test_to_execution_step_of_nets_and_mixed_lists() -> None:
    n1, n2 = core.Net("plan_n1"), core.Net("plan_n2")
    step = core.to_execution_step([n1, n2], default_name="both")
    assert list(step.Proto().network) == [n1.Name(), n2.Name()]
    inner = core.execution_step("inner", n2)
    mixed = core.to_execution_step([n1, inner], default_name="mixed")
    assert [s.network[:] for s in mixed.Proto().substep][1] == [n2.Name()]
    assert core.to_execution_step(inner) is inner


def test_create_workspace_concurrent_instances_and_reporters() -> None:
    workspace.FeedBlob("plan_one", np.ones(1, np.float32))
    workspace.FeedBlob("plan_shared", np.zeros(1, np.float32))
    init = core.Net("plan_local_init")
    init.ConstantFill([], "plan_local", shape=[1], value=0.0)
    body = _counter_net("plan_local_body", "plan_local")
    body.Add(["plan_shared", "plan_one"], "plan_shared")
    step = core.execution_step("inst", [core.execution_step("i", init),
                                        core.execution_step("b", body, num_iter=3)],
                               create_workspace=True, num_concurrent_instances=3)
    workspace.RunPlan(core.Plan(step))
    assert not workspace.HasBlob("plan_local")  # made in each child workspace
    assert workspace.FetchBlob("plan_shared").tolist() == [9.0]
    workspace.FeedBlob("plan_reports", np.zeros(1, np.float32))
    report = core.execution_step("report", _counter_net("plan_report", "plan_reports"),
                                 run_every_ms=1000)
    work = core.execution_step("work", core.Net("plan_work"))
    workspace.RunPlan(core.Plan(core.execution_step("top", [work, report])))
    assert workspace.FetchBlob("plan_reports").tolist() == [1.0]  # once after siblings


def test_stop_blob_is_checked_after_each_net() -> None:
    workspace.FeedBlob("plan_one", np.ones(1, np.float32))
    workspace.FeedBlob("plan_i", np.zeros(1, np.float32))
    workspace.FeedBlob("plan_after", np.zeros(1, np.float32))
    workspace.FeedBlob("plan_limit", np.array([3.0], np.float32))
    first = _counter_net("plan_stop_a", "plan_i")
    first.GE(["plan_i", "plan_limit"], "plan_stop")
    second = _counter_net("plan_stop_b", "plan_after")
    workspace.FeedBlob("plan_stop", np.array(True))  # stale: not checked before a run
    step = core.execution_step("s", [first, second],
                               should_stop_blob=core.BlobReference("plan_stop"))
    workspace.RunPlan(core.Plan(step))
    assert workspace.FetchBlob("plan_i").tolist() == [3.0]
    assert workspace.FetchBlob("plan_after").tolist() == [2.0]
    once = core.execution_step("once", _counter_net("plan_once", "plan_after"),
                               should_stop_blob=core.BlobReference("plan_never"),
                               only_once=True)
    workspace.FeedBlob("plan_never", np.array(False))
    workspace.RunPlan(core.Plan(once))
    assert workspace.FetchBlob("plan_after").tolist() == [3.0]


def test_plan_proto_fields_and_step_substep_helpers() -> None:
    net = core.Net("plan_fields")
    step = core.execution_step("f", net, report_net=net, report_interval=2,
                               num_concurrent_instances=2, create_workspace=True)
    proto = step.Proto()
    assert proto.report_net == net.Name() and proto.report_interval == 2
    assert proto.num_concurrent_instances == 2 and proto.create_workspace
    assert step.Nets() == [net] and step.get_net(net.Name()) is net
    plan = core.Plan("fields")
    plan.AddStep(step)
    assert plan.Steps() == [step]
    assert isinstance(plan.Proto(), caffe2_pb2.PlanDef)
