"""The Caffe2 import alias and dyndep."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpgraph import dyndep
from dpgraph.compat import caffe2 as alias
from dpgraph.errors import NotSupportedError, OpsLibraryError

MODULES = ["core", "workspace", "scope", "utils", "model_helper", "brew", "cnn", "optimizer",
           "data_parallel_model", "muji", "dyndep"]


@pytest.fixture
def installed():
    alias.install()
    yield
    alias.uninstall()


def test_caffe2_python_modules_are_dpgraph_modules(installed) -> None:
    for name in MODULES:
        aliased = importlib.import_module(f"caffe2.python.{name}")
        assert aliased is importlib.import_module(f"dpgraph.{name}"), name
        assert aliased.__spec__.name == f"dpgraph.{name}"
        assert not hasattr(aliased, "__path__")  # plain modules stay plain
    from caffe2.proto import caffe2_pb2
    from caffe2.python import core, data_parallel_model

    from dpgraph.proto import caffe2_pb2 as dp_pb2

    assert caffe2_pb2 is dp_pb2
    assert core.DeviceOption(caffe2_pb2.CPU, 0).device_type == 0
    assert data_parallel_model._DEFAULT_TIMEOUT_SEC == 30


def test_memonger_alias_is_lazy(installed) -> None:
    try:
        importlib.import_module("dpgraph.memonger")
    except ImportError:
        with pytest.raises(ImportError):
            importlib.import_module("caffe2.python.memonger")
    else:
        assert importlib.import_module("caffe2.python.memonger") is importlib.import_module(
            "dpgraph.memonger")


def test_unknown_modules_and_uninstall(installed) -> None:
    with pytest.raises(ImportError):
        importlib.import_module("caffe2.python.no_such_module_here")
    alias.uninstall()
    assert not alias.is_installed()
    assert "caffe2.python.core" not in sys.modules
    alias.install()
    alias.install()
    assert sys.meta_path.count(alias._FINDER) == 1


def test_target_mapping() -> None:
    assert alias.target_of("caffe2.python.core") == "dpgraph.core"
    assert alias.target_of("caffe2.proto.caffe2_pb2") == "dpgraph.proto.caffe2_pb2"
    assert alias.target_of("caffe2.python.helpers.fc") == "dpgraph.modeling.brew.fc"
    assert alias.target_of("numpy") is None


SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from caffe2.python import brew, core, data_parallel_model, dyndep, model_helper, workspace
    from caffe2.proto import caffe2_pb2

    dyndep.InitOpsLibrary("@/caffe2/caffe2/contrib/gloo:gloo_ops")

    def fwd(model, loss_scale):
        fc = brew.fc(model, "data", "fc", 3, 1)
        dist = model.net.SquaredL2Distance([fc, "label"], "dist")
        loss = model.net.AveragedLoss(dist, "loss")
        return [model.net.Scale(loss, "sloss", scale=loss_scale)]

    def update(model):
        it = brew.iter(model, "ITER")
        lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
        one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        for p in model.GetParams():
            model.net.WeightedSum([p, one, model.param_to_grad[p], lr], p)

    model = model_helper.ModelHelper(name="aliased")
    data_parallel_model.Parallelize_CPU(model, lambda m: None, fwd, update, devices=[0, 1])
    for d in (0, 1):
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, d)):
            workspace.FeedBlob("cpu_%d/data" % d, np.ones((2, 3), np.float32))
            workspace.FeedBlob("cpu_%d/label" % d, np.zeros((2, 1), np.float32))
    data_parallel_model.RunInitNet(model)
    data_parallel_model.RunNet(model, 2)
    same = np.allclose(workspace.FetchBlob("cpu_0/fc_w"), workspace.FetchBlob("cpu_1/fc_w"))
    print("RESULT", sys.argv[1:], same, type(core).__name__, core.__name__)
""")


def test_run_unmodified_script_with_module_runner(tmp_path: Path) -> None:
    script = tmp_path / "train_caffe2.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, "-m", "dpgraph.compat.caffe2", str(script), "x", "y"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "RESULT ['x', 'y'] True module dpgraph.core" in out.stdout


def test_module_runner_usage() -> None:
    assert alias.main(["--help"]) == 0
    assert alias.main([]) == 2


@pytest.mark.parametrize("name", [
    "@/caffe2/caffe2/contrib/gloo:gloo_ops", "@/caffe2/caffe2/contrib/gloo:gloo_ops_gpu",
    "@/caffe2/caffe2/contrib/nccl:nccl_ops",
    "@/caffe2/caffe2/distributed:file_store_handler_ops",
    "@/caffe2/caffe2/distributed:redis_store_handler_ops",
    "/opt/caffe2/lib/libcaffe2_gloo.so", "libcaffe2_nccl.so", "caffe2_gloo_gpu",
    "/detectron/lib/libcaffe2_detectron_ops_gpu.so",
])
def test_init_ops_library_accepts_provided_libraries(name: str) -> None:
    dyndep.InitOpsLibrary(name)
    assert name in dyndep.GetLoadedLibraries()


