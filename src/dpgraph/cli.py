"""The ``dpgraph`` command line: one function per subcommand.

``dpgraph demo`` trains a small CNN data-parallel on scikit-learn's digits; ``dpgraph plan``
predicts data-parallel step times (per-blob against bucketed gradient synchronisation).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

Command = Callable[[argparse.Namespace], int]


def add_demo_command(subparsers: argparse._SubParsersAction) -> None:
    """``dpgraph demo``: data-parallel CNN training on 8x8 digits, with a closing check."""
    from dpgraph.demo import DemoConfig

    defaults = DemoConfig()
    parser = subparsers.add_parser(
        "demo", help="train a small CNN data-parallel on scikit-learn's digits",
        description="Train a small CNN on scikit-learn's 8x8 handwritten digits with "
                    "data_parallel_model on several CPU devices, report per-epoch loss, "
                    "held-out accuracy and throughput, then check that N devices give "
                    "the same parameters as 1 device fed the whole batch.")
    parser.add_argument("--devices", type=int, default=defaults.devices,
                        help="number of CPU devices (default %(default)s)")
    parser.add_argument("--epochs", type=int, default=defaults.epochs,
                        help="training epochs (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size,
                        help="global batch size, split over the devices (default %(default)s)")
    parser.add_argument("--lr", type=float, default=defaults.learning_rate,
                        help="learning rate (default %(default)s)")
    parser.add_argument("--momentum", type=float, default=defaults.momentum,
                        help="SGD momentum (default %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help="random seed (default %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="print only the summary line")
    parser.set_defaults(command=run_demo_command)


def run_demo_command(args: argparse.Namespace) -> int:
    from dpgraph.demo import DemoConfig, run_demo

    config = DemoConfig(devices=args.devices, epochs=args.epochs, batch_size=args.batch_size,
                        learning_rate=args.lr, momentum=args.momentum, seed=args.seed,
                        quiet=args.quiet)
    if config.devices < 1 or config.epochs < 1 or config.batch_size < config.devices:
        print(f"dpgraph demo: error: need --devices >= 1, --epochs >= 1 and --batch-size >= "
              f"--devices (got --devices {config.devices}, --epochs {config.epochs}, "
              f"--batch-size {config.batch_size})", file=sys.stderr)
        return 2
    result = run_demo(config)
    print(f"accuracy {100 * result.accuracy:.1f}%  {result.images_per_sec:,.0f} images/s  "
          f"params match 1-device run: {'yes' if result.params_match else 'NO'} "
          f"(max |diff| {result.max_param_diff:.1e})  {result.seconds:.1f} s")
    return 0 if result.ok else 1


def _all_commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    from dpgraph.export.commands import EXPORT_COMMANDS
    from dpgraph.parallel.plan.command import add_plan_command

    return [add_demo_command, *EXPORT_COMMANDS, add_plan_command]


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = _all_commands()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpgraph", description="dpgraph: Caffe2-compatible data-parallel training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpgraph`` console script and ``python -m dpgraph``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    command: Command | None = getattr(args, "command", None)
    if command is None:
        parser.print_help()
        return 2
    try:
        code = command(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``dpgraph inspect net.pb | head``): stop quietly, and send
        # what Python would flush at exit to /dev/null instead of printing a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
