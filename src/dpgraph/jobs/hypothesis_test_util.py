"""Caffe2's ``hypothesis_test_util``: hypothesis strategies for tensors and device
options (``gcs``), and HypothesisTestCase with device, gradient and reference checks.

Needs the ``hypothesis`` package (dpgraph's ``test`` extra).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from dpgraph.errors import MissingDependencyError
from dpgraph.ir.analysis import InferOpBlobDevicesAsDict
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.device import CUDA
from dpgraph.ir.scope import DeviceScope
from dpgraph.jobs import device_checker, gradient_checker
from dpgraph.jobs.test_util import TestCase
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api as ws_api
from dpgraph.runtime import devices

try:
    import hypothesis
    import hypothesis.extra.numpy
    from hypothesis import strategies as st
except ImportError as _error:  # pragma: no cover - hypothesis is a test dependency
    raise MissingDependencyError(
        "caffe2.python.hypothesis_test_util needs the 'hypothesis' package; install it "
        "with `pip install hypothesis` (or dpgraph[test]).") from _error

logger = logging.getLogger("dpgraph.hypothesis_test_util")


def is_sandcastle() -> bool:
    return os.getenv("SANDCASTLE") == "1" or os.getenv("TW_JOB_USER") == "sandcastle"


def is_travis() -> bool:
    return "TRAVIS" in os.environ


def settings(*args: Any, **kwargs: Any) -> Any:
    """``hypothesis.settings`` accepting Caffe2's retired arguments: ``min_satisfying_examples``
    is dropped and ``timeout`` (seconds) becomes ``deadline`` (milliseconds)."""
    kwargs.pop("min_satisfying_examples", None)
    if "timeout" in kwargs:
        timeout = kwargs.pop("timeout")
        kwargs.setdefault("deadline", None if timeout is None else timeout * 1e3)
    return hypothesis.settings(*args, **kwargs)


def to_float32(x: Any) -> float:
    """``x`` rounded to the nearest float32, as a Python float."""
    return float(np.float32(float(x)))


def floats(*args: Any, **kwargs: Any) -> Any:
    """``st.floats`` with ``width=32`` unless a width is given; then min/max are rounded to
    float32 so hypothesis accepts them (Caffe2's wrapper)."""
    if "width" not in kwargs:
        kwargs["width"] = 32
        for bound in ("min_value", "max_value"):
            if kwargs.get(bound) is not None:
                kwargs[bound] = to_float32(kwargs[bound])
    return st.floats(*args, **kwargs)


def _relaxed_health_checks() -> list[Any]:
    """Health checks Caffe2's dev/debug profiles turn off: ``too_slow``, plus
    ``differing_executors`` (newer hypothesis; Caffe2 tests share one ``@given`` helper
    between test methods)."""
    relaxed = [hypothesis.HealthCheck.too_slow]
    if hasattr(hypothesis.HealthCheck, "differing_executors"):
        relaxed.append(hypothesis.HealthCheck.differing_executors)
    return relaxed


def _register_profiles() -> None:
    register = hypothesis.settings.register_profile
    register("sandcastle", max_examples=50, deadline=None, derandomize=True,
             database=None, suppress_health_check=list(hypothesis.HealthCheck))
    register("dev", max_examples=10, deadline=None, derandomize=True,
             database=None, suppress_health_check=_relaxed_health_checks())
    register("debug", max_examples=1000, deadline=None, derandomize=True,
             database=None, suppress_health_check=_relaxed_health_checks(),
             verbosity=hypothesis.Verbosity.verbose)
    hypothesis.settings.load_profile("sandcastle" if is_sandcastle()
                                     else os.getenv("CAFFE2_HYPOTHESIS_PROFILE", "dev"))


_register_profiles()


def dims(min_value: int = 1, max_value: int = 5) -> Any:
    return st.integers(min_value=min_value, max_value=max_value)


def elements_of_type(dtype: Any = np.float32, filter_: Callable[[Any], bool] | None = None
                     ) -> Any:
    """Element strategy per dtype: floats in [-1, 1], non-negative ints, booleans."""
    dtype = np.dtype(dtype).type
    if dtype is np.float16:
        elems = st.floats(min_value=-1.0, max_value=1.0, width=16)
    elif dtype is np.float32:
        elems = st.floats(min_value=-1.0, max_value=1.0, width=32)
    elif dtype is np.float64:
        elems = st.floats(min_value=-1.0, max_value=1.0, width=64)
    elif dtype is np.int32:
        elems = st.integers(min_value=0, max_value=2 ** 31 - 1)
    elif dtype is np.int64:
        elems = st.integers(min_value=0, max_value=2 ** 63 - 1)
    elif dtype is np.bool_:
        elems = st.booleans()
    else:
        raise ValueError("Unexpected dtype without elements provided")
    return elems if filter_ is None else elems.filter(filter_)


def arrays(dims: Any, dtype: Any = np.float32, elements: Any = None, unique: bool = False
           ) -> Any:
    if elements is None:
        elements = elements_of_type(dtype)
    return hypothesis.extra.numpy.arrays(dtype, dims, elements=elements, unique=unique)


def tensor(min_dim: int = 1, max_dim: int = 4, dtype: Any = np.float32, elements: Any = None,
           unique: bool = False, **kwargs: Any) -> Any:
    """Arrays of ``min_dim``..``max_dim`` dimensions, each of size ``dims(**kwargs)``."""
    dims_ = st.lists(dims(**kwargs), min_size=min_dim, max_size=max_dim)
    return dims_.flatmap(lambda d: arrays(d, dtype, elements, unique=unique))


def tensor1d(min_len: int = 1, max_len: int = 64, dtype: Any = np.float32,
             elements: Any = None) -> Any:
    return tensor(1, 1, dtype, elements, min_value=min_len, max_value=max_len)


def segment_ids(size: int, is_sorted: bool) -> Any:
    if size == 0:
        return st.just(np.empty(shape=[0], dtype=np.int32))
    if is_sorted:
        return arrays([size], dtype=np.int32, elements=st.booleans()).map(
            lambda x: np.cumsum(x, dtype=np.int32) - x[0])
    return arrays([size], dtype=np.int32,
                  elements=st.integers(min_value=0, max_value=2 * size))


def lengths(size: int, min_segments: int | None = None, max_segments: int | None = None,
            **kwargs: Any) -> Any:
    """Segment lengths (possibly 0) summing to ``size``."""
    min_segments = 0 if min_segments is None else min_segments
    max_segments = size if max_segments is None else max_segments
    if not 0 <= min_segments <= max_segments:
        raise ValueError(f"need 0 <= min_segments ({min_segments}) <= max_segments "
                         f"({max_segments})")
    if size == 0 and max_segments == 0:
        return st.just(np.empty(shape=[0], dtype=np.int32))
    if max_segments <= 0:
        raise ValueError("size is not 0, need at least one segment")
    return st.integers(min_value=max(min_segments - 1, 0), max_value=max_segments - 1).flatmap(
        lambda borders: hypothesis.extra.numpy.arrays(
            np.int32, borders, elements=st.integers(min_value=0, max_value=size))
    ).map(lambda x: np.append(x, np.array([0, size], dtype=np.int32))).map(sorted).map(np.diff)


def segmented_tensor(min_dim: int = 1, max_dim: int = 4, dtype: Any = np.float32,
                     is_sorted: bool = True, elements: Any = None,
                     segment_generator: Callable[..., Any] = segment_ids,
                     allow_empty: bool = False, **kwargs: Any) -> Any:
    """``(data, segments)`` with one segment entry per row of data."""
    gen_empty = st.booleans() if allow_empty else st.just(False)
    data_dims_ = st.lists(dims(**kwargs), min_size=min_dim, max_size=max_dim)
    data_dims_ = st.tuples(gen_empty, data_dims_).map(
        lambda pair: ([0] if pair[0] else []) + pair[1])
    return data_dims_.flatmap(lambda data_dims: st.tuples(
        arrays(data_dims, dtype, elements),
        segment_generator(data_dims[0], is_sorted=is_sorted)))


def lengths_tensor(min_segments: int | None = None, max_segments: int | None = None,
                   *args: Any, **kwargs: Any) -> Any:
    gen = functools.partial(lengths, min_segments=min_segments, max_segments=max_segments)
    kwargs["segment_generator"] = gen
    return segmented_tensor(*args, **kwargs)


def sparse_segmented_tensor(min_dim: int = 1, max_dim: int = 4, dtype: Any = np.float32,
                            is_sorted: bool = True, elements: Any = None,
                            allow_empty: bool = False,
                            segment_generator: Callable[..., Any] = segment_ids,
                            itype: Any = np.int64, **kwargs: Any) -> Any:
    """``(data, indices, segments)``: indices into data's rows, segments per index."""
    gen_empty = st.booleans() if allow_empty else st.just(False)
    data_dims_ = st.lists(dims(**kwargs), min_size=min_dim, max_size=max_dim)
    all_dims_ = st.tuples(gen_empty, data_dims_).flatmap(lambda pair: st.tuples(
        st.just(pair[1]),
        st.integers(min_value=1, max_value=pair[1][0]) if not pair[0] else st.just(0)))
    return all_dims_.flatmap(lambda d: st.tuples(
        arrays(d[0], dtype, elements),
        arrays(d[1], dtype=itype, elements=st.integers(min_value=0, max_value=d[0][0] - 1)),
        segment_generator(d[1], is_sorted=is_sorted)))


def sparse_lengths_tensor(**kwargs: Any) -> Any:
    return sparse_segmented_tensor(segment_generator=lengths, **kwargs)


def tensors(n: int, min_dim: int = 1, max_dim: int = 4, dtype: Any = np.float32,
            elements: Any = None, **kwargs: Any) -> Any:
    """``n`` arrays of one common shape."""
    dims_ = st.lists(dims(**kwargs), min_size=min_dim, max_size=max_dim)
    return dims_.flatmap(lambda d: st.lists(arrays(d, dtype, elements), min_size=n,
                                            max_size=n))


def tensors1d(n: int, min_len: int = 1, max_len: int = 64, dtype: Any = np.float32,
              elements: Any = None) -> Any:
    return tensors(n, 1, 1, dtype, elements, min_value=min_len, max_value=max_len)


cpu_do = caffe2_pb2.DeviceOption()
cuda_do = caffe2_pb2.DeviceOption(device_type=CUDA)
hip_do = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.PROTO_HIP)
gpu_do = caffe2_pb2.DeviceOption(device_type=CUDA)
_has_gpu = devices.NumGpuDevices() > 0
_cuda_do_list = [cuda_do] if _has_gpu else []
_hip_do_list: list[caffe2_pb2.DeviceOption] = []
_gpu_do_list = [gpu_do] if _has_gpu else []
_device_options_no_hip = [cpu_do] + _cuda_do_list
device_options = _device_options_no_hip + _hip_do_list


