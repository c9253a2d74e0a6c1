"""``dpgraph plan``: predicted step time, communication share and scaling efficiency of a
data-parallel model, per-blob against bucketed, from 1 to 1024 workers.

The model is ``resnet50`` (built in), a predictor directory (``predict_net.pb`` +
``init_net.pb``), a NetDef file with ``--init-net``, or ``module:function`` returning a
ModelHelper or a ``(predict_net, init_net)`` pair.  Inputs that are not params need
``--input NAME=D0,D1,...`` (the per-worker batch included).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from dpgraph.errors import CommandError
from dpgraph.parallel.plan.cost_model import load
from dpgraph.parallel.plan.planner import MB, format_table, scaling_table
from dpgraph.parallel.plan.profile import StepProfile, profile_from_nets, resnet50_profile
from dpgraph.proto import caffe2_pb2

DEFAULT_WORKERS = "1,2,4,8,16,32,64,128,256,512,1024"


def add_plan_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dpgraph plan``."""
    parser = subparsers.add_parser(
        "plan", help="predict data-parallel step time and scaling, per-blob vs bucketed",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="resnet50",
                        help="resnet50, a predictor dir, a NetDef .pb/.pbtxt, or module:function")
    parser.add_argument("--init-net", help="the init net of a NetDef model file")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=DIMS",
                        help="shape of a non-param input, e.g. data=32,3,224,224")
    parser.add_argument("--batch", type=int, default=32, help="resnet50 images per worker")
    parser.add_argument("--workers", default=DEFAULT_WORKERS, help="comma-separated counts")
    parser.add_argument("--devices-per-worker", type=int, default=1,
                        help="local devices reduced inside each worker (default 1)")
    parser.add_argument("--backend", default="gloo", help="gloo or nccl (default gloo)")
    parser.add_argument("--cost-model", help="JSON cost model (default $DPGRAPH_COST_MODEL)")
    parser.add_argument("--alpha", type=float, help="latency per collective step, seconds")
    parser.add_argument("--bandwidth", type=float, help="link bandwidth, bytes per second")
    parser.add_argument("--gflops", type=float, help="compute speed of one worker, GFLOP/s")
    parser.add_argument("--bucket-mb", default="auto", help="bucket size in MB, or auto")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--calibrate", metavar="PATH",
                        help="measure this machine (Gloo over --processes local ranks, local "
                             "reductions, FLOP/s), save the cost model to PATH and exit")
    parser.add_argument("--processes", type=int, default=2, help="ranks for --calibrate")
    parser.set_defaults(command=run_plan_command)


def _dims(specs: list[str]) -> dict[str, list[int]]:
    result = {}
    for spec in specs:
        name, _, dims = spec.partition("=")
        try:
            result[name] = [int(d) for d in dims.split(",") if d]
        except ValueError:
            raise CommandError(f"--input {spec!r}: expected NAME=D0,D1,... (integers)") from None
    return result


def _read_net(path: str | os.PathLike[str]) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef()
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {os.fspath(path)!r}: {error.strerror}") from error
    try:
        if str(path).endswith((".pbtxt", ".prototxt")):
            text_format.Parse(data.decode("utf-8"), net)
        else:
            net.ParseFromString(data)
    except Exception as error:  # noqa: BLE001 - any parse failure is the user's file
        raise CommandError(f"{os.fspath(path)}: not a NetDef ({error})") from error
    return net


def _python_model(spec: str) -> tuple[Any, Any]:
    module_name, _, attr = spec.partition(":")
    try:
        built = getattr(importlib.import_module(module_name), attr)()
    except (ImportError, AttributeError) as error:
        raise CommandError(f"cannot load {spec!r}: {error}") from error
    if hasattr(built, "param_init_net"):
        return built.net.Proto(), built.param_init_net.Proto()
    predict, init = built
    return (getattr(predict, "Proto", lambda: predict)(),
            getattr(init, "Proto", lambda: init)())


def load_profile(args: argparse.Namespace) -> StepProfile:
    """The step profile of ``args.model``."""
    if args.model == "resnet50":
        return resnet50_profile(args.batch)
    path = Path(args.model)
    if path.is_dir():
        predict, init = _read_net(path / "predict_net.pb"), _read_net(path / "init_net.pb")
    elif path.exists():
        if not args.init_net:
            raise CommandError(f"{args.model}: a NetDef file needs --init-net (its params)")
        predict, init = _read_net(path), _read_net(args.init_net)
    elif ":" in args.model:
        predict, init = _python_model(args.model)
    else:
        raise CommandError(f"{args.model!r} is not resnet50, a directory, a file or "
                           "module:function")
    inputs = _dims(args.input)
    profile = profile_from_nets(predict, init, inputs, name=args.model)
    if not profile.grads:
        raise CommandError(f"{args.model}: no parameter gradients found; is --input set for "
                           "every data input and does the init net create the params?")
    return profile


def run_plan_command(args: argparse.Namespace) -> int:
    """``dpgraph plan``; a bad argument or model prints one error line and returns 2."""
    try:
        return _run(args)
    except CommandError as error:
        print(f"dpgraph plan: error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.calibrate:
        from dpgraph.parallel.plan.calibrate import calibrate

        model = calibrate(args.processes)
        model.save(args.calibrate)
        print(json.dumps(model.to_json(), indent=2, sort_keys=True))
        return 0
    try:
        workers = [int(w) for w in args.workers.split(",") if w]
        bucket = "auto" if args.bucket_mb == "auto" else float(args.bucket_mb) * MB
    except ValueError:
        raise CommandError("--workers takes integers, --bucket-mb a number or auto") from None
    model = load(args.cost_model).with_overrides(
        args.backend, args.alpha, args.bandwidth,
        args.gflops * 1e9 if args.gflops else None)
    profile = load_profile(args)
    rows = scaling_table(profile, model, workers, bucket, args.backend,
                         args.devices_per_worker)
    result = {"model": profile.name, "gradients": len(profile.grads),
              "gradient_mb": profile.grad_bytes / MB,
              "step_gflop": (profile.forward_flops + profile.backward_flops) / 1e9,
              "backend": args.backend, "cost_model": model.to_json(), "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    figures = model.backend(args.backend)
    print(f"{profile.name}: {len(profile.grads)} gradients, {profile.grad_bytes / MB:.1f} MB, "
          f"{result['step_gflop']:.1f} GFLOP/step; {args.backend} alpha "
          f"{figures.alpha * 1e6:.1f} us, {1 / figures.beta / 1e9:.2f} GB/s; "
          f"{model.flops_per_sec / 1e9:.0f} GFLOP/s")
    print(format_table(rows))
    print(json.dumps(result))
    return 0
