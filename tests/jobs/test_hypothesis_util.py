"""test_util / hypothesis_test_util / device_checker: Caffe2-style op tests run as-is."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpgraph import core, test_util, workspace
from dpgraph import hypothesis_test_util as hu
from dpgraph.device_checker import DeviceChecker


class TestOpChecks(hu.HypothesisTestCase):
    """Collected by pytest as a unittest TestCase, as Caffe2's op tests are."""

    @given(X=hu.tensor(), **hu.gcs)
    @settings(max_examples=5, deadline=None)
    def test_relu(self, X, gc, dc) -> None:
        op = core.CreateOperator("Relu", ["X"], ["Y"])
        X[np.abs(X) < 0.05] += 0.2  # keep away from the kink for the gradient check
        self.assertReferenceChecks(gc, op, [X], lambda x: (np.maximum(x, 0),))
        self.assertDeviceChecks(dc, op, [X], [0])
        self.assertGradientChecks(gc, op, [X], 0, [0])

    @given(inputs=hu.tensors(n=2), **hu.gcs_cpu_only)
    @settings(max_examples=3, deadline=None)
    def test_sum_with_grad_reference(self, inputs, gc, dc) -> None:
        op = core.CreateOperator("Sum", ["X1", "X2"], ["Y"])

        def grad_reference(g, outputs, ins):
            return (g, g)

        self.assertReferenceChecks(gc, op, inputs, lambda a, b: (a + b,),
                                   output_to_grad="Y", grad_reference=grad_reference)

    def test_validation_and_raises(self) -> None:
        op = core.CreateOperator("Relu", ["X"], ["Y"])
        seen = {}
        self.assertValidationChecks(hu.cpu_do, op, [np.array([-1.0, 2.0], np.float32)],
                                    lambda X, Y: seen.update(y=Y))
        np.testing.assert_array_equal(seen["y"], [0.0, 2.0])
        self.assertRunOpRaises(hu.cpu_do, core.CreateOperator("Add", ["A", "B"], ["C"]),
                               [np.ones(2), np.ones(3)])
        outs = hu.runOpOnInput(hu.cpu_do, op, [np.array([-3.0], np.float32)])
        assert outs[0].tolist() == [0.0]

    def test_failing_reference_is_reported(self) -> None:
        op = core.CreateOperator("Relu", ["X"], ["Y"])
        with pytest.raises(AssertionError):
            self.assertReferenceChecks(hu.cpu_do, op, [np.ones(3, np.float32)],
                                       lambda x: (x * 2,))


@given(data=hu.lengths_tensor(min_segments=1, max_segments=3),
       sparse=hu.sparse_lengths_tensor(), seg=hu.segmented_tensor(is_sorted=True),
       one=hu.tensor1d(max_len=5, dtype=np.int32), flags=hu.tensor(dtype=np.bool_))
@settings(max_examples=10, deadline=None)
def test_tensor_strategies(data, sparse, seg, one, flags) -> None:
    values, lengths = data
    assert lengths.sum() == values.shape[0] and 1 <= len(lengths) <= 3
    table, indices, seg_lengths = sparse
    assert indices.max() < table.shape[0] and seg_lengths.sum() == indices.shape[0]
    seg_values, seg_ids = seg
    assert len(seg_ids) == seg_values.shape[0] and np.all(np.diff(seg_ids) >= 0)
    assert one.ndim == 1 and one.dtype == np.int32 and flags.dtype == np.bool_
    assert np.all(np.abs(values) <= 1.0)


def test_device_checker_and_gcs() -> None:
    assert hu.device_options[0] == hu.cpu_do and "gc" in hu.gcs_cpu_only
    checker = DeviceChecker(0.01, [hu.cpu_do, hu.cpu_do])
    op = core.CreateOperator("Tanh", ["X"], ["Y"])
    assert checker.CheckSimple(op, [np.linspace(-1, 1, 5).astype(np.float32)], [0])
    net = core.Net("dc_net")
    net.Tanh("X", "Y")
    assert checker.CheckNet(net.Proto(), {"X": np.ones(3, np.float32)})
    workspace.SetVirtualGpus(1)
    gpu = core.DeviceOption(1, 0)
    bad = DeviceChecker(1e-6, [hu.cpu_do, gpu])
    assert bad.CheckSimple(core.CreateOperator("Tanh", ["X"], ["Y"]),
                           [np.ones(2, np.float32)], [0])


def test_test_util_helpers() -> None:
    case = test_util.TestCase("run")
    case.setUp()
    assert isinstance(case.ws, workspace.C.Workspace)
    test_util.randBlobFloat32("tu_blob", 2, 3, offset=1.0)
    value = workspace.FetchBlob("tu_blob")
    assert value.shape == (2, 3) and value.min() >= 1.0
    case.tearDown()
    assert not workspace.HasBlob("tu_blob")
    assert test_util.rand_array(2).dtype == np.float32
    assert test_util.str_compare(b"abc", "abc")
    net = core.Net("tu_net")
    net.Relu("a", "b")
    assert test_util.numOps(net) == 1

    @test_util.caffe2_flaky
    def flaky() -> None: ...

    assert flaky.__caffe2_flaky__ and not test_util.is_flaky_test_mode()
    assert st is not None


class TestSerialized(__import__("dpgraph.serialized_test.serialized_test_util",
                                fromlist=["x"]).SerializedTestCase):
    """Caffe2's ``@serial.given`` operator tests, with golden outputs written then read."""

    def test_golden_round_trip(self) -> None:
        from dpgraph.serialized_test import serialized_test_util as serial

        runs = []

        @serial.given(X=hu.tensor(min_dim=1, max_dim=1), **hu.gcs_cpu_only)
        @settings(max_examples=3, deadline=None)
        def check(self, X, gc, dc) -> None:
            runs.append(self.should_serialize)
            self.assertReferenceChecks(gc, core.CreateOperator("Sigmoid", ["X"], ["Y"]), [X],
                                       lambda x: (1 / (1 + np.exp(-x)),))

        import tempfile

        from dpgraph.jobs import serialized_test_util as impl

        with tempfile.TemporaryDirectory() as tmp:
            impl._output_context.output_dir = tmp
            impl._output_context.should_generate_output = True
            try:
                check(self)
                assert runs[0] is True and not any(runs[1:])
                impl._output_context.should_generate_output = False
                check(self)  # compares the first example with what was written
                path = self._golden_path()
                assert path.startswith(tmp) and __import__("os").path.exists(path)
                with pytest.raises(AssertionError):
                    self.compare_test([], [np.full(7, 3.0)], None)
            finally:
                del impl._output_context.output_dir
                impl._output_context.should_generate_output = False


def test_run_in_hip_checks_the_test_and_checked_devices() -> None:
    from dpgraph import hip_test_util
    from dpgraph.proto import caffe2_pb2

    hip = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.PROTO_HIP)
    cpu = caffe2_pb2.DeviceOption()
    assert hip_test_util.run_in_hip(hip, [cpu]) and hip_test_util.run_in_hip(cpu, [cpu, hip])
    assert not hip_test_util.run_in_hip(cpu, [cpu])