def run_in_hip(gc: caffe2_pb2.DeviceOption, dc: Any) -> bool:
    """Whether the test device ``gc`` or any of the checked devices ``dc`` is HIP
    (Caffe2's ``hip_test_util.run_in_hip``)."""
    return gc.device_type == caffe2_pb2.PROTO_HIP or any(
        d.device_type == caffe2_pb2.PROTO_HIP for d in dc)


expanded_device_options = [cpu_do] + [caffe2_pb2.DeviceOption(device_type=CUDA, device_id=i)
                                      for i in range(devices.NumGpuDevices())]


def device_checker_device_options() -> Any:
    return st.just(device_options)


def gradient_checker_device_option() -> Any:
    return st.sampled_from(device_options)


gcs = {"gc": gradient_checker_device_option(), "dc": device_checker_device_options()}
gcs_cpu_only = {"gc": st.sampled_from([cpu_do]), "dc": st.just([cpu_do])}
gcs_cuda_only = {"gc": st.sampled_from(_cuda_do_list), "dc": st.just(_cuda_do_list)}
gcs_gpu_only = {"gc": st.sampled_from(_gpu_do_list), "dc": st.just(_gpu_do_list)}
gcs_no_hip = {"gc": st.sampled_from(_device_options_no_hip),
              "dc": st.just(_device_options_no_hip)}


