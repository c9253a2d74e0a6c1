"""The text format and DOT drawing show nested nets (RecurrentNetwork step nets)."""

from __future__ import annotations

from dpgraph import core
from dpgraph.export.dot import to_dot
from dpgraph.ir.text import format_net, parse_net


def _rnn_net() -> core.Net:
    step = core.Net("step_for_text")
    step.Relu("x_t", "h_t")
    net = core.Net("outer_for_text")
    net.RecurrentNetwork(["x"], ["h"], step_net=step.Proto(), timestep="t")
    return net


def test_step_net_is_rendered_under_its_op_and_round_trips() -> None:
    net = _rnn_net()
    text = format_net(net)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("op RecurrentNetwork"))
    assert lines[at + 1] == "#  step_net:"
    assert any(line.startswith("#    op Relu x_t -> h_t") for line in lines[at + 2:])
    assert parse_net(text) == net.Proto()


def test_dot_draws_the_step_net_as_a_cluster_linked_to_its_op() -> None:
    dot = to_dot(_rnn_net())
    assert "subgraph cluster_op0_step_net" in dot
    assert "op0 -> op0_step_net_0 [style=dotted, arrowhead=none];" in dot
