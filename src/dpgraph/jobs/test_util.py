"""Caffe2's ``test_util``: the TestCase base of Caffe2-style op and graph tests, and
small helpers (random blobs, op counts, flaky-test marking)."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import unittest
from typing import Any

import numpy as np

from dpgraph.runtime import api as ws_api
from dpgraph.runtime import c_api


def rand_array(*dims: int) -> np.ndarray:
    """Uniform values in [-0.5, 0.5) as float32 (a 0-d array for no dims)."""
    return np.array(np.random.rand(*dims) - 0.5).astype(np.float32)


def randBlob(name: str, type: Any, *dims: int, **kwargs: Any) -> None:
    offset = kwargs.get("offset", 0.0)
    ws_api.FeedBlob(name, np.random.rand(*dims).astype(type) + offset)


def randBlobFloat32(name: str, *dims: int, **kwargs: Any) -> None:
    randBlob(name, np.float32, *dims, **kwargs)


def randBlobsFloat32(names: list[str], *dims: int, **kwargs: Any) -> None:
    for name in names:
        randBlobFloat32(name, *dims, **kwargs)


def numOps(net: Any) -> int:
    return len(net.Proto().op)


def str_compare(a: Any, b: Any, encoding: str = "utf8") -> bool:
    if isinstance(a, bytes):
        a = a.decode(encoding)
    if isinstance(b, bytes):
        b = b.decode(encoding)
    return a == b


def get_default_test_flags() -> list[str]:
    return ["caffe2", "--caffe2_log_level=0", "--v=0",
            "--caffe2_cpu_allocator_do_zero_fill=0",
            "--caffe2_cpu_allocator_do_junk_fill=1"]


def caffe2_flaky(test_method: Any) -> Any:
    """Mark a test flaky: it runs only when ``CAFFE2_RUN_FLAKY_TESTS=1``."""
    test_method.__caffe2_flaky__ = True
    return test_method


def is_flaky_test_mode() -> bool:
    return os.getenv("CAFFE2_RUN_FLAKY_TESTS", "0") == "1"


class TestCase(unittest.TestCase):
    """Resets the current workspace around each test; ``self.ws`` is a fresh
    ``workspace.C.Workspace``."""

    @classmethod
    def setUpClass(cls) -> None:
        ws_api.GlobalInit(get_default_test_flags())
        c_api.SetEnginePref({}, {})

    def setUp(self) -> None:
        test_method = getattr(self, self._testMethodName)
        flaky = getattr(test_method, "__caffe2_flaky__", False)
        if is_flaky_test_mode() and not flaky:
            raise unittest.SkipTest("Non-flaky tests are skipped in flaky test mode")
        if not is_flaky_test_mode() and flaky:
            raise unittest.SkipTest("Flaky tests are skipped in regular test mode")
        self.ws = c_api.Workspace()
        ws_api.ResetWorkspace()

    def tearDown(self) -> None:
        ws_api.ResetWorkspace()

    def make_tempdir(self) -> pathlib.Path:
        """A fresh temporary folder, removed when the test ends (Caffe2 2021)."""
        folder = pathlib.Path(tempfile.mkdtemp(prefix="caffe2_test."))
        self.addCleanup(shutil.rmtree, str(folder), True)
        return folder


__all__ = ["TestCase", "caffe2_flaky", "get_default_test_flags", "is_flaky_test_mode",
           "numOps", "randBlob", "randBlobFloat32", "randBlobsFloat32", "rand_array",
           "str_compare"]