def mkl_test_strategies() -> tuple[Any, ...]:
    """``(mkl_do, device_options, gcs, gcs_cpu_only, gcs_gpu_only, gcs_mkl_only,
    gcs_cpu_mkl)`` of Caffe2's mkl_test_util (no MKL-DNN device in dpgraph)."""
    mkl_do = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.PROTO_MKLDNN)
    options = list(device_options)
    return (mkl_do, options,
            {"gc": st.sampled_from(options), "dc": st.just(options)},
            {"gc": st.sampled_from([cpu_do]), "dc": st.just([cpu_do])},
            {"gc": st.sampled_from([gpu_do]), "dc": st.just([gpu_do])},
            {"gc": st.sampled_from([mkl_do]), "dc": st.just([mkl_do])},
            {"gc": st.sampled_from([cpu_do, mkl_do]), "dc": st.just([cpu_do, mkl_do])})


@contextlib.contextmanager
def temp_workspace(name: Any = b"temp_ws") -> Iterator[None]:
    """Run in workspace ``name`` (reset afterwards), then switch back."""
    old = ws_api.CurrentWorkspace()
    ws_api.SwitchWorkspace(name.decode() if isinstance(name, bytes) else name, True)
    try:
        yield
    finally:
        ws_api.ResetWorkspace()
        ws_api.SwitchWorkspace(old)


