"""Caffe2's ``serialized_test.serialized_test_util``: ``given`` and SerializedTestCase,
as used by Caffe2's hypothesis operator tests.

``given`` runs the test once with a fixed seed and one example (the example Caffe2 would
serialize), then with the full hypothesis search.  Caffe2 compared that first run against
golden zip files shipped with its sources; dpgraph ships none, so the comparison runs only
where a golden directory exists (``<output_dir>/operator_test/<file>.<test>/outputs.npz``)
and ``-G`` (``testWithArgs``) writes such files.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dpgraph.jobs.hypothesis_test_util import HypothesisTestCase, hypothesis

operator_test_type = "operator_test"
DATA_SUFFIX = "data"
DATA_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), DATA_SUFFIX)
_output_context = threading.local()


def given(*given_args: Any, **given_kwargs: Any) -> Callable[[Any], Any]:
    """hypothesis ``given``; the first run (seed 0, one example) is the serialized one."""
    def wrapper(f: Any) -> Any:
        full = hypothesis.given(*given_args, **given_kwargs)(f)
        inner = getattr(f, "_hypothesis_internal_use_settings", None)

        @functools.wraps(f)
        def plain(*args: Any, **kwargs: Any) -> Any:
            return f(*args, **kwargs)

        for key in [k for k in plain.__dict__ if k.startswith("_hypothesis_internal")]:
            del plain.__dict__[key]
        one = (hypothesis.settings(inner, max_examples=1) if inner is not None
               else hypothesis.settings(max_examples=1))
        first = hypothesis.seed(0)(one(hypothesis.given(*given_args, **given_kwargs)(plain)))

        def func(self: Any, *args: Any, **kwargs: Any) -> None:
            self.should_serialize = True
            try:
                first(self, *args, **kwargs)
            finally:
                self.should_serialize = False
            full(self, *args, **kwargs)

        func.__name__ = f.__name__
        func.__doc__ = f.__doc__
        return func

    return wrapper


class SerializedTestCase(HypothesisTestCase):
    """HypothesisTestCase whose first reference check may be compared with (or written
    to) golden outputs."""

    should_serialize = False

    def get_output_dir(self) -> str:
        return os.path.join(getattr(_output_context, "output_dir", DATA_DIR),
                            operator_test_type)

    def get_output_filename(self) -> str:
        test_file = os.path.basename(inspect.getfile(self.__class__)).split(".")[0]
        return test_file + "." + self.id().split(".")[-1]

    def _golden_path(self) -> str:
        return os.path.join(self.get_output_dir(), self.get_output_filename(), "outputs.npz")

    def serialize_test(self, inputs: Any, outputs: Any, grad_ops: Any, op: Any,
                       device_option: Any) -> None:
        path = self._golden_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez(path, *[np.asarray(o) for o in outputs])

    def compare_test(self, inputs: Any, outputs: Any, grad_ops: Any, atol: float = 1e-7,
                     rtol: float = 1e-7) -> None:
        path = self._golden_path()
        if not os.path.exists(path):
            return
        with np.load(path, allow_pickle=False) as golden:
            expected = [golden[f"arr_{i}"] for i in range(len(golden.files))]
        self.assertEqual(len(expected), len(outputs))
        for want, got in zip(expected, outputs):
            if want.dtype.kind in "SUO":
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)

    def assertSerializedOperatorChecks(self, inputs: Any, outputs: Any, gradient_operator: Any,
                                       op: Any, device_option: Any, atol: float = 1e-7,
                                       rtol: float = 1e-7) -> None:
        if getattr(_output_context, "should_generate_output", False):
            self.serialize_test(inputs, outputs, gradient_operator, op, device_option)
        else:
            self.compare_test(inputs, outputs, gradient_operator, atol, rtol)

    def assertReferenceChecks(self, device_option: Any, op: Any, inputs: Any,
                              reference: Any, input_device_options: Any = None,
                              threshold: float = 1e-4, output_to_grad: Any = None,
                              grad_reference: Any = None, atol: float | None = None,
                              outputs_to_check: Any = None,
                              ensure_outputs_are_inferred: bool = False) -> list[Any]:
        outs = super().assertReferenceChecks(
            device_option, op, inputs, reference, input_device_options, threshold,
            output_to_grad, grad_reference, atol, outputs_to_check,
            ensure_outputs_are_inferred)
        if self.should_serialize and not getattr(_output_context,
                                                 "disable_serialized_check", False):
            self.assertSerializedOperatorChecks(inputs, outs, None, op, device_option,
                                                threshold if atol is None else atol,
                                                threshold)
        return outs

    @contextlib.contextmanager
    def set_disable_serialized_check(self, value: bool) -> Iterator[None]:
        """Within the block, skip (``True``) or do the serialized-output comparison."""
        previous = getattr(_output_context, "disable_serialized_check", False)
        _output_context.disable_serialized_check = value
        try:
            yield
        finally:
            _output_context.disable_serialized_check = previous


def testWithArgs() -> None:
    """``unittest.main`` with ``-G`` (generate), ``-O DIR`` and ``-D`` (disable checks)."""
    import unittest

    parser = argparse.ArgumentParser()
    parser.add_argument("-G", "--generate-serialized", action="store_true", dest="generate",
                        help="generate output files (default=false, compares)")
    parser.add_argument("-O", "--output", default=DATA_DIR,
                        help="output directory (default: %(default)s)")
    parser.add_argument("-D", "--disable-serialized_check", action="store_true",
                        dest="disable", help="disable checking serialized tests")
    parser.add_argument("unittest_args", nargs="*")
    args = parser.parse_args()
    sys.argv[1:] = args.unittest_args
    _output_context.should_generate_output = args.generate
    _output_context.output_dir = args.output
    _output_context.disable_serialized_check = args.disable
    unittest.main()


__all__ = ["DATA_DIR", "SerializedTestCase", "given", "operator_test_type", "testWithArgs"]
