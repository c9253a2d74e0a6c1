"""memonger's graph algorithms: interference graph, topological orders, live-range
assignment, graph-equality checks (the structural cases of Caffe2's memonger_test)."""

from __future__ import annotations

import pytest

from dpgraph import brew, core, memonger, model_helper


def _sort_model(multi_target: bool) -> model_helper.ModelHelper:
    m = model_helper.ModelHelper()
    m.Copy("conv0_w_comp", "conv0_w")                       # 0
    conv0 = brew.conv(m, "data", "conv0", 32, 32, 4)        # 1
    m.Copy("conv2_w", "conv2_w")                            # 2
    brew.conv(m, conv0, "conv2", 16, 32, 4)                 # 3
    if multi_target:
        m.Copy("data1", "data2")                            # 4
        m.Copy("data2", "data3")                            # 5
    return m


def test_interference_graph_inplace_ops() -> None:
    m = model_helper.ModelHelper()
    for _ in range(3):
        m.Copy("b1", "b1")
    g = memonger.compute_interference_graph(m.net.Proto().op)
    assert g.edges() == [(0, 1), (0, 2), (1, 2)]


def test_topological_sort_longest_path() -> None:
    g = memonger.compute_interference_graph(_sort_model(False).net.Proto().op)
    assert memonger.topological_sort_traversal(g) == [2, 0, 1, 3]
    assert memonger.topological_sort_traversal_longest_path(g) == [0, 1, 2, 3]


def test_topological_sort_longest_path_multi_target() -> None:
    g = memonger.compute_interference_graph(_sort_model(True).net.Proto().op)
    assert memonger.topological_sort_traversal(g) == [4, 5, 2, 0, 1, 3]
    assert memonger.topological_sort_traversal_longest_path(g) == [0, 1, 2, 3, 4, 5]


def test_topological_sort_single_node() -> None:
    m = model_helper.ModelHelper()
    m.Copy("conv0_w_comp", "conv0_w")
    g = memonger.compute_interference_graph(m.net.Proto().op)
    assert memonger.topological_sort_traversal(g) == [0]
    assert memonger.topological_sort_traversal_longest_path(g) == [0]


def _ranges_a() -> list:
    live = memonger.LiveRange
    return [("b1", live(1, 3, 10)), ("b2", live(3, 4, 1)), ("b3", live(5, 6, 1)),
            ("b4", live(5, 7, 10))]


def test_compute_assignments_greedy() -> None:
    ranges = _ranges_a()
    best = memonger.compute_assignments_greedy(ranges, None)
    assert memonger.get_memory_usage(best) == 11
    assert best == [[ranges[0], ranges[3]], [ranges[1], ranges[2]]]


def test_compute_assignments_dp() -> None:
    best = memonger.compute_assignments_dp(_ranges_a(), None)
    assert memonger.get_memory_usage(best) == 11


def test_compute_assignments_dp_second_set() -> None:
    live = memonger.LiveRange
    ranges = [("b1", live(1, 2, 10)), ("b2", live(4, 6, 1)), ("b3", live(5, 6, 10))]
    best = memonger.compute_assignments_dp(ranges, {})
    assert memonger.get_memory_usage(best) == 11


def test_dp_no_worse_than_greedy() -> None:
    live = memonger.LiveRange
    ranges = [("a", live(0, 1, 10)), ("b", live(2, 3, 10)), ("c", live(0, 3, 9)),
              ("d", live(4, 5, 9))]
    greedy = memonger.get_memory_usage(memonger.compute_assignments_greedy(ranges, None))
    dp = memonger.get_memory_usage(memonger.compute_assignments_dp(ranges, None))
    assert dp <= greedy
    assert dp == 19


def test_assignments_never_overlap() -> None:
    live = memonger.LiveRange
    ranges = [(f"x{i}", live(i, i + (i % 3) + 1, (7 * i) % 5 + 1)) for i in range(12)]
    for algo in (memonger.compute_assignments_greedy, memonger.compute_assignments_dp):
        for group in algo(ranges, None):
            spans = sorted((r.defined, r.used) for _, r in group)
            assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))


def test_get_updated_ranges() -> None:
    live = memonger.LiveRange
    got = memonger.get_updated_ranges([("a", live(None, 3, None)), ("b", live(2, None, 5))])
    assert got == [("a", live(-1, 3, 1)), ("b", live(2, 4, 5))]