def _feed_inputs(op: caffe2_pb2.OperatorDef, inputs: Sequence[Any],
                 device_option: caffe2_pb2.DeviceOption,
                 input_device_options: dict[str, Any] | None) -> None:
    if len(op.input) > len(inputs):
        raise ValueError(f"must supply an input for each input on the op: {list(op.input)} "
                         f"vs {len(inputs)} inputs")
    placement = input_device_options or InferOpBlobDevicesAsDict(op)[0]
    for name, value in zip(op.input, inputs):
        ws_api.FeedBlob(name, value, device_option=placement.get(name, device_option))


def runOpOnInput(device_option: caffe2_pb2.DeviceOption, op: caffe2_pb2.OperatorDef,
                 inputs: Sequence[Any], input_device_options: dict[str, Any] | None = None
                 ) -> list[Any]:
    """Run ``op`` once on ``inputs`` in a temporary workspace; all its outputs."""
    op = copy.deepcopy(op)
    op.device_option.CopyFrom(device_option)
    with temp_workspace():
        _feed_inputs(op, inputs, device_option, input_device_options)
        ws_api.RunOperatorOnce(op)
        return [ws_api.FetchBlob(name) for name in op.output]


def runOpBenchmark(device_option: caffe2_pb2.DeviceOption, op: caffe2_pb2.OperatorDef,
                   inputs: Sequence[Any], input_device_options: dict[str, Any] | None = None,
                   iterations: int = 10) -> Any:
    """Per-op timings of ``op`` over ``iterations`` runs (BenchmarkNet's result)."""
    from dpgraph.ir.net import Net

    op = copy.deepcopy(op)
    op.device_option.CopyFrom(device_option)
    net = Net("op_bench")
    net.Proto().op.extend([op])
    with temp_workspace():
        _feed_inputs(op, inputs, device_option, input_device_options)
        ws_api.CreateNet(net)
        return ws_api.BenchmarkNet(net.Name(), 1, iterations, True)


_TYPE_OF_DTYPE = {np.dtype("float64"): caffe2_pb2.TensorProto.DOUBLE,
                  np.dtype("float32"): caffe2_pb2.TensorProto.FLOAT,
                  np.dtype("int32"): caffe2_pb2.TensorProto.INT32,
                  np.dtype("int64"): caffe2_pb2.TensorProto.INT64}


