"""The ``dpgraph inspect | draw | export-onnx | verify`` subcommands, through dpgraph.cli.main
and through ``python -m dpgraph`` in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _export_helpers import make_net, op
from _export_models import MODELS

from dpgraph import cli
from dpgraph.export import save_predictor
from dpgraph.export.commands import EXPORT_COMMANDS, add_inspect_command, parse_input_spec
from dpgraph.ir.proto_io import write_proto
from dpgraph.ir.text import format_net

#: Whether the lead has appended EXPORT_COMMANDS to dpgraph.cli.COMMANDS (checked before the
#: autouse fixture below patches it in for the in-process tests).
WIRED = add_inspect_command in cli.COMMANDS


@pytest.fixture(autouse=True)
def _wired(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sure the export commands are registered (the lead wires them into COMMANDS)."""
    if add_inspect_command not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, *EXPORT_COMMANDS])


@pytest.fixture(scope="module")
def predictor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("predictor")
    predict_net, params, _, _ = MODELS["cnn"]()
    save_predictor(folder, predict_net, params)
    (folder / "predict_net.txt").write_text(format_net(predict_net.Proto()))
    return folder


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_line_error(err: str, command: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"dpgraph {command}: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


# --- inspect --------------------------------------------------------------------------
def test_inspect_predict_net_with_init(predictor_dir: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _main(capsys, "inspect", str(predictor_dir / "predict_net.pb"),
                           "--init", str(predictor_dir / "init_net.pb"))
    assert code == 0 and err == ""
    assert "9 ops" in out
    assert re.search(r"^  Conv +2$", out, re.M) and re.search(r"^  cpu_0 +9$", out, re.M)
    assert "ops by device:" in out and "cpu_0" in out
    assert "external outputs (1): softmax" in out
    assert "parameters (10," in out and "conv1_w  float32  8x3x3x3  216" in out
    assert out.rstrip().endswith("verify: ok")


def test_inspect_init_net_and_text_format(predictor_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "inspect", str(predictor_dir / "init_net.pb"))
    assert code == 0 and re.search(r"GivenTensorFill +10", out) and "parameters (10," in out
    code, out, _ = _main(capsys, "inspect", str(predictor_dir / "predict_net.txt"))
    assert code == 0 and "SpatialBN" in out
    # without the init net, the verifier only sees declared external inputs: still ok
    assert "verify: ok" in out


# --- verify ---------------------------------------------------------------------------
def test_verify_ok_and_failures(predictor_dir: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _main(capsys, "verify", str(predictor_dir / "predict_net.pb"))
    assert code == 0 and "ok (9 ops)" in out and err == ""
    bad = make_net([op("Relu", ["x"], ["y"]), op("Relu", ["ghost"], ["z"]),
                    op("NoSuchOp", ["y"], ["w"])], ["x"], ["y", "never"])
    path = tmp_path / "bad.pb"
    write_proto(bad, path)
    code, out, err = _main(capsys, "verify", str(path))
    assert code == 1
    assert "ghost" in out and "NoSuchOp" in out and "never" in out
    _assert_one_line_error(err, "verify", "failed verification")
    code, out, _ = _main(capsys, "verify", str(path), "--known", "ghost")
    assert code == 1 and "ghost" not in out


@pytest.mark.parametrize("command", ["inspect", "verify", "draw"])
def test_bad_paths_and_corrupt_files(command: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["-o", str(tmp_path / "out.dot")] if command == "draw" else []
    code, _, err = _main(capsys, command, str(tmp_path / "missing.pb"), *extra)
    assert code == 2
    _assert_one_line_error(err, command, "missing.pb", "No such file")
    corrupt = tmp_path / "corrupt.pb"
    corrupt.write_bytes(b"\xff\xff\xff\xff\x0f garbage")
    code, _, err = _main(capsys, command, str(corrupt), *extra)
    assert code == 2
    _assert_one_line_error(err, command, "not a valid serialized NetDef")
    text = tmp_path / "broken.txt"
    text.write_text("net x\nbogus line\n")
    code, _, err = _main(capsys, command, str(text), *extra)
    assert code == 2
    _assert_one_line_error(err, command, "broken.txt", "unknown keyword")


# --- draw -----------------------------------------------------------------------------
def test_draw_dot_and_bad_extension(predictor_dir: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "net.dot"
    code, out, _ = _main(capsys, "draw", str(predictor_dir / "predict_net.pb"), "-o",
                         str(out_file), "--rankdir", "LR")
    assert code == 0 and "wrote" in out
    text = out_file.read_text()
    assert text.startswith("digraph") and "rankdir=LR" in text and "SpatialBN" in text
    code, _, err = _main(capsys, "draw", str(predictor_dir / "predict_net.pb"), "-o",
                         str(tmp_path / "net.jpg"))
    assert code == 2
    _assert_one_line_error(err, "draw", ".dot, .svg")


def test_draw_svg_needs_graphviz(predictor_dir: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no 'dot' here
    code, _, err = _main(capsys, "draw", str(predictor_dir / "predict_net.pb"), "-o",
                         str(tmp_path / "net.svg"))
    assert code == 1
    _assert_one_line_error(err, "draw", "Graphviz")


# --- export-onnx ----------------------------------------------------------------------
def test_export_onnx_end_to_end(predictor_dir: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    ort = pytest.importorskip("onnxruntime")
    target = tmp_path / "model.onnx"
    code, out, err = _main(capsys, "export-onnx", str(predictor_dir / "predict_net.txt"),
                           str(predictor_dir / "init_net.pb"), "-o", str(target),
                           "--input", "data:Nx3x8x8")
    assert code == 0 and err == "" and "wrote" in out
    from dpgraph.export import load_predictor

    predictor = load_predictor(predictor_dir)
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((7, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"data": x})[0],
                               predictor.run({"data": x})[0], rtol=1e-5, atol=1e-6)


def test_export_onnx_errors(predictor_dir: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    predict, init = str(predictor_dir / "predict_net.pb"), str(predictor_dir / "init_net.pb")
    target = str(tmp_path / "m.onnx")
    code, _, err = _main(capsys, "export-onnx", predict, init, "-o", target)
    assert code == 2
    _assert_one_line_error(err, "export-onnx", "--input", "data")
    code, _, err = _main(capsys, "export-onnx", predict, init, "-o", target,
                         "--input", "data:1x3x?x8")
    assert code == 2
    _assert_one_line_error(err, "export-onnx", "bad shape")
    bad = make_net([op("Relu", ["x"], ["a"]), op("LRN", ["a"], ["b"], size=3),
                    op("Dropout", ["b"], ["c"], ratio=0.5)], ["x"], ["c"])
    write_proto(bad, tmp_path / "bad.pb")
    code, _, err = _main(capsys, "export-onnx", str(tmp_path / "bad.pb"), init, "-o", target,
                         "--input", "x:1,4")
    assert code == 1
    _assert_one_line_error(err, "export-onnx", "op 1 (LRN)", "op 2 (Dropout)")
    assert not Path(target).exists()


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["export-onnx", "only_one.pb"])
    assert caught.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["inspect", "draw", "export-onnx", "verify"])
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main([command, "--help"])
    assert caught.value.code == 0
    assert f"usage: dpgraph {command}" in capsys.readouterr().out


def test_parse_input_spec() -> None:
    assert parse_input_spec("data:1x3x8x8") == ("data", ([1, 3, 8, 8], "float32"))
    assert parse_input_spec("gpu_0/ids:N,5:int64") == ("gpu_0/ids", (["N", 5], "int64"))


# --- through a real process -----------------------------------------------------------
def _run_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_python_dash_m_dpgraph(predictor_dir: Path, tmp_path: Path) -> None:
    if not WIRED:
        pytest.skip("EXPORT_COMMANDS is not wired into dpgraph.cli.COMMANDS yet")
    result = _run_process(["-m", "dpgraph", "verify", str(predictor_dir / "predict_net.pb")])
    assert result.returncode == 0 and "ok (9 ops)" in result.stdout
    result = _run_process(["-m", "dpgraph", "inspect", str(tmp_path / "nope.pb")])
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("dpgraph inspect: error: cannot read")


def test_subprocess_with_explicit_wiring(predictor_dir: Path, tmp_path: Path) -> None:
    script = ("import sys; from dpgraph import cli; "
              "from dpgraph.export.commands import EXPORT_COMMANDS; "
              "cli.COMMANDS[:] = [c for c in cli.COMMANDS if c not in EXPORT_COMMANDS]"
              " + EXPORT_COMMANDS; sys.exit(cli.main())")
    corrupt = tmp_path / "c.pb"
    corrupt.write_bytes(b"\x0a\xff\xff")
    result = _run_process(["-c", script, "verify", str(corrupt)])
    assert result.returncode == 2
    assert result.stderr.startswith("dpgraph verify: error: ")
    assert result.stderr.strip().count("\n") == 0
    result = _run_process(["-c", script, "inspect", str(predictor_dir / "init_net.pb")])
    assert result.returncode == 0 and "parameters (10," in result.stdout