def test_compute_ranges() -> None:
    net = core.Net("r")
    net.Relu("x", "y")       # 0
    net.Relu("y", "y")       # 1 (in place)
    net.Relu("y", "z")       # 2
    ranges = memonger.compute_ranges(net.Proto().op, {"x": 4, "y": 8, "z": 8})
    assert ranges["x"] == memonger.LiveRange(None, 0, 4)
    assert ranges["y"] == memonger.LiveRange(0, 2, 8)
    assert ranges["z"] == memonger.LiveRange(2, None, 8)


def test_verify_graph_equality() -> None:
    a, b = core.Net("a"), core.Net("b")
    for net in (a, b):
        net.Relu("x", "y")
        net.Relu("y", "z")
    assert memonger.verify_graph_equality(a.Proto(), b.Proto())


def test_verify_graph_equality_renamed_branches() -> None:
    a, b = core.Net("a"), core.Net("b")
    a.Relu("x", "y1")
    a.Relu("x", "y2")
    a.Relu("y1", "y3")
    a.Relu("y2", "y4")
    a.Sum(["y3", "y4"], "z")
    b.Relu("x", "y1")
    b.Relu("x", "y2")
    b.Relu("y1", "y3")
    b.Relu("y2", "y1")          # y1 is dead: the same topology under another name
    b.Sum(["y3", "y1"], "z")
    assert memonger.verify_graph_equality(a.Proto(), b.Proto())


def test_verify_graph_inequality() -> None:
    a, b = core.Net("a"), core.Net("b")
    a.Relu("x", "y")
    a.Relu("y", "z")
    b.Relu("x", "y")
    b.Relu("x", "z")
    assert not memonger.verify_graph_equality(a.Proto(), b.Proto())


def test_verify_graph_inequality_collapsed_branches() -> None:
    a, b = core.Net("a"), core.Net("b")
    a.Relu("x", "y1")
    a.Relu("x", "y2")
    a.Relu("y1", "y3")
    a.Relu("y2", "y4")
    a.Sum(["y3", "y4"], "z")
    b.Relu("x", "y1")
    b.Relu("x", "y2")
    b.Relu("y1", "y3")
    b.Relu("y2", "y3")          # both branches collapsed into one name
    b.Sum(["y3", "y3"], "z")
    assert not memonger.verify_graph_equality(a.Proto(), b.Proto())


def test_verify_inplace_blobs() -> None:
    a, b = core.Net("a"), core.Net("b")
    a.Relu("x", "y")
    a.Relu("y", "z")
    b.Relu("x", "y")
    b.Relu("y", "y")
    assert memonger.verify_inplace_blobs(a.Proto(), a.Proto())
    assert not memonger.verify_inplace_blobs(a.Proto(), b.Proto())


@pytest.mark.parametrize("algo", list(memonger.AssignmentAlgorithm))
def test_assignment_algorithm_enum(algo: memonger.AssignmentAlgorithm) -> None:
    assert algo.name in ("GREEDY", "DYNAMIC_PROGRAMMING")


def test_verify_graph_equality_ignores_external_blob_names() -> None:
    """Caffe2's parents are the ops that last wrote an input: external inputs (data,
    weights) add nothing, so nets differing only in parameter names are equal."""
    a, b = core.Net("a"), core.Net("b")
    a.FC(["data", "x_w", "x_b"], "x")
    a.FC(["x", "y_w", "y_b"], "y")
    b.FC(["data", "other_x_w", "other_x_b"], "other_x")
    b.FC(["other_x", "other_y_w", "other_y_b"], "other_y")
    assert memonger.verify_graph_equality(a.Proto(), b.Proto())
    b.Proto().op[1].engine = "CUDNN"  # per-op check: type, device option and engine
    assert not memonger.verify_graph_equality(a.Proto(), b.Proto())


def test_verify_graph_inequality_prints_the_differing_op(capsys) -> None:
    a, b = core.Net("a"), core.Net("b")
    a.Relu("x", "y1")
    a.Relu("x", "y2")
    a.Sum(["y1", "y2"], "z")
    b.Relu("x", "y1")
    b.Relu("x", "y1")
    b.Sum(["y1", "y1"], "z")
    assert not memonger.verify_graph_equality(a.Proto(), b.Proto())
    assert "Parents: [0, 1] vs [1, 1]" in capsys.readouterr().out