class HypothesisTestCase(TestCase):
    """A TestCase with checks for ops driven by hypothesis strategies."""

    def assertDeviceChecks(self, device_options: Sequence[Any], op: caffe2_pb2.OperatorDef,
                           inputs: Sequence[Any], outputs_to_check: Sequence[int],
                           input_device_options: dict[str, Any] | None = None,
                           threshold: float = 0.01) -> None:
        """The op computes the same outputs on every device option."""
        checker = device_checker.DeviceChecker(threshold, device_options=device_options)
        self.assertTrue(checker.CheckSimple(op, inputs, outputs_to_check,
                                            input_device_options))

    def assertGradientChecks(self, device_option: caffe2_pb2.DeviceOption,
                             op: caffe2_pb2.OperatorDef, inputs: list[Any],
                             outputs_to_check: int, outputs_with_grads: Sequence[int],
                             grad_ops: Any = None, threshold: float = 0.005,
                             stepsize: float = 0.05,
                             input_device_options: dict[str, Any] | None = None,
                             ensure_outputs_are_inferred: bool = False) -> None:
        """The gradient of input ``outputs_to_check`` matches central differences."""
        checker = gradient_checker.GradientChecker(
            stepsize=stepsize, threshold=threshold, device_option=device_option,
            workspace_name=str(device_option), input_device_options=input_device_options)
        ok, grad, estimate = checker.CheckSimple(
            op, inputs, outputs_to_check, outputs_with_grads, grad_ops=grad_ops,
            input_device_options=input_device_options,
            ensure_outputs_are_inferred=ensure_outputs_are_inferred)
        self.assertEqual(grad.shape, estimate.shape)
        self.assertTrue(ok, "Gradient check failed for input " + str(op.input[outputs_to_check]))

    def _assertGradReferenceChecks(self, op: caffe2_pb2.OperatorDef, inputs: Sequence[Any],
                                   ref_outputs: Sequence[Any], output_to_grad: str,
                                   grad_reference: Callable[..., Any],
                                   threshold: float = 1e-4) -> None:
        from dpgraph.autodiff import GRADIENT_REGISTRY

        grad_name = output_to_grad + "_grad"
        grad_ops, grad_map = GRADIENT_REGISTRY.GetBackwardPass([op], {output_to_grad: grad_name})
        output_grad = ws_api.FetchBlob(output_to_grad)
        grad_ref_outputs = grad_reference(output_grad, ref_outputs, inputs)
        ws_api.FeedBlob(grad_name, ws_api.FetchBlob(output_to_grad))
        ws_api.RunOperatorsOnce(grad_ops)
        self.assertEqual(len(grad_ref_outputs), len(inputs))
        for name, ref in zip(op.input, grad_ref_outputs):
            grad = grad_map.get(name)
            if not grad:
                self.assertIsNone(ref)
                continue
            if isinstance(grad, BlobReference):
                ref_vals, ref_indices, val_name = ref, None, grad
            else:
                (ref_vals, ref_indices), val_name = ref, grad.values
            np.testing.assert_allclose(
                ws_api.FetchBlob(str(val_name)), ref_vals, atol=threshold, rtol=threshold,
                err_msg=f"Gradient {val_name} (x) is not matching the reference (y)")
            if ref_indices is not None:
                np.testing.assert_allclose(ws_api.FetchBlob(str(grad.indices)), ref_indices,
                                           atol=1e-4, rtol=1e-4)

    def _assertInferTensorChecks(self, name: str, shapes: dict[str, Any],
                                 types: dict[str, Any], output: Any,
                                 ensure_output_is_inferred: bool = False) -> None:
        self.assertTrue(not ensure_output_is_inferred or name in shapes,
                        f"Shape for {name} was not inferred")
        if name not in shapes:
            return
        output = ws_api.FetchBlob(name)
        correct_type = (_TYPE_OF_DTYPE.get(output.dtype, f"unknown {output.dtype}")
                        if isinstance(output, np.ndarray) else str(type(output)))
        try:
            np.testing.assert_array_equal(
                np.array(shapes[name]).astype(np.int32), np.array(output.shape).astype(np.int32),
                err_msg=f"Shape {name} mismatch: {shapes[name]} vs. {output.shape}")
            if correct_type != caffe2_pb2.TensorProto.INT32:
                return
            np.testing.assert_equal(types[name], correct_type,
                                    err_msg=f"Type {name} mismatch: {types[name]} vs. "
                                            f"{correct_type}")
        except AssertionError as error:
            logger.warning(str(error))
            if os.getenv("CAFFE2_ASSERT_SHAPEINFERENCE") == "1" or ensure_output_is_inferred:
                raise

    def assertReferenceChecks(self, device_option: caffe2_pb2.DeviceOption,
                              op: caffe2_pb2.OperatorDef, inputs: Sequence[Any],
                              reference: Callable[..., Any],
                              input_device_options: dict[str, Any] | None = None,
                              threshold: float = 1e-4, output_to_grad: str | None = None,
                              grad_reference: Callable[..., Any] | None = None,
                              atol: float | None = None,
                              outputs_to_check: Sequence[int] | None = None,
                              ensure_outputs_are_inferred: bool = False) -> list[Any]:
        """The op's outputs match ``reference(*inputs)`` (a tuple/list of arrays) within
        ``threshold``; optionally its gradient matches ``grad_reference``."""
        from dpgraph.ir.net import Net

        op = copy.deepcopy(op)
        op.device_option.CopyFrom(device_option)
        with temp_workspace():
            _feed_inputs(op, inputs, device_option, input_device_options)
            net = Net("opnet")
            net.Proto().op.extend([op])
            shapes: dict[str, Any] = {}
            types: dict[str, Any] = {}
            test_shape_inference = False
            try:
                shapes, types = ws_api.InferShapesAndTypes([net])
                test_shape_inference = True
            except RuntimeError as error:
                logger.warning(str(error))
                if os.getenv("CAFFE2_ASSERT_SHAPEINFERENCE") == "1" or \
                        ensure_outputs_are_inferred:
                    raise
            ws_api.RunNetOnce(net)
            reference_outputs = reference(*inputs)
            if not isinstance(reference_outputs, (tuple, list)):
                raise RuntimeError("You are providing a wrong reference implementation. A "
                                   "proper one should return a tuple/list of numpy arrays.")
            if not outputs_to_check:
                self.assertEqual(len(reference_outputs), len(op.output))
                outputs_to_check = list(range(len(op.output)))
            outs = []
            for index, ref in zip(outputs_to_check, reference_outputs):
                name = op.output[index]
                output = ws_api.FetchBlob(name)
                if getattr(output, "dtype", np.dtype(object)).kind in ("S", "O"):
                    np.testing.assert_array_equal(output, ref)
                else:
                    np.testing.assert_allclose(
                        output, ref, atol=threshold if atol is None else atol,
                        rtol=threshold, err_msg=f"Output {name} is not matching the reference")
                if test_shape_inference:
                    self._assertInferTensorChecks(name, shapes, types, output,
                                                  ensure_output_is_inferred=(
                                                      ensure_outputs_are_inferred))
                outs.append(output)
            if grad_reference is not None:
                if output_to_grad is None:
                    raise ValueError("If grad_reference is set, output_to_grad has to be set "
                                     "as well")
                with DeviceScope(device_option):
                    self._assertGradReferenceChecks(op, inputs, reference_outputs,
                                                    output_to_grad, grad_reference,
                                                    threshold=threshold)
            return outs

    def assertValidationChecks(self, device_option: caffe2_pb2.DeviceOption,
                               op: caffe2_pb2.OperatorDef, inputs: Sequence[Any],
                               validator: Callable[..., Any],
                               input_device_options: dict[str, Any] | None = None,
                               as_kwargs: bool = True, init_net: Any = None) -> None:
        """Run the op and call ``validator`` on its inputs and outputs."""
        if as_kwargs and len(set(op.input) | set(op.output)) != len(op.input) + len(op.output):
            raise ValueError("in-place ops are not supported in as_kwargs mode")
        op = copy.deepcopy(op)
        op.device_option.CopyFrom(device_option)
        with temp_workspace():
            _feed_inputs(op, inputs, device_option, input_device_options)
            if init_net:
                ws_api.RunNetOnce(init_net)
            ws_api.RunOperatorOnce(op)
            outputs = [ws_api.FetchBlob(n) for n in op.output]
            if as_kwargs:
                validator(**dict(zip(list(op.input) + list(op.output),
                                     list(inputs) + outputs)))
            else:
                validator(inputs=inputs, outputs=outputs)

    def assertRunOpRaises(self, device_option: caffe2_pb2.DeviceOption,
                          op: caffe2_pb2.OperatorDef, inputs: Sequence[Any],
                          input_device_options: dict[str, Any] | None = None,
                          exception: Any = (Exception,), regexp: str | None = None) -> None:
        """Running the op raises ``exception`` (matching ``regexp`` when given)."""
        op = copy.deepcopy(op)
        op.device_option.CopyFrom(device_option)
        with temp_workspace():
            _feed_inputs(op, inputs, device_option, input_device_options)
            if regexp is None:
                self.assertRaises(exception, ws_api.RunOperatorOnce, op)
            else:
                self.assertRaisesRegex(exception, regexp, ws_api.RunOperatorOnce, op)


__all__ = [
    "HypothesisTestCase", "arrays", "cpu_do", "cuda_do", "device_checker_device_options",
    "device_options", "dims", "elements_of_type", "expanded_device_options", "gcs",
    "gcs_cpu_only", "gcs_cuda_only", "gcs_gpu_only", "gcs_no_hip", "gpu_do",
    "mkl_test_strategies",
    "gradient_checker_device_option", "hip_do", "is_sandcastle", "is_travis", "lengths",
    "lengths_tensor", "runOpBenchmark", "runOpOnInput", "segment_ids", "segmented_tensor",
    "sparse_lengths_tensor", "sparse_segmented_tensor", "temp_workspace", "tensor",
    "tensor1d", "tensors", "tensors1d",
]
