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
