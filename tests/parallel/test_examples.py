"""The Detectron-style example: 8 virtual GPUs give the same parameters as 1."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "detectron_style.py"


@pytest.fixture
def detectron():
    if not EXAMPLE.exists():
        pytest.skip(f"{EXAMPLE} not present (installed package without examples)")
    spec = importlib.util.spec_from_file_location("detectron_style_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    from dpgraph.compat import caffe2

    caffe2.uninstall()


@pytest.mark.parametrize("use_nccl", [False, True])
def test_eight_virtual_gpus_match_one(detectron, use_nccl: bool) -> None:
    many = detectron.train(8, iters=3, use_nccl=use_nccl)
    net = detectron.LAST_MODEL[0].net.Proto()
    if use_nccl:
        assert sum(op.type == "NCCLAllreduce" for op in net.op) == 6
    else:
        adds = [op for op in net.op if op.type == "Add"]
        assert {op.device_option.device_id for op in adds} == {0, 2, 4, 6}
        assert any(op.output[0].endswith("_copy") for op in net.op if op.type == "Copy")
    one = detectron.train(1, iters=3)
    assert sorted(many) == sorted(one)
    for name in one:
        np.testing.assert_allclose(many[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
