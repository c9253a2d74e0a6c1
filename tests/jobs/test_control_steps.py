"""control: execution-step control flow over nets, checked by counting net runs."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import control, core, workspace


def _counter(name: str) -> core.Net:
    net = core.Net(name)
    net.Add([name + "_cnt", "ctl_one"], name + "_cnt")
    return net


def _cond_net(name: str, blob: str, limit: float, relation: str = "LT") -> core.Net:
    net = core.Net(name)
    out = getattr(net, relation)([blob, net.Const(np.array([limit], np.float32))],
                                 name + "_cond")
    net.AddExternalOutput(out)
    return net


def _run(step: core.ExecutionStep) -> None:
    workspace.RunPlan(core.Plan(step))


def _count(name: str) -> float:
    return float(workspace.FetchBlob(name + "_cnt")[0])


@pytest.fixture(autouse=True)
def _counters() -> None:
    workspace.FeedBlob("ctl_one", np.ones(1, np.float32))
    for name in ("a", "b", "c"):
        workspace.FeedBlob(name + "_cnt", np.zeros(1, np.float32))


def test_do_for_and_do_parallel() -> None:
    a, b = _counter("a"), _counter("b")
    _run(control.Do("do", a, b))
    assert (_count("a"), _count("b")) == (1, 1)
    _run(control.For("for", [a], 5))
    assert _count("a") == 6
    _run(control.DoParallel("par", a, b))
    assert (_count("a"), _count("b")) == (7, 2)
    step = core.execution_step("single", a)
    assert control.Do("x", step) is step


def test_while_until_and_do_variants() -> None:
    a = _counter("a")
    _run(control.While("while", _cond_net("w", "a_cnt", 4), a))
    assert _count("a") == 4
    _run(control.While("while_false", _cond_net("w2", "a_cnt", 0), a))
    assert _count("a") == 4  # condition false first: body never runs
    _run(control.DoWhile("dowhile", _cond_net("dw", "a_cnt", 0), a))
    assert _count("a") == 5  # body runs once before the check
    _run(control.Until("until", _cond_net("u", "a_cnt", 8, "GE"), a))
    assert _count("a") == 8
    _run(control.DoUntil("dountil", _cond_net("du", "a_cnt", 0, "GE"), a))
    assert _count("a") == 9


def test_if_ifnot_and_switch() -> None:
    a, b = _counter("a"), _counter("b")
    workspace.FeedBlob("ctl_true", np.array(True))
    workspace.FeedBlob("ctl_false", np.array(False))
    _run(control.If("if", core.BlobReference("ctl_true"), a, b))
    assert (_count("a"), _count("b")) == (1, 0)
    _run(control.If("if2", core.BlobReference("ctl_false"), a, b))
    assert (_count("a"), _count("b")) == (1, 1)
    _run(control.IfNot("ifnot", core.BlobReference("ctl_false"), a))
    assert _count("a") == 2
    _run(control.If("if3", _cond_net("if_cond", "a_cnt", 10), b))
    assert _count("b") == 2
    c = _counter("c")
    _run(control.Switch("sw", (core.BlobReference("ctl_true"), a),
                        (core.BlobReference("ctl_false"), b),
                        (core.BlobReference("ctl_true"), c)))
    assert (_count("a"), _count("b"), _count("c")) == (3, 2, 1)
    _run(control.SwitchNot("swn", (core.BlobReference("ctl_true"), a),
                           (core.BlobReference("ctl_false"), b)))
    assert (_count("a"), _count("b")) == (3, 3)


def test_condition_helpers() -> None:
    bool_net = control.BoolNet(("ctl_b1", True), ("ctl_b2", False))
    assert [o.type for o in bool_net.Proto().op] == ["ConstantFill", "ConstantFill"]
    workspace.RunNetOnce(bool_net)
    assert bool(workspace.FetchBlob("ctl_b1")) and not bool(workspace.FetchBlob("ctl_b2"))
    not_net, out = control.NotNet(core.BlobReference("ctl_b1"))
    workspace.RunNetOnce(not_net)
    assert not bool(workspace.FetchBlob(str(out)))
    c1, c2 = _cond_net("m1", "a_cnt", 1), _cond_net("m2", "a_cnt", -1)
    merged = control.MergeConditionNets("merged", [c1, c2], "Or")
    workspace.RunNetOnce(merged)
    assert bool(workspace.FetchBlob(str(control.GetConditionBlobFromNet(merged))))
    combined = control.CombineConditions("comb", [c1, c2], "And")
    workspace.RunNetOnce(combined)
    assert not bool(workspace.FetchBlob(str(control.GetConditionBlobFromNet(combined))))
    with pytest.raises(AssertionError):
        control.GetConditionBlobFromNet(core.Net("no_outputs"))
