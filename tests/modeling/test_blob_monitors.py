"""modeling.compute_norm_for_blobs / compute_statistics_for_blobs: the ops each monitor adds,
the values against numpy, row norms, printing and output records."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import brew, model_helper, workspace
from dpgraph.errors import ModelConfigError
from dpgraph.modeling.compute_norm_for_blobs import ComputeNormForBlobs
from dpgraph.modeling.compute_statistics_for_blobs import ComputeStatisticsForBlobs


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _model():
    model = model_helper.ModelHelper(name="monitor")
    brew.fc(model, brew.fc(model, "data", "fc1", dim_in=4, dim_out=3), "fc2", dim_in=3,
            dim_out=1)
    return model


def _run(model):
    workspace.FeedBlob("data", np.random.RandomState(0).rand(5, 4).astype(np.float32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)


def _added(model, before):
    return [op.type for op in model.net.Proto().op[before:]]


@pytest.mark.parametrize("p,averaged,name", [(2, False, "fc1_w_l2_norm"),
                                             (1, False, "fc1_w_l1_norm"),
                                             (2, True, "fc1_w_averaged_l2_norm"),
                                             (1, True, "fc1_w_averaged_l1_norm")])
def test_norms(p, averaged, name):
    model = _model()
    before = len(model.net.Proto().op)
    ComputeNormForBlobs(["fc1_w", "fc2_w"], logging_frequency=10, p=p,
                        compute_averaged_norm=averaged)(model.net)
    assert _added(model, before) == ["Cast", "LpNorm", "StopGradient", "Print"] * 2
    _run(model)
    w = workspace.FetchBlob("fc1_w")
    want = np.abs(w).sum() if p == 1 else (w * w).sum()
    np.testing.assert_allclose(workspace.FetchBlob(name), [want / w.size if averaged else want],
                               rtol=1e-5)
    assert model.net.output_record() is None


def test_row_norm_without_printing():
    model = _model()
    before = len(model.net.Proto().op)
    ComputeNormForBlobs(["fc1_w"], logging_frequency=-1, compute_averaged_norm=True,
                        row_index=2)(model.net)
    assert _added(model, before) == ["Slice", "Cast", "LpNorm", "StopGradient"]
    _run(model)
    row = workspace.FetchBlob("fc1_w")[2]
    np.testing.assert_allclose(workspace.FetchBlob("fc1_w_row_2_averaged_l2_norm"),
                               [(row * row).sum() / row.size], rtol=1e-5)


def test_statistics_and_output_record():
    model = _model()
    before = len(model.net.Proto().op)
    monitor = ComputeStatisticsForBlobs(["fc1_w"], logging_frequency=10)
    monitor(model.net, modify_output_record=True)
    assert _added(model, before) == ["Cast", "Summarize", "Print"]
    assert monitor.field_name_suffix() == "_summary"
    assert "fc1_w_summary" in model.net.output_record().field_blobs()
    assert "fc1_w_summary" in model.net.Proto().external_output
    _run(model)
    w = workspace.FetchBlob("fc1_w").ravel()
    np.testing.assert_allclose(workspace.FetchBlob("fc1_w_summary"),
                               [w.min(), w.max(), w.mean(), w.std(ddof=1)], rtol=1e-5)


def test_undefined_blob_and_bad_p():
    with pytest.raises(ModelConfigError, match="not defined"):
        ComputeNormForBlobs(["nope"], logging_frequency=1)(_model().net)
    with pytest.raises(ModelConfigError, match="p must be 1 or 2"):
        ComputeNormForBlobs(["fc1_w"], logging_frequency=1, p=3)


@pytest.mark.parametrize("accumulate", [False, True])
def test_histogram_current_and_accumulated(accumulate):
    from dpgraph.modeling.compute_histogram_for_blobs import ComputeHistogramForBlobs

    model = _model()
    before = len(model.net.Proto().op)
    ComputeHistogramForBlobs(["fc1_w"], logging_frequency=10, num_buckets=4,
                             lower_bound=-0.5, upper_bound=0.5, accumulate=accumulate)(model.net)
    assert _added(model, before) == ["Cast", "AccumulateHistogram", "Cast", "NormalizeL1",
                                     "Print"]
    _run(model)
    workspace.RunNetOnce(model.net)  # a second run: the accumulated counts double
    w = workspace.FetchBlob("fc1_w").ravel()
    edges = [-np.inf, -0.5, -0.25, 0.0, 0.25, 0.5, np.inf]
    counts = np.histogram(w, bins=edges)[0]
    np.testing.assert_array_equal(workspace.FetchBlob("fc1_w_curr_hist"), counts)
    np.testing.assert_array_equal(workspace.FetchBlob("fc1_w_acc_hist"), 2 * counts)
    name = "fc1_w_acc_normalized_hist" if accumulate else "fc1_w_curr_normalized_hist"
    np.testing.assert_allclose(workspace.FetchBlob(name), counts / counts.sum(), rtol=1e-6)


@pytest.mark.parametrize("i2,name,expected", [(1, "fc1_w_2_1", lambda w: w[2:3, 1:2]),
                                              (-1, "fc1_w_2_all", lambda w: w[2:3])])
def test_get_entry(i2, name, expected):
    from dpgraph.modeling.get_entry_from_blobs import GetEntryFromBlobs

    model = _model()
    monitor = GetEntryFromBlobs(["fc1_w"], logging_frequency=-1, i1=2, i2=i2)
    monitor(model.net)
    assert monitor.field_name_suffix() == name[len("fc1_w"):]
    _run(model)
    np.testing.assert_array_equal(workspace.FetchBlob(name),
                                  expected(workspace.FetchBlob("fc1_w")))
    with pytest.raises(ModelConfigError, match="i1"):
        GetEntryFromBlobs(["fc1_w"], logging_frequency=1, i1=-1)(_model().net)


def test_normalize_l1_along_an_axis():
    from dpgraph import core

    x = np.array([[1.0, -3.0], [0.0, 0.0]], np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(core.CreateOperator("NormalizeL1", ["x"], ["y"], axis=1))
    np.testing.assert_allclose(workspace.FetchBlob("y"), [[0.25, -0.75], [0.0, 0.0]])
    workspace.RunOperatorOnce(core.CreateOperator("NormalizeL1", ["x"], ["y0"], axis=0))
    np.testing.assert_allclose(workspace.FetchBlob("y0"), [[1.0, -1.0], [0.0, 0.0]])