def test_init_ops_library_refuses_an_existing_unknown_library(tmp_path: Path) -> None:
    name = str(tmp_path / "libmy_custom_ops.so")
    Path(name).write_bytes(b"\x7fELF")
    with pytest.raises(OpsLibraryError, match="Cannot load ops library") as info:
        dyndep.InitOpsLibrary(name)
    assert isinstance(info.value, OSError) and isinstance(info.value, NotSupportedError)
    assert name not in dyndep.GetLoadedLibraries()


@pytest.mark.parametrize("name", [
    "libmy_custom_ops.so", "@/caffe2/caffe2/fb/optimizers:sgd_simd_ops",
])
def test_init_ops_library_ignores_a_missing_unknown_library(name: str, capsys) -> None:
    dyndep.InitOpsLibrary(name)  # as Caffe2: print, return; the ops fail when used
    assert capsys.readouterr().out == f"Ignoring {name} as it is not a valid file.\n"
    assert name not in dyndep.GetLoadedLibraries()


def test_module_runner_with_dash_m(tmp_path: Path) -> None:
    (tmp_path / "c2_entry.py").write_text(
        "import sys\nfrom caffe2.python import workspace\n"
        "print('MOD', sys.argv[1:], workspace.__name__)\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "dpgraph.compat.caffe2", "-m", "c2_entry", "z"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "MOD ['z'] dpgraph.workspace" in out.stdout


def test_code_runner_with_dash_c() -> None:
    code = ("import sys\nfrom caffe2.python import core\n"
            "print('CODE', sys.argv, core.workspace.__name__)\n")
    out = subprocess.run([sys.executable, "-m", "dpgraph.compat.caffe2", "-c", code, "q"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "CODE ['-c', 'q'] dpgraph.workspace" in out.stdout


def test_every_caffe2_proto_module_maps_to_dpgraph_proto() -> None:
    assert alias.target_of("caffe2.proto.metanet_pb2") == "dpgraph.proto.metanet_pb2"
    assert alias.target_of("caffe2.proto.predictor_consts_pb2") == (
        "dpgraph.proto.predictor_consts_pb2")


def test_install_gives_numpy_back_the_aliases_caffe2_code_uses() -> None:
    import numpy as np

    alias.install()
    assert np.str is str and np.float is float and np.asscalar(np.array([3])) == 3


def test_runner_installs_the_alias_in_child_python_processes(tmp_path: Path) -> None:
    """Detectron's multi-GPU testing starts one Python per GPU through the shell."""
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f"""
        import subprocess
        child = subprocess.run([{sys.executable!r}, "-c",
                                "from caffe2.python import workspace; print(workspace.__name__)"],
                               capture_output=True, text=True, check=True)
        print("CHILD", child.stdout.strip())
    """))
    out = subprocess.run([sys.executable, "-m", "dpgraph.compat.caffe2", str(parent)],
                         capture_output=True, text=True, check=True)
    assert "CHILD dpgraph.workspace" in out.stdout


def test_caffe2_tree_modules_dpgraph_lacks_load_from_the_tree(installed, tmp_path: Path,
                                                               monkeypatch) -> None:
    """Caffe2's tests run from a checkout: their helpers (caffe2.python.test.*_util) load
    from the tree; every module dpgraph provides still comes from dpgraph."""
    tree = tmp_path / "caffe2" / "python"
    (tree / "test").mkdir(parents=True)
    (tree / "test" / "__init__.py").write_text("")
    (tree / "test" / "helper_util.py").write_text(
        "from caffe2.python import core\nVALUE = core.ScopedName('x')\n")
    (tree / "core.py").write_text("raise AssertionError('the tree must not shadow dpgraph')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    helper = importlib.import_module("caffe2.python.test.helper_util")
    assert helper.VALUE == "x" and helper.__file__ == str(tree / "test" / "helper_util.py")
    assert importlib.import_module("caffe2.python.core") is importlib.import_module(
        "dpgraph.core")
    with pytest.raises(ImportError):
        importlib.import_module("caffe2.python.test.no_such_helper")


def test_c_extension_module_names_are_workspace_c(installed) -> None:
    from dpgraph import workspace

    for name in ("_import_c_extension", "caffe2_pybind11_state"):
        assert importlib.import_module(f"caffe2.python.{name}") is workspace.C


def test_numpy_2_removed_dtype_aliases_are_back() -> None:
    import numpy as np

    alias.install()
    assert np.unicode_ is np.str_ and np.float_ is np.float64 and np.NaN != np.NaN
    assert np.product([2, 3]) == 6
