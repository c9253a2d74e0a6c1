"""Every code block in docs/*.md runs as written (with the variables the text assumes
defined first) and prints or does what the text says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph import brew, core, data_parallel_model, optimizer, workspace
from dpgraph.ir import format_net, parse_net, verify_problems
from dpgraph.model_helper import ModelHelper

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent


def blocks(doc: str, lang: str = "python") -> list[str]:
    """The ```lang blocks of ``docs/<doc>`` (``lang=""``: unlabelled blocks)."""
    return re.findall(rf"```{lang}\n(.*?)\n```", (DOCS / doc).read_text(), re.S)


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a documented command line with this venv's ``python`` and ``dpgraph`` first on
    PATH; stderr is merged into stdout in the order they were written."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
               PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


@pytest.fixture(autouse=True)
def fresh_workspace() -> Any:
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def run_block(code: str, **names: Any) -> dict[str, Any]:
    namespace = dict(names)
    exec(compile(code, "<doc>", "exec"), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_python_block_compiles(doc: str) -> None:
    for code in blocks(doc):
        compile(code, doc, "exec")


# --- architecture.md -----------------------------------------------------------------------
def test_architecture_text_format_example_is_exact() -> None:
    text = blocks("architecture.md", "")[1] + "\n"
    assert format_net(parse_net(text)) == text
    assert not verify_problems(parse_net(text), ["gpu_0/fc_w_grad", "gpu_1/fc_w_grad"])


def test_architecture_custom_op_example_registers_and_differentiates() -> None:
    # In a subprocess: registering op types is global and permanent.
    code = blocks("architecture.md")[0] + textwrap.dedent("""
        import numpy as np
        from dpgraph import core, workspace
        net = core.Net("n")
        net.MyRelu("x", "y")
        net.AddGradientOperators(["y"])
        types = [op.type for op in net.Proto().op]
        assert types == ["MyRelu", "ConstantFill", "MyReluGradient"], types
        workspace.FeedBlob("x", np.array([-1.0, 2.0], np.float32))
        workspace.RunNetOnce(net)
        print(workspace.FetchBlob("y"), workspace.FetchBlob("x_grad"))
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[0.", "2.]", "[0.", "1.]"]


# --- runtime.md ----------------------------------------------------------------------------
def test_runtime_workspace_example(capsys: pytest.CaptureFixture[str]) -> None:
    before = workspace.CurrentWorkspace()
    try:
        run_block(blocks("runtime.md")[0])
        assert workspace.CurrentWorkspace() == "other"
        assert not workspace.HasBlob("y")             # an independent namespace
    finally:
        workspace.SwitchWorkspace(before)
    assert capsys.readouterr().out == "[[1. 1. 1.]\n [1. 1. 1.]]\n"


def test_runtime_virtual_gpu_example() -> None:
    code = blocks("runtime.md")[1]
    last = code.splitlines()[-1]
    namespace = run_block(code + f"\nresult = ({last})", workspace=workspace)
    count, pattern = namespace["result"]
    assert count == 4
    assert np.array_equal(pattern, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]])
    workspace.SetVirtualGpus(0)


# --- export.md -----------------------------------------------------------------------------
def _parallel_classifier(image: bool) -> Any:
    """A model trained with Parallelize on 2 CPU devices: input "data", output "softmax"."""
    optimizer.reset_optimizer_instance_count()
    model = ModelHelper(name="doc_model")

    def forward(m: Any, loss_scale: float) -> list[Any]:
        if image:
            conv = brew.conv(m, "data", "conv", dim_in=3, dim_out=4, kernel=3, pad=1)
            pool = brew.max_pool(m, brew.relu(m, conv, "relu"), "pool", kernel=2, stride=2)
            logits = brew.fc(m, pool, "fc", dim_in=4 * 4 * 4, dim_out=3)
        else:
            logits = brew.fc(m, "data", "fc", dim_in=5, dim_out=3)
        softmax = brew.softmax(m, logits, "softmax")
        loss = m.net.AveragedLoss(m.net.LabelCrossEntropy([softmax, "label"], "xent"), "loss")
        return [m.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    data_parallel_model.Parallelize(
        model, lambda m: None, forward, devices=[0, 1], cpu_device=True,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1))
    data_parallel_model.RunInitNet(model)
    rng = np.random.default_rng(0)
    for device in (0, 1):
        shape = (2, 3, 8, 8) if image else (2, 5)
        workspace.FeedBlob(f"cpu_{device}/data", rng.normal(size=shape).astype(np.float32))
        workspace.FeedBlob(f"cpu_{device}/label", np.array([0, 2], np.int32))
    data_parallel_model.RunNet(model, 1)
    return model


def test_export_predictor_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = _parallel_classifier(image=False)
    batch = np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32)
    namespace = run_block(blocks("export.md")[0], model=model, batch=batch)
    assert sorted(os.listdir("out")) == ["init_net.pb", "predict_net.pb"]
    probabilities = namespace["probabilities"]
    assert probabilities.shape == (4, 3)
    fc_w, fc_b = (workspace.FetchBlob(f"cpu_0/fc_{p}") for p in "wb")
    logits = batch @ fc_w.T + fc_b
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, rtol=1e-5)
    assert namespace["workspace"] is namespace["predictor"].workspace
    assert namespace["net"].name == namespace["predict_net"].Proto().name


def test_export_onnx_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    monkeypatch.chdir(tmp_path)
    net = core.Net("conv32")
    net.Conv(["data", "w", "b"], "conv", kernel=3, pad=1)
    net.AddExternalOutput(net.Relu("conv", "relu"))
    rng = np.random.default_rng(2)
    params = {"w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
              "b": rng.normal(size=4).astype(np.float32)}
    from dpgraph.export import make_init_net

    run_block(blocks("export.md")[1], predict_net=net, init_net=make_init_net(params))
    session = ort.InferenceSession("model.onnx")
    for n in (1, 3):
        x = rng.normal(size=(n, 3, 32, 32)).astype(np.float32)
        for name, value in params.items():
            workspace.FeedBlob(name, value)
        workspace.FeedBlob("data", x)
        workspace.RunNetOnce(net)
        np.testing.assert_allclose(session.run(None, {"data": x})[0],
                                   workspace.FetchBlob("relu"), rtol=1e-4, atol=1e-5)


def test_export_console_session(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    from dpgraph.export import save_predictor
    from dpgraph.proto import caffe2_pb2

    # The predictor the text talks about: a 3x8x8 CNN with SpatialBN (10 ONNX nodes and
    # 10 initializers), and a net whose second op reads an undefined blob.
    model = ModelHelper(name="cnn", arg_scope={"order": "NCHW"})
    conv = brew.conv(model, "data", "conv1", dim_in=3, dim_out=8, kernel=3, pad=1)
    bn = brew.spatial_bn(model, conv, "bn1", 8, epsilon=1e-4, is_test=True)
    pool = brew.max_pool(model, brew.relu(model, bn, "relu1"), "pool1", kernel=2, stride=2)
    conv2 = brew.conv(model, pool, "conv2", dim_in=8, dim_out=6, kernel=3, pad=1)
    avg = brew.average_pool(model, brew.relu(model, conv2, conv2), "pool2", kernel=2,
                            stride=1, pad=1)
    brew.softmax(model, brew.fc(model, avg, "fc", dim_in=6 * 5 * 5, dim_out=4), "softmax")
    workspace.RunNetOnce(model.param_init_net)
    from dpgraph.model_helper import ExtractPredictorNet

    predict_net, params = ExtractPredictorNet(model.net.Proto(), ["data"], ["softmax"])
    save_predictor(tmp_path / "out", predict_net, params)
    broken = caffe2_pb2.NetDef(name="broken", external_input=["x"])
    broken.op.add(type="Relu", input=["x"], output=["y"])
    broken.op.add(type="Relu", input=["ghost"], output=["z"])
    (tmp_path / "broken.pb").write_bytes(broken.SerializeToString())

    (session,) = blocks("export.md", "console")
    commands = re.split(r"^\$ ", session, flags=re.M)[1:]
    assert len(commands) == 3
    for item in commands:
        command, _, expected = item.partition("\n")
        result = shell(command, tmp_path)
        assert result.stdout == expected.rstrip("\n") + "\n", command


# --- migrating-from-caffe2.md ----------------------------------------------------------------
def test_migrating_alias_commands(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys
        from caffe2.python import core, workspace, data_parallel_model
        from caffe2.proto import caffe2_pb2
        import dpgraph.core
        assert core is dpgraph.core and caffe2_pb2.NetDef is dpgraph.proto.caffe2_pb2.NetDef
        print("ran", __name__, sys.argv[1:])
        """)
    (tmp_path / "train_net.py").write_text(script)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "train_net.py").write_text(script)
    lines = [line.split("#")[0].strip() for line in blocks("migrating-from-caffe2.md", "sh")[0]
             .splitlines()]
    outputs = [shell(line, tmp_path) for line in lines]
    assert [r.returncode for r in outputs] == [0, 0], [r.stdout for r in outputs]
    assert outputs[0].stdout == "ran __main__ ['--cfg', 'my.yaml']\n"
    assert outputs[1].stdout == "ran __main__ ['--cfg', 'my.yaml']\n"


def test_migrating_install_example() -> None:
    code = blocks("migrating-from-caffe2.md")[0] + textwrap.dedent("""
        import dpgraph.core, dpgraph.workspace, dpgraph.data_parallel_model
        assert core is dpgraph.core and workspace is dpgraph.workspace
        assert data_parallel_model is dpgraph.data_parallel_model
        assert caffe2_pb2.NetDef().DESCRIPTOR.full_name == "caffe2.NetDef"
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_migrating_try_it_commands_exist() -> None:
    lines = blocks("migrating-from-caffe2.md", "sh")[1].splitlines()
    assert lines[0].startswith("dpgraph demo ") and "python -m dpgraph demo" in lines[0]
    for line in lines[1:]:
        path = ROOT / line.split()[1]
        assert path.is_file(), line
    assert "--gpus" in (ROOT / "examples" / "detectron_style.py").read_text()


# --- memory.md -----------------------------------------------------------------------------
def test_memory_checkpoint_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = _parallel_classifier(image=True)
    saved = {name: workspace.FetchBlob(name) for name in ("cpu_0/fc_w", "cpu_1/conv_w")}
    code = blocks("memory.md")[0]
    save, load = code.split("# ... later")
    run_block(save, model=model)
    for name in saved:
        workspace.FeedBlob(name, np.zeros_like(saved[name]))
    run_block(code.splitlines()[0] + "\n" + load.split("\n", 1)[1], model=model)
    for name, value in saved.items():
        np.testing.assert_array_equal(workspace.FetchBlob(name), value)


# --- distributed.md ------------------------------------------------------------------------
def test_distributed_typed_rendezvous_matches_the_dict_form() -> None:
    from dpgraph.collectives import Rendezvous

    code = blocks("distributed.md")[0]
    dict_form = code.split("# 2.")[0].split("\n", 1)[1]
    typed = code.split("# 2.")[1].split("# 3.")[0].split("\n", 1)[1]
    legacy = run_block(dict_form.split("rendezvous = ", 1)[0].replace(
        "workspace.RunOperatorOnce", "(lambda op: op)") + "rendezvous = "
        + dict_form.split("rendezvous = ", 1)[1], core=core, rank=1, hosts=2)["rendezvous"]
    typed_value = run_block(typed, rank=1, hosts=2)["rendezvous"]
    assert isinstance(typed_value, Rendezvous)
    converted = Rendezvous.from_legacy(legacy)
    assert (converted.kv_handler, converted.shard_id, converted.num_shards) == (
        typed_value.kv_handler, typed_value.shard_id, typed_value.num_shards)
    assert Rendezvous.from_legacy(converted.to_legacy()) == converted


def test_distributed_launch_commands_exist() -> None:
    for line in blocks("distributed.md", "bash")[0].splitlines():
        if "examples/" in line:
            script = re.search(r"(examples/\S+\.py)", line)
            assert script and (ROOT / script.group(1)).is_file(), line
    assert "--spawn" in (ROOT / "examples" / "train_distributed.py").read_text()


def test_distributed_common_world_example_runs_on_one_host(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = textwrap.dedent(f"""
        import numpy as np
        from dpgraph import core, workspace
        workspace.SetVirtualGpus(2)
        workspace.RunOperatorOnce(core.CreateOperator(
            "FileStoreHandlerCreate", [], ["store_handler"], path={str(tmp_path)!r},
            prefix="job"))
        init, net, hosts, rank = core.Net("init"), core.Net("net"), 1, 0
        """) + blocks("distributed.md")[1] + textwrap.dedent("""
        workspace.RunNetOnce(init)
        for device, value in ((0, 1.0), (1, 2.0)):
            with core.DeviceScope(core.DeviceOption(1, device)):
                workspace.FeedBlob(f"gpu_{device}/w_grad", np.full(3, value, np.float32))
        workspace.RunNetOnce(net)
        print(workspace.FetchBlob("gpu_0/w_grad"), workspace.FetchBlob("gpu_1/w_grad"))
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[3. 3. 3.] [3. 3. 3.]\n"


# --- names the docs promise ----------------------------------------------------------------
def test_documented_modules_and_names_exist() -> None:
    import importlib

    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout")[1].split("Caffe2-named facades")[0]
    packages = re.findall(r"`(dpgraph\.[a-z_]+)`", layout)
    facades = re.findall(r"`([a-z_]+)`", readme.split("Caffe2-named facades (")[1]
                         .split("\n\n")[0])
    assert len(packages) == 14 and len(facades) >= 8
    for module in [*packages, *(f"dpgraph.{name}" for name in ["core", *facades]),
                   "dpgraph.proto.regenerate"]:
        importlib.import_module(module)

    migrating = (DOCS / "migrating-from-caffe2.md").read_text()
    available = re.findall(r"`([A-Za-z_]+)[`(]",
                           migrating.split("Also available:")[1].split("\n\n")[0])
    assert len(available) >= 19
    assert [n for n in available if not hasattr(data_parallel_model, n)] == []

    memory = (DOCS / "memory.md").read_text()
    functions = re.findall(r"^\| `([a-z_]+)\(", memory, re.M) + [
        "compute_statistics", "collect_blob_sizes", "verify_graph_equality",
        "compute_interference_graph", "topological_sort_traversal",
        "topological_sort_traversal_longest_path", "compute_assignments_greedy",
        "compute_assignments_dp"]
    from dpgraph import export, memonger

    assert [n for n in functions if not hasattr(memonger, n)] == []
    exported = re.findall(r"^\| `([a-z_]+)\(", (DOCS / "export.md").read_text(), re.M)
    assert exported and [n for n in exported if not hasattr(export, n)] == []


def test_documented_parallelize_model_attributes() -> None:
    migrating = (DOCS / "migrating-from-caffe2.md").read_text()
    attributes = re.findall(r"`(_[a-z_]+)`", migrating.split(
        "the model attributes Caffe2 sets:")[1].split("\n\n")[0])
    assert len(attributes) == 14
    model = _parallel_classifier(image=False)
    assert [a for a in attributes if not hasattr(model, a)] == []
    assert model.net.Proto().num_workers == 2 * 4
    assert model._devices == [0, 1] and model._device_prefix == "cpu"


def test_committed_drawing_is_current_and_matches_its_description(tmp_path: Path) -> None:
    (tmp_path / "docs" / "images").mkdir(parents=True)
    result = shell(f"python {ROOT / 'docs/images/parallel_mlp_4devices.py'}", tmp_path)
    assert result.returncode == 0, result.stdout
    dot = (tmp_path / "docs/images/parallel_mlp_4devices.dot").read_text()
    assert dot == (DOCS / "images" / "parallel_mlp_4devices.dot").read_text()
    text = (DOCS / "export.md").read_text()
    assert "`cpu_0` has 35 ops and the other devices 19 each" in " ".join(text.split())
    for device in range(4):
        assert f'label="cpu_{device}"' in dot
    ops = re.findall(r'label="([A-Za-z]+)"', dot)
    assert ops.count("Sum") == 4 and ops.count("Copy") == 12 and ops.count("FC") == 8
    import runpy

    from dpgraph.testing import ops_by_device

    script = runpy.run_path(str(DOCS / "images" / "parallel_mlp_4devices.py"))
    model = ModelHelper(name="mlp_4cpu")
    data_parallel_model.Parallelize(model, lambda m: None, script["forward"],
                                    param_update_builder_fun=script["update"],
                                    devices=[0, 1, 2, 3], cpu_device=True)
    sizes = {device: len(ops) for device, ops in ops_by_device(model.net).items()}
    assert sizes == {"cpu_0": 35, "cpu_1": 19, "cpu_2": 19, "cpu_3": 19}
