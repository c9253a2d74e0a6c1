"""``dpgraph inspect | draw | export-onnx | verify``: the export tools on the command line.

Each ``add_*_command(subparsers)`` registers one subcommand; :data:`EXPORT_COMMANDS` lists
them for :data:`dpgraph.cli.COMMANDS`.  Net files may be binary NetDefs (any extension),
dpgraph's text format (``.txt``) or protobuf text format (``.pbtxt``).

Exit codes: 0 success; 1 the net fails verification, has ops ONNX cannot express, or a
needed tool (Graphviz) is missing; 2 usage errors and unreadable, missing or corrupt files.
Errors are one line on stderr: ``dpgraph <command>: error: <message>``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dpgraph.errors import (
    CommandError,
    DpgraphError,
    ExportError,
    MissingDependencyError,
    ProtoError,
    TextFormatError,
)
from dpgraph.proto import caffe2_pb2

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _one_line(message: str) -> str:
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())


def _guarded(name: str, body: Callable[[argparse.Namespace], int]
             ) -> Callable[[argparse.Namespace], int]:
    """Run ``body``; turn expected failures into ``dpgraph <name>: error: ...`` + exit code
    (2 for the user's input: CommandError, unreadable nets; 1 for everything else)."""
    def run(args: argparse.Namespace) -> int:
        try:
            return body(args)
        except (CommandError, ProtoError, TextFormatError) as error:
            code, message = EXIT_USAGE, str(error)
        except (MissingDependencyError, ExportError) as error:
            code, message = EXIT_FAILED, str(error)
        except DpgraphError as error:
            code, message = EXIT_FAILED, f"{type(error).__name__}: {error}"
        print(f"dpgraph {name}: error: {_one_line(message)}", file=sys.stderr)
        return code
    return run


# --- reading nets -----------------------------------------------------------------------
def read_net(path: str | os.PathLike[str]) -> caffe2_pb2.NetDef:
    """A NetDef from a binary ``.pb`` (any extension), dpgraph text ``.txt`` or ``.pbtxt``."""
    from dpgraph.ir.proto_io import parse_proto
    from dpgraph.ir.text import parse_net

    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {os.fspath(path)!r}: {error.strerror}; check the path "
                           "and that the file is readable.") from error
    suffix = file.suffix.lower()
    if suffix in (".txt", ".pbtxt", ".prototxt"):
        text = _decode(data, path)
        if suffix == ".txt":
            try:
                return parse_net(text)
            except TextFormatError as error:
                raise CommandError(f"{os.fspath(path)}: not a dpgraph text-format net "
                                   f"({error})") from error
        return _parse_pbtxt(text, path)
    if not data:
        raise CommandError(f"{os.fspath(path)}: the file is empty, not a NetDef")
    proto = parse_proto(caffe2_pb2.NetDef, data, os.fspath(path))
    if not (proto.op or proto.name or proto.external_input or proto.external_output):
        raise CommandError(f"{os.fspath(path)}: does not look like a binary NetDef (no ops, "
                           "name or external blobs); text nets need a .txt or .pbtxt name")
    return proto


def _decode(data: bytes, path: Any) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CommandError(f"{os.fspath(path)}: not a text file ({error.reason}); binary "
                           "NetDefs should not end in .txt/.pbtxt") from error


def _parse_pbtxt(text: str, path: Any) -> caffe2_pb2.NetDef:
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, caffe2_pb2.NetDef())
    except text_format.ParseError as error:
        raise CommandError(f"{os.fspath(path)}: not a protobuf text-format NetDef "
                           f"({error})") from error


# --- inspect ------------------------------------------------------------------------------
_FILL_DTYPES = {"GivenTensorFill": "float32", "GivenTensorDoubleFill": "float64",
                "GivenTensorIntFill": "int32", "GivenTensorInt64Fill": "int64",
                "GivenTensorBoolFill": "bool", "GivenTensorStringFill": "string",
                "GivenTensorByteStringToUInt8Fill": "uint8"}
_ITEM_BYTES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1, "uint8": 1,
               "float16": 2}


