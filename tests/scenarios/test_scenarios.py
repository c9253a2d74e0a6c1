"""Caffe2-era training scripts, run unchanged through the ``caffe2`` import alias.

Each script under ``scripts/`` is written the way people wrote Caffe2 code in 2018-2020
(``from caffe2.python import ...``). These tests run them in-process (and one through
``python -m dpgraph.compat.caffe2``) and check the numbers: N devices against one device fed
the whole batch, losses going down, blob names Caffe2 scripts rely on.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph import workspace
from dpgraph.compat import caffe2 as alias

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def caffe2() -> Iterator[None]:
    """The alias installed, a clean workspace, no virtual GPUs left behind."""
    was_installed = alias.is_installed()
    alias.install()
    workspace.ResetWorkspace()
    try:
        yield
    finally:
        workspace.SetVirtualGpus(0)
        workspace.ResetWorkspace()
        if not was_installed:
            alias.uninstall()


def load(name: str) -> dict[str, Any]:
    """The script's globals, without running its ``__main__`` block."""
    return runpy.run_path(str(SCRIPTS / name), run_name=f"scenario_{Path(name).stem}")


def max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


# ---------------------------------------------------------------------------------------------
# resnet50_trainer-like: brew CNN, Parallelize_GPU, multi-precision SGD, checkpoints, test net


@pytest.mark.parametrize("opts", [
    {},
    {"multi_precision": False},
    {"net_type": "simple", "use_nccl": True},
    {"optimize_gradient_memory": True},
], ids=["mp_sgd_dag", "sgd", "simple_nccl", "memonger"])
def test_resnet_trainer_four_gpus_equal_one(caffe2: None, opts: dict[str, Any]) -> None:
    script = load("resnet_trainer.py")
    script["OPTS"].update(opts)
    l1, p1, lrs1, _, rm1 = script["train"](1)
    l4, p4, lrs4, model, rm4 = script["train"](4)
    assert l1[-1] < l1[0] - 0.1  # it learns
    # per-device losses are unscaled means over a quarter batch: their sum is 4x the mean
    np.testing.assert_allclose(np.array(l4) / 4, l1, rtol=1e-5)
    assert max_diff(p1, p4) < 1e-6  # combine_spatial_bn: the same BN statistics
    np.testing.assert_allclose(rm4, rm1, atol=1e-6)
    kind = "MultiPrecisionSgdOptimizer" if script["OPTS"]["multi_precision"] else "SgdOptimizer"
    assert len(lrs1) == 1 and len(lrs4) == 4
    assert all(name.startswith(kind + "_") and name.endswith(f"_lr_gpu{i}")
               for i, name in enumerate(lrs4))
    # every GPU holds the same parameters after training
    for g in range(1, 4):
        for p in model.GetParams(f"gpu_{g}/"):
            np.testing.assert_array_equal(workspace.FetchBlob(p),
                                          workspace.FetchBlob(str(p).replace(f"gpu_{g}", "gpu_0")))


def test_resnet_trainer_checkpoint_and_lr_schedule(caffe2: None) -> None:
    script = load("resnet_trainer.py")
    _, _, lrs, model, _ = script["train"](4)
    # feeding optimizer_iteration=200 under a CPU scope moves the step schedule two steps
    assert script["RESULTS"]["lr_after"] == pytest.approx(0.1 * 0.1 ** 2, rel=1e-6)
    assert 0.0 <= script["RESULTS"]["test_acc"] <= 1.0  # the is_test model ran on gpu_0
    names, worst = script["checkpoint_roundtrip"](model, 4)
    assert "optimizer_iteration" in names
    assert "gpu_0/conv1_w" in names and "gpu_0/conv1_w_momentum" in names
    assert "gpu_0/conv1_spatbn_rm" in names  # computed params are checkpointed too
    assert not any(n.startswith("gpu_1/") for n in names)
    assert worst == 0.0  # FinalizeAfterCheckpoint broadcast gpu_0's blobs to every GPU


