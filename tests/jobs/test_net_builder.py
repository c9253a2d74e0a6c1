"""net_builder, task and session: blocks build steps whose runs give Python's results."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import NetError
from dpgraph.net_builder import NetBuilder, ops
from dpgraph.session import LocalSession
from dpgraph.task import Task, TaskGroup, final_output


def _run(nb: NetBuilder) -> workspace.C.Workspace:
    plan = core.Plan("nb_plan")
    plan.AddStep(core.to_execution_step(nb))
    ws = workspace.C.Workspace()
    ws.run(plan)
    return ws


def test_loop_stop_guard_and_if() -> None:
    with NetBuilder() as nb:
        x, y = ops.Const(5), ops.Const(0)
        with ops.loop():
            ops.stop_if(ops.EQ([x, ops.Const(0)]))
            ops.Add([x, ops.Const(-1)], [x])
            ops.Add([y, ops.Const(1)], [y])
        big, small = ops.Const(10), ops.Const(3)
        with ops.stop_guard() as g1:
            ops.stop_if(ops.LT([big, ops.Const(5)]))
        with ops.stop_guard() as g2:
            ops.stop_if(ops.LT([small, ops.Const(5)]))
        with ops.stop_guard() as g3:
            pass
        results = []
        for value in (75, 25):
            out = ops.Const(1)
            cond_value = ops.Const(value)
            with ops.If(ops.GT([cond_value, ops.Const(50)])):
                ops.Const(2, blob_out=out)
            with ops.If(ops.LT([cond_value, ops.Const(50)])):
                ops.Const(3, blob_out=out)
                ops.stop()
                ops.Const(4, blob_out=out)
            results.append(out)
    ws = _run(nb)
    fetch = [ws.blobs[str(b)].fetch() for b in
             (y, g1.has_stopped(), g2.has_stopped(), g3.has_stopped(), *results)]
    assert [v.item() for v in fetch] == [5, False, True, False, 2, 3]


def test_nested_loops_with_elif_else_through_a_session() -> None:
    with Task() as task:
        totals = [ops.Const(0) for _ in range(4)]
        with ops.loop(10) as loop:
            outer = ops.Mul([loop.iter(), ops.Const(10)])
            with ops.loop(loop.iter()) as inner:
                val = ops.Add([outer, inner.iter()])
                with ops.If(ops.GE([val, ops.Const(80)])) as c:
                    ops.Add([totals[1], val], [totals[1]])
                with c.Elif(ops.GE([val, ops.Const(50)])) as c:
                    ops.Add([totals[2], val], [totals[2]])
                with c.Else():
                    ops.Add([totals[3], val], [totals[3]])
                ops.Add([totals[0], val], totals[0])
        outputs = [final_output(t) for t in totals]
    expected = [0, 0, 0, 0]
    for i in range(10):
        for j in range(i):
            val = i * 10 + j
            expected[0] += val
            expected[1 if val >= 80 else 2 if val >= 50 else 3] += val
    with LocalSession() as session:
        session.run(task)
        assert [int(o.fetch()) for o in outputs] == expected


def test_setup_nets_and_multi_use_net() -> None:
    with Task() as task:
        with ops.task_init():
            one = ops.Const(1)
        two = ops.Add([one, one])
        with ops.task_init():
            three = ops.Const(3)
        accum = ops.Add([two, three])
        with ops.task_exit():
            seven_1 = ops.Add([accum, one])
        six = ops.Add([accum, one])
        ops.Add([accum, one], [accum])
        outs = [final_output(b) for b in (six, seven_1)]
        total = ops.Const(0)
        net = core.Net("nb_multi_use")
        net.Add([total, net.Const(1)], [total])
        ops.net(net)
        ops.net(net)
        outs.append(final_output(total))
    with LocalSession() as session:
        session.run(task)
        assert [int(o.fetch()) for o in outs] == [6, 7, 2]


def test_multi_instance_task_with_private_and_shared_counters() -> None:
    instances, iters = 4, 3
    with TaskGroup() as tg:
        with Task(num_instances=instances):
            with ops.task_init():
                shared = ops.CreateCounter([], ["nb_global_counter"])
            with ops.task_instance_init():
                per_instance = ops.CreateCounter([], ["nb_task_counter"])
            with ops.loop(iters):
                ops.CountUp(shared)
                ops.CountUp(per_instance)
            with ops.task_instance_exit():
                count = ops.RetrieveCount(per_instance)
                with ops.loop(ops.Mul([count, count])):
                    ops.CountUp(shared)
            with ops.task_exit():
                total = final_output(ops.RetrieveCount(shared))
    with LocalSession() as session:
        session.run(tg)
        assert int(total.fetch()) == instances * (iters + iters ** 2)


def test_if_net_else_and_while_net_keep_locals_local() -> None:
    with NetBuilder() as nb:
        res, y = ops.Const(0), ops.Const(0)
        with ops.IfNet(ops.Const(False)):
            ops.Const(1, blob_out=res)
        with ops.Else():
            local = ops.Const(40)
            ops.Add([local, ops.Const(2)], [res])
        x = ops.Const(0)
        with ops.WhileNet():
            with ops.Condition():
                ops.Add([x, ops.Const(1)], [x])
                ops.LT([x, ops.Const(7)])
            ops.Add([x, y], [y])
    ws = _run(nb)
    assert int(ws.blobs[str(res)].fetch()) == 42
    assert (int(ws.blobs[str(x)].fetch()), int(ws.blobs[str(y)].fetch())) == (7, 21)
    assert str(local) not in ws.blobs


def test_builder_errors_and_ops_outside_a_builder() -> None:
    with pytest.raises(AttributeError, match="No active NetBuilder"):
        _ = ops.Add
    with pytest.raises(NetError, match="requires a stop condition"):
        with NetBuilder():
            with ops.loop():
                ops.Const(1)
    with NetBuilder() as nb:
        ops.Const(1)
    nb.get()
    with pytest.raises(NetError, match="built already"):
        nb.current_net()


def test_task_names_outputs_and_reprs() -> None:
    with TaskGroup() as tg:
        t1 = Task(step=core.execution_step("s", core.Net("nb_t1")), name="job")
        t2 = Task(step=core.execution_step("s2", core.Net("nb_t2")), name="job")
    assert (t1.name, t2.name) == ("local/job", "local/job:1")
    assert repr(t1) == "Task(name=local/job, node=local, outputs=[])"
    assert "TaskGroup(tasks=" in repr(tg)
    assert [t.name for t in tg.tasks()] == ["local/job", "local/job:1"]
    with pytest.raises(NetError, match="already used"):
        tg.add(Task(step=core.execution_step("s3", core.Net("nb_t3"))))
    record_out = final_output([core.BlobReference("a"), core.BlobReference("b")])
    assert record_out.names == ["a", "b"]
    record_out.set(["a", "b"], _fetch_func=lambda b: str(b) * 2)
    assert record_out.fetch() == ["aa", "bb"]


def test_session_runs_plans_steps_and_nets() -> None:
    net = core.Net("nb_session_net")
    net.ConstantFill([], "nb_s_out", shape=[2], value=3.0)
    with LocalSession() as session:
        session.run(net)
    np.testing.assert_array_equal(workspace.FetchBlob("nb_s_out"), [3.0, 3.0])
    net2 = core.Net("nb_session_net2")
    net2.ConstantFill([], "nb_s_out2", shape=[1], value=5.0)
    plan = core.Plan(core.execution_step("nb_sess_step", net2))
    session = LocalSession()
    session.run(plan)
    session.close()
    assert workspace.FetchBlob("nb_s_out2").tolist() == [5.0]
    with pytest.raises(NetError, match="closed"):
        session.run(plan)
