"""net_printer: analysis of blob definitions and the text rendering."""

from __future__ import annotations

import pytest

from dpgraph import core, net_printer
from dpgraph.net_builder import ops
from dpgraph.task import Task, TaskGroup, final_output


def _task_group() -> tuple[TaskGroup, Task]:
    with TaskGroup() as tg:
        with Task(node="trainer") as task:
            src = ops.Const(1)
            with ops.loop(3):
                ops.Add([src, ops.Const(1)], [src])
            with ops.task_exit():
                final_output(ops.Copy(src))
    return tg, task


def test_to_string_renders_steps_tasks_and_nets() -> None:
    tg, _ = _task_group()
    text = net_printer.to_string(tg)
    assert text.startswith("with TaskGroup():")
    assert "with Task(node=trainer, name=trainer/grouped_by_node, outputs=Output[" in text
    assert "with loop():" in text and "yield stop_if(" in text
    assert "core.Net(" in text and ".Add([" in text
    net = core.Net("np_net")
    net.FC(["x", "w", "b"], "y", axis=2, device_option=core.DeviceOption(1, 1))
    rendered = net_printer.to_string(net, c2_syntax=False)
    assert rendered.splitlines()[0] == "# net: np_net"
    assert "y = FC(x, w, b, axis=2, device_option=DeviceOption(1, 1, ''))" in rendered
    assert net_printer.call("op", ["a", ("k", 1)], ["out"]) == "out = op(a, k=1)"
    assert net_printer.factor_prefix(["pre_a", "pre_b"], True) == "pre_[a, b]"


def test_analyze_finds_undefined_and_parallel_duplicates() -> None:
    tg, _ = _task_group()
    net_printer.analyze(tg)
    bad = core.Net("np_bad")
    bad.Relu("never_defined", "out")
    with pytest.raises(AssertionError, match="Blob undefined: never_defined"):
        net_printer.analyze(core.execution_step("s", bad))
    a, b = core.Net("np_a"), core.Net("np_b")
    a.ConstantFill([], "dup", shape=[1])
    b.ConstantFill([], "dup", shape=[1])
    parallel = core.execution_step("par", [core.execution_step("a", a),
                                           core.execution_step("b", b)],
                                   concurrent_substeps=True)
    with pytest.raises(AssertionError, match="multiple parallel steps: dup"):
        net_printer.analyze(parallel)
    with pytest.raises(TypeError, match="unsupported object type"):
        net_printer.analyze(3)


def test_debug_net_logs_before_each_op() -> None:
    net = core.Net("np_debug")
    net.ConstantFill([], "c", shape=[1], value=2.0)
    net.Relu("c", "r")
    debug = net_printer.debug_net(net)
    types = [op.type for op in debug.Proto().op]
    assert types.count("ConstantFill") == 1 and types.count("Relu") == 1
    assert types.index("Relu") > types.index("Print")


def _example_job():
    from dpgraph.jobs.job import Job

    with Job() as job:
        with job.init_group:
            with Task():
                total = ops.Const(0)
                with ops.loop(3):
                    ops.Add([total, ops.Const(1)], total)
        with Task():
            with ops.task_init():
                one = ops.Const(1)
            final_output(ops.Add([one, one]))
        with Task(num_instances=2):
            with ops.task_instance_init():
                local = ops.Const(2)
            ops.LogInfo("ble")
            ops.Copy(local, "np_local_copy")
    return job


def test_jobs_print_and_analyze() -> None:
    text = net_printer.to_string(_example_job())
    assert "Job.current().init_group" in text and "Job.current().epoch_group" in text
    net_printer.analyze(_example_job())
    job = _example_job()
    with job:
        with Task():
            ops.Add(["distributed_ctx_init_a", "distributed_ctx_init_b"])
    net_printer.analyze(job)
    job = _example_job()
    with job:
        with Task():
            ops.Add(["a", "b"])
    with pytest.raises(AssertionError) as error:
        net_printer.analyze(job)
    assert str(error.value) == "Blob undefined: a"
    from dpgraph.task import WorkspaceType

    job = _example_job()
    with job:
        with Task(workspace_type=WorkspaceType.GLOBAL):
            ops.Add([ops.Const(0), ops.Const(1)], "np_out1")
        with Task(workspace_type=WorkspaceType.GLOBAL):
            ops.Add([ops.Const(2), ops.Const(3)], "np_out1")
    with pytest.raises(AssertionError):
        net_printer.analyze(job)