# ---------------------------------------------------------------------------------------------
# Detectron-like: CNNModelHelper subclass, NamedCudaScope, muji / NCCLAllreduce, per-GPU update


@pytest.mark.parametrize("num_gpus,use_nccl,peer", [
    (4, False, None), (4, True, None), (2, False, None), (8, False, None),
    (4, False, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]),
    (8, False, np.eye(8, dtype=bool).tolist()),
], ids=["muji4", "nccl4", "muji2", "muji8", "muji4_two_groups", "muji8_no_peer"])
def test_detectron_training_matches_one_gpu(caffe2: None, num_gpus: int, use_nccl: bool,
                                            peer: Any) -> None:
    script = load("detectron_train.py")
    workspace.SetVirtualGpus(max(num_gpus, 4) if peer is None else num_gpus, peer_access=peer)
    batch = 8 * num_gpus // 2 if num_gpus > 4 else 8
    l1, p1, _, _ = script["run"](1, False, batch=batch)
    ln, pn, spread, model = script["run"](num_gpus, use_nccl, batch=batch)
    np.testing.assert_allclose(ln, l1, rtol=1e-5)
    assert max_diff(p1, pn) < 1e-6
    assert spread == 0.0  # the allreduce left every GPU with the same update
    assert l1[-1] < l1[0]
    # UpdateWorkspaceLr fed gpu_<i>/lr inside CudaScope(i) and rescaled the momenta
    for g in range(num_gpus):
        np.testing.assert_allclose(workspace.FetchBlob(f"gpu_{g}/lr"), [0.002], rtol=1e-6)
    # the Detectron-style Python op wrote int32 labels on every GPU
    labels = workspace.FetchBlob(f"gpu_{num_gpus - 1}/labels")
    assert labels.dtype == np.int32 and labels.shape == (batch // num_gpus,)
    # AffineChannel (frozen BN, is_learnable=0) gets no parameter gradients, as in Caffe2
    assert len(model.params) == 6 * num_gpus
    assert len(model.TrainableParams()) == 4 * num_gpus
    assert [str(p) for p in model.TrainableParams(gpu_id=1)] == [
        "gpu_1/conv1_w", "gpu_1/conv1_b", "gpu_1/cls_score_w", "gpu_1/cls_score_b"]


def test_detectron_script_runs_through_module_alias() -> None:
    env = dict(os.environ, DPGRAPH_VIRTUAL_GPUS="4")
    proc = subprocess.run(
        [sys.executable, "-m", "dpgraph.compat.caffe2", str(SCRIPTS / "detectron_train.py")],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind in ("muji", "nccl"):
        np.testing.assert_allclose(out[kind]["losses"], out["losses_1"], rtol=1e-5)
        assert out[kind]["diff"] < 1e-6 and out[kind]["spread"] == 0.0


def test_module_alias_puts_the_script_folder_first(tmp_path: Path) -> None:
    """``python -m dpgraph.compat.caffe2 tools/x.py`` imports x's siblings, like ``python``."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "c2_helpers.py").write_text("NUM = 7\n")
    (tools / "train_net.py").write_text(
        "import sys\nimport c2_helpers\nfrom caffe2.python import workspace\n"
        "print(c2_helpers.NUM, workspace.NumCudaDevices(), sys.argv[1:])\n")
    env = dict(os.environ, DPGRAPH_VIRTUAL_GPUS="2")
    proc = subprocess.run(
        [sys.executable, "-m", "dpgraph.compat.caffe2", "tools/train_net.py", "--cfg", "a"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["7", "2", "['--cfg',", "'a']"]


# ---------------------------------------------------------------------------------------------
# data_parallel_model_test-like CPU script


def test_dpm_cpu_devices_equal_one_device(caffe2: None) -> None:
    script = load("dpm_cpu_equivalence.py")
    w1, _ = script["run_model"]([0])
    w2, _ = script["run_model"]([0, 1])
    w4, model = script["run_model"]([0, 1, 2, 3])
    assert not np.allclose(w1, 0.0)  # it trained away from the ConstantFill init
    np.testing.assert_allclose(w2, w1, atol=1e-6)
    np.testing.assert_allclose(w4, w1, atol=1e-6)
    assert model._device_prefix == "cpu" and model._devices == [0, 1, 2, 3]
    assert workspace.HasBlob("cpu_3/sync_num")

    p1, l1, _, _ = script["run_sgd_model"]([0])
    p4, l4, lrs, lr = script["run_sgd_model"]([0, 1, 2, 3])
    assert max_diff(p1, p4) < 1e-5
    np.testing.assert_allclose(l4, l1, rtol=1e-5)
    assert l1[-1] < l1[0]
    assert len(lrs) == 1 and lrs[0].startswith("SgdOptimizer_") and lrs[0].endswith("_lr_cpu")
    np.testing.assert_allclose(lr, [0.05], rtol=1e-6)  # 0.2 * 0.5 ** (6 // 3)


# ---------------------------------------------------------------------------------------------
# sparse embeddings with Adagrad / ScatterWeightedSum


@pytest.mark.parametrize("param_update", [False, True], ids=["adagrad", "scatter_sgd"])
def test_embedding_sparse_gradients_match_one_gpu(caffe2: None, param_update: bool) -> None:
    script = load("embedding_adagrad.py")
    l1, f1, _, sparse1 = script["run"](1, use_dpm_param_update=param_update)
    assert sparse1 == ["gpu_0/emb"]
    for n in (2, 4):
        ln, fn, spread, sparse = script["run"](n, use_dpm_param_update=param_update)
        assert sparse == [f"gpu_{g}/emb" for g in range(n)]
        np.testing.assert_allclose(ln, l1, rtol=1e-5)
        assert max_diff(f1, fn) < 1e-5
        assert spread == 0.0


# ---------------------------------------------------------------------------------------------
# seq classifier, Clone / ClonePartial test nets, predictor extraction


def test_seq_model_clones_and_predictor(caffe2: None) -> None:
    script = load("seq_predictor.py")
    info = script["single_device"]()
    losses = info["losses"]
    assert losses[-1] < 0.2 * losses[0]
    assert all(b < a for a, b in zip(losses, losses[1:]))
    assert info["acc"] == 1.0
    assert info["partial_types"] == ["Reshape", "FC", "Tanh", "FC", "Softmax"]
    assert info["clone_ops"] == info["train_ops"] and info["clone_name"] == "seq_train_clone"
    assert info["pred_types"] == ["Reshape", "FC", "Tanh", "FC", "Softmax"]
    assert info["export_blobs"] == ["hidden_b", "hidden_w", "logits_b", "logits_w"]
    assert info["pred_ext_out"] == ["softmax"] and "data" in info["pred_ext_in"]
    # A batch of 4 and the full batch take different BLAS blockings: float32 rounding differs.
    np.testing.assert_allclose(info["sm_pred"], info["sm_partial"][:4], rtol=1e-5, atol=1e-7)
    assert info["eval_loss"] < losses[0]


def test_dpm_extract_predictor_net(caffe2: None) -> None:
    script = load("seq_predictor.py")
    out = script["dpm_predictor"](2)
    np.testing.assert_allclose(out["sm"], out["ref"], rtol=1e-5, atol=1e-6)
    assert out["types"] == ["Reshape", "FC", "Tanh", "FC", "Softmax"]
    assert out["ext_in"][0] == "data"
    assert out["export"] == ["cpu_0/hidden_b", "cpu_0/hidden_w", "cpu_0/logits_b",
                             "cpu_0/logits_w"]


# ---------------------------------------------------------------------------------------------
# resnet50_trainer --dtype float16: fp16 params with fp32 master copies


def test_fp16_multi_precision_training(caffe2: None) -> None:
    script = load("fp16_trainer.py")
    workspace.SetVirtualGpus(2)
    _, l1 = script["train"](1)
    model, l2 = script["train"](2)
    assert l1[-1] < l1[0] - 0.3
    np.testing.assert_allclose(l2, l1, atol=5e-4)  # fp16 gradients: close, not bitwise
    for name in ("conv1_w", "pred_b"):
        assert workspace.FetchBlob(f"gpu_1/{name}").dtype == np.float16
        assert workspace.FetchBlob(f"gpu_1/{name}_fp32").dtype == np.float32
        for suffix in ("", "_fp32", "_momentum"):
            np.testing.assert_array_equal(workspace.FetchBlob(f"gpu_0/{name}{suffix}"),
                                          workspace.FetchBlob(f"gpu_1/{name}{suffix}"))
        # the fp16 parameter is the rounded fp32 master copy
        np.testing.assert_array_equal(
            workspace.FetchBlob(f"gpu_0/{name}"),
            workspace.FetchBlob(f"gpu_0/{name}_fp32").astype(np.float16))
    types = [op.type for op in model.net.Proto().op if op.device_option.device_id == 1]
    assert types[-3:] == ["HalfToFloat", "MomentumSGDUpdate", "FloatToHalf"]
    names = {str(b) for b in script["data_parallel_model"].GetCheckpointParams(model)}
    assert {"gpu_0/conv1_w", "gpu_0/conv1_w_fp32", "gpu_0/conv1_w_momentum"} <= names


# ---------------------------------------------------------------------------------------------
# a custom layer as a Python op (net.Python with grad_f) inside Parallelize


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu"])
def test_python_op_layer_under_parallelize(caffe2: None, cpu: bool) -> None:
    script = load("python_op_dpm.py")
    workspace.SetVirtualGpus(4)
    l1, p1, _ = script["run"](1, cpu)
    l4, p4, model = script["run"](4, cpu)
    assert l1[-1] < l1[0]
    np.testing.assert_allclose(l4, l1, rtol=1e-5)
    assert max_diff(p1, p4) < 1e-6
    ops = model.net.Proto().op
    assert sum(op.type == "Python" for op in ops) == 4
    assert sum(op.type == "PythonGradient" for op in ops) == 4


# ---------------------------------------------------------------------------------------------
# the MNIST tutorial: brew LeNet, hand-written SGD, Print / Summarize to files


def test_mnist_tutorial_flow(caffe2: None, tmp_path: Path) -> None:
    script = load("mnist_tutorial.py")
    out = script["main"](str(tmp_path), iters=60)
    assert out["loss"][-1] < 0.5 * out["loss"][0]
    assert out["accuracy"][-1] > 0.4 and out["test_accuracy"] > 0.4  # chance: 0.1
    assert out["iter"] == 60
    assert out["deployed"].shape == (5, 10)
    np.testing.assert_allclose(out["deployed"].sum(axis=1), 1.0, rtol=1e-5)
    log = (tmp_path / "loss.log").read_text().splitlines()
    assert len(log) == 60 and log[0].startswith("Tensor loss of type float. Dims: (): ")
    assert float(log[-1].rsplit(" ", 1)[1]) == pytest.approx(out["loss"][-1], rel=1e-4)
    summary = (tmp_path / "conv1_w_grad.summary").read_text().splitlines()
    assert len(summary) == 60 and len(summary[0].split()) == 4


def test_time_major_sequences_split_over_devices(caffe2: None) -> None:
    script = load("seq_predictor.py")
    l1, p1 = script["time_major_dpm"](1)
    l2, p2 = script["time_major_dpm"](2)
    assert l1[-1] < 0.7 * l1[0]
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    assert max_diff(p1, p2) < 1e-6