def _fill_params(proto: caffe2_pb2.NetDef) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of every blob a fill op with a ``shape`` argument writes, once
    each (in first-fill order, with the last fill's dtype and shape: Caffe2's optimizers
    fill their shared ``ONE_<type>_<id>`` blob once per parameter)."""
    from dpgraph.ir.arguments import arguments_dict
    from dpgraph.ops.fill import numpy_dtype, parse_dtype

    found: dict[str, tuple[str, list[int]]] = {}
    for op in proto.op:
        if not op.type.endswith("Fill") or len(op.output) != 1:
            continue
        args = arguments_dict(op.arg)
        shape = args.get("shape")
        if shape is None:
            continue
        shape = [int(d) for d in (shape if isinstance(shape, list) else [shape])]
        dtype = _FILL_DTYPES.get(op.type)
        if dtype is None:
            try:
                dtype = str(numpy_dtype(parse_dtype(args.get("dtype", 1))).__name__)
            except DpgraphError:
                dtype = "?"
        found[op.output[0]] = (dtype, shape)
    return [(name, dtype, shape) for name, (dtype, shape) in found.items()]


def _table(rows: Iterable[tuple[Any, ...]], indent: str = "  ") -> list[str]:
    rows = [tuple(str(c) for c in row) for row in rows]
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
            for row in rows]


def _human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"  # pragma: no cover


def _blob_list(title: str, names: Iterable[str]) -> str:
    names = list(names)
    return f"{title} ({len(names)}): {', '.join(names) if names else '-'}"


def inspect_lines(proto: caffe2_pb2.NetDef, init: caffe2_pb2.NetDef | None = None) -> list[str]:
    """The report of ``dpgraph inspect`` as lines."""
    from dpgraph.ir.analysis import op_types, ops_by_device
    from dpgraph.ir.verify import verify_problems

    kind = proto.type or "simple"
    lines = [f"net {proto.name or '<unnamed>'!r}: {len(proto.op)} ops, type {kind}"
             + (f", {proto.num_workers} workers" if proto.HasField("num_workers") else "")]
    lines.append("ops by type:")
    lines += _table(sorted(op_types(proto).items(), key=lambda kv: (-kv[1], kv[0])))
    lines.append("ops by device:")
    lines += _table(sorted((d, len(ops)) for d, ops in ops_by_device(proto).items()))
    lines.append(_blob_list("external inputs", proto.external_input))
    lines.append(_blob_list("external outputs", proto.external_output))
    params = _fill_params(init) if init is not None else _fill_params(proto)
    if params:
        total = sum(math.prod(shape) for _, _, shape in params)
        nbytes = sum(math.prod(s) * _ITEM_BYTES.get(t, 0) for _, t, s in params)
        lines.append(f"parameters ({len(params)}, {total:,} values, {_human_bytes(nbytes)}):")
        lines += _table((name, dtype, "x".join(map(str, shape)) or "scalar",
                         f"{math.prod(shape):,}") for name, dtype, shape in params)
    known = [name for name, _, _ in params] if init is not None else []
    problems = verify_problems(proto, known)
    lines.append("verify: ok" if not problems else f"verify: {len(problems)} problem(s)")
    lines += [f"  {p}" for p in problems]
    return lines


def run_inspect(args: argparse.Namespace) -> int:
    proto = read_net(args.file)
    init = read_net(args.init) if args.init else None
    print("\n".join(inspect_lines(proto, init)))
    return EXIT_OK


def add_inspect_command(subparsers: argparse._SubParsersAction) -> None:
    """``dpgraph inspect FILE.pb [--init INIT.pb]``."""
    parser = subparsers.add_parser(
        "inspect", help="summarise a net file: ops, devices, blobs, parameters",
        description="Print a net's op counts by type and by device, its external inputs and "
                    "outputs, its parameters with shapes and sizes (from --init, or from the "
                    "file itself when it is an init net of GivenTensor*Fill ops) and the "
                    "verifier's result. FILE is a binary NetDef, a dpgraph text net (.txt) "
                    "or a protobuf text net (.pbtxt).")
    parser.add_argument("file", metavar="FILE", help="net file (.pb, .txt or .pbtxt)")
    parser.add_argument("--init", metavar="INIT", help="init net whose fills are the "
                        "parameters (e.g. init_net.pb of a saved predictor)")
    parser.set_defaults(command=_guarded("inspect", run_inspect))


# --- draw ---------------------------------------------------------------------------------
def run_draw(args: argparse.Namespace) -> int:
    from dpgraph.export.dot import render

    proto = read_net(args.file)
    suffix = Path(args.output).suffix.lower()
    if suffix not in (".dot", ".gv", ".svg", ".png", ".pdf"):
        raise CommandError(f"cannot draw to {args.output!r}: use a .dot, .svg, .png or .pdf "
                           "output")
    try:
        render(proto, args.output, cluster_by_device=not args.no_clusters,
               show_blobs=not args.no_blobs, rankdir=args.rankdir)
    except OSError as error:
        raise CommandError(f"cannot write {args.output!r}: {error.strerror or error}"
                           ) from error
    print(f"wrote {args.output}")
    return EXIT_OK


def add_draw_command(subparsers: argparse._SubParsersAction) -> None:
    """``dpgraph draw FILE.pb -o OUT.{dot,svg,png}``."""
    parser = subparsers.add_parser(
        "draw", help="draw a net with Graphviz (.dot, .svg, .png, .pdf)",
        description="Draw a net: ops as boxes, blobs as ellipses, one dashed cluster per "
                    "device, collectives highlighted. .dot output needs nothing else; "
                    ".svg/.png/.pdf need Graphviz's 'dot' program on PATH.")
    parser.add_argument("file", metavar="FILE", help="net file (.pb, .txt or .pbtxt)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT",
                        help="output file: .dot, .svg, .png or .pdf")
    parser.add_argument("--rankdir", choices=("TB", "LR"), default="TB",
                        help="layout direction (default %(default)s)")
    parser.add_argument("--no-blobs", action="store_true",
                        help="connect ops directly instead of drawing blob nodes")
    parser.add_argument("--no-clusters", action="store_true",
                        help="do not group ops by device")
    parser.set_defaults(command=_guarded("draw", run_draw))


# --- export-onnx --------------------------------------------------------------------------
_INPUT_SPEC = re.compile(r"^(?P<name>.+?):(?P<shape>[^:]+)(?::(?P<dtype>[A-Za-z0-9_]+))?$")


def parse_input_spec(text: str) -> tuple[str, tuple[list[int | str], str]]:
    """``NAME:SHAPE[:DTYPE]`` with SHAPE like ``1x3x8x8``, ``1,3,8,8`` or ``Nx3x8x8``."""
    import numpy as np

    match = _INPUT_SPEC.match(text)
    if match is None:
        raise CommandError(f"bad --input {text!r}: use NAME:SHAPE[:DTYPE], e.g. "
                           "data:1x3x8x8 or data:N,3,8,8:float32")
    dims: list[int | str] = []
    for part in re.split(r"[x,]", match["shape"]):
        part = part.strip()
        if part.isdigit():
            dims.append(int(part))
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            dims.append(part)
        else:
            raise CommandError(f"bad shape {match['shape']!r} in --input {text!r}: dims are "
                               "integers or names for symbolic dims, separated by x or ,")
    dtype = match["dtype"] or "float32"
    try:
        np.dtype(dtype)
    except TypeError:
        raise CommandError(f"bad dtype {dtype!r} in --input {text!r}: use a numpy dtype "
                           "name such as float32 or int64") from None
    return match["name"], (dims, dtype)


def _write_atomic(data: bytes, path: str) -> None:
    import tempfile

    target = Path(path)
    if target.is_dir():
        raise CommandError(f"cannot write {path!r}: it is a directory")
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.")
    except OSError as error:
        raise CommandError(f"cannot write {path!r}: {error.strerror}") from error
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def run_export_onnx(args: argparse.Namespace) -> int:
    from dpgraph.export.onnx import check_supported, to_onnx

    inputs = dict(parse_input_spec(spec) for spec in args.input or [])
    predict = read_net(args.predict)
    init = read_net(args.init)
    check_supported(predict)    # a net that cannot be exported fails before asking for shapes
    params = {b for op in init.op for b in op.output}
    missing = [b for b in predict.external_input if b not in params and b not in inputs]
    if missing:
        raise CommandError(f"give the shape of data input(s) {', '.join(missing)} with "
                           f"--input NAME:SHAPE[:DTYPE], e.g. --input {missing[0]}:1x3x8x8")
    model = to_onnx(predict, init, inputs, opset=args.opset, outputs=args.outputs or None)
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as error:  # a bug in the exporter, not the user's
        raise ExportError(f"the exported model fails onnx.checker: {error}") from error
    _write_atomic(model.SerializeToString(), args.output)
    print(f"wrote {args.output} (opset {args.opset}, {len(model.graph.node)} nodes, "
          f"{len(model.graph.initializer)} initializers)")
    return EXIT_OK


def add_export_onnx_command(subparsers: argparse._SubParsersAction) -> None:
    """``dpgraph export-onnx PREDICT.pb INIT.pb -o MODEL.onnx --input NAME:SHAPE[:DTYPE]``."""
    parser = subparsers.add_parser(
        "export-onnx", help="convert a predictor (predict + init net) to ONNX",
        description="Convert a predictor to an ONNX model checked with onnx.checker. Every "
                    "data input of the predict net needs --input NAME:SHAPE[:DTYPE]; SHAPE "
                    "is like 1x3x8x8 or 1,3,8,8, and a name instead of a number (Nx3x8x8) "
                    "makes that dimension symbolic. Exit code 1 when the net has ops ONNX "
                    "cannot express (all are listed).")
    parser.add_argument("predict", metavar="PREDICT", help="predict net (.pb, .txt, .pbtxt)")
    parser.add_argument("init", metavar="INIT", help="init net holding the parameters")
    parser.add_argument("-o", "--output", required=True, metavar="MODEL.onnx",
                        help="where to write the ONNX model")
    parser.add_argument("--input", action="append", metavar="NAME:SHAPE[:DTYPE]",
                        help="shape (and dtype, default float32) of a data input; repeat "
                             "for several inputs")
    parser.add_argument("--opset", type=int, default=17,
                        help="ONNX opset version (default %(default)s, at least 13)")
    parser.add_argument("--outputs", nargs="+", metavar="BLOB",
                        help="graph outputs (default: the net's external outputs)")
    parser.set_defaults(command=_guarded("export-onnx", run_export_onnx))


# --- verify -------------------------------------------------------------------------------
def run_verify(args: argparse.Namespace) -> int:
    from dpgraph.ir.verify import verify_problems

    proto = read_net(args.file)
    known = list(args.known or [])
    if args.init:
        known += [b for op in read_net(args.init).op for b in op.output]
    problems = verify_problems(proto, known)
    if not problems:
        print(f"{args.file}: ok ({len(proto.op)} ops)")
        return EXIT_OK
    print(f"{args.file}: {len(problems)} problem(s)")
    for problem in problems:
        print(f"  {problem}")
    print(f"dpgraph verify: error: {args.file} failed verification with {len(problems)} "
          "problem(s)", file=sys.stderr)
    return EXIT_FAILED


def add_verify_command(subparsers: argparse._SubParsersAction) -> None:
    """``dpgraph verify FILE.pb [--init INIT.pb] [--known BLOB ...]``."""
    parser = subparsers.add_parser(
        "verify", help="check a net: op schemas, undefined blobs, device scopes",
        description="Run dpgraph's verifier: unknown op types and wrong arity, inputs read "
                    "before anything writes them, undefined external outputs, and ops that "
                    "touch another device's blobs. Prints every problem; exit code 1 when "
                    "there are any.")
    parser.add_argument("file", metavar="FILE", help="net file (.pb, .txt or .pbtxt)")
    parser.add_argument("--init", metavar="INIT", help="init net whose outputs exist "
                        "before FILE runs")
    parser.add_argument("--known", nargs="+", metavar="BLOB",
                        help="blobs that exist before the net runs")
    parser.set_defaults(command=_guarded("verify", run_verify))


EXPORT_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_inspect_command, add_draw_command, add_export_onnx_command, add_verify_command]
