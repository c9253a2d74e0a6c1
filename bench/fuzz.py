"""Fuzz benchmark: >= 10,000 cases per target through dpgraph's loaders; prints ONE JSON object.

Targets (see ``tests/fuzz/targets.py``): the .pb loaders (``netdef``, ``plandef``,
``tensorprotos``, ``metanetdef``), the text format (``text``), the DB readers (``minidb``,
``lmdb``), ``Load`` on a minidb (``db_load``), the checkpoint loader (``checkpoint``), the
predictor DB reader (``predictor_db``) on truncated / bit-flipped / spliced / random inputs,
and the verifier and the ONNX exporter (``verify``, ``onnx``) on random valid nets.

Each target runs in its own child process (a crash of a C library is counted, not fatal;
the LMDB target, whose C library maps the raw file, runs every case in a forked child);
every case runs under a per-case time limit (a hang is counted).  Per target the JSON gives
``cases``, ``ok`` (a correct result), ``typed`` (a DpgraphError), ``untyped`` (any other
exception), ``hangs``, ``crashes`` (the child died; the count is of children restarted)
and up to 3 examples of each failure (kind, message, input as hex); ``pass`` is true when
untyped + hangs + crashes is 0 for every target.

Run: ``python bench/fuzz.py [--cases 10000] [--targets netdef,text] [--seed 0]
[--case-timeout 10]``.  ``--cases 10000`` takes a few minutes per target on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def _case(name: str, rng: random.Random, seeds: dict[str, bytes]) -> Any:
    import targets as T

    if name in T.NET_TARGETS:
        return T.random_net(rng)
    if rng.random() < 0.1:
        return rng.randbytes(rng.randrange(0, 128))
    return T.MUTATORS.get(name, T.mutate)(seeds[name], rng)


def _describe(case: Any) -> str:
    if isinstance(case, bytes):
        return case[:256].hex()
    return ",".join(getattr(case, "ops", [])) or repr(case)[:200]


def _isolated(fn: Any, case: Any, index: int, case_timeout: float, counts: dict[str, int],
              examples: list[dict[str, str]]) -> None:
    import targets as T

    try:
        counts[T.outcome_isolated(fn, case, case_timeout)] += 1
    except AssertionError as error:
        kind = str(error).split(":", 1)[0]
        key = {"crash": "crashes", "hang": "hangs"}.get(kind, "untyped")
        counts[key] += 1
        if sum(e["kind"] == key for e in examples) < 3:
            last = (str(error).strip().splitlines() or [""])[-1]
            examples.append({"kind": key, "index": str(index), "error": last[-300:],
                             "input": _describe(case)})


def worker(name: str, start: int, cases: int, seed: int, case_timeout: float,
           progress: Path) -> dict[str, Any]:
    """Run cases ``start..cases-1`` of target ``name``; record progress for the parent."""
    import targets as T

    from dpgraph.errors import DpgraphError

    seeds = T.seeds()
    fn = T.BYTE_TARGETS.get(name) or T.NET_TARGETS[name]
    counts = {"ok": 0, "typed": 0, "untyped": 0, "hangs": 0, "crashes": 0}
    examples: list[dict[str, str]] = []
    signal.signal(signal.SIGALRM, _alarm)
    for index in range(start, cases):
        rng = random.Random(f"{seed}:{name}:{index}")
        case = _case(name, rng, seeds)
        progress.write_text(json.dumps({"index": index, "counts": counts,
                                        "examples": examples, "input": _describe(case)}))
        if name in T.ISOLATED:  # C code on the raw file: a forked child per case
            _isolated(fn, case, index, case_timeout, counts, examples)
            continue
        signal.setitimer(signal.ITIMER_REAL, case_timeout)
        try:
            fn(case)
            counts["ok"] += 1
        except DpgraphError:
            counts["typed"] += 1
        except _Hang:
            counts["hangs"] += 1
            examples.append({"kind": "hang", "index": str(index), "input": _describe(case)})
        except Exception as error:  # noqa: BLE001 - the finding
            counts["untyped"] += 1
            if sum(e["kind"] == "untyped" for e in examples) < 3:
                where = traceback.extract_tb(error.__traceback__)[-1]
                examples.append({"kind": "untyped", "index": str(index),
                                 "error": f"{type(error).__name__}: {error}"[:300],
                                 "at": f"{Path(where.filename).name}:{where.lineno}",
                                 "input": _describe(case)})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return {"counts": counts, "examples": examples}


def run_target(name: str, cases: int, seed: int, case_timeout: float,
               tmp: Path, preload: str = "") -> dict[str, Any]:
    """Run one target in child processes, restarting after a crash."""
    progress = tmp / f"{name}.progress"
    result = tmp / f"{name}.json"
    totals = {"cases": cases, "ok": 0, "typed": 0, "untyped": 0, "hangs": 0, "crashes": 0}
    examples: list[dict[str, str]] = []
    start, began = 0, time.perf_counter()
    while start < cases:
        progress.unlink(missing_ok=True)
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", name, "--start", str(start),
             "--cases", str(cases), "--seed", str(seed), "--case-timeout", str(case_timeout),
             "--out", str(result), "--progress", str(progress), "--preload", preload],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        if proc.returncode == 0:
            done = json.loads(result.read_text())
            start = cases
        else:  # the child died on case state["index"]: count it, go on after it
            state = json.loads(progress.read_text()) if progress.exists() else \
                {"index": start, "counts": {}, "examples": [], "input": ""}
            done = {"counts": state["counts"], "examples": state["examples"]}
            totals["crashes"] += 1
            if sum(e["kind"] == "crash" for e in examples) < 3:
                examples.append({"kind": "crash", "index": str(state["index"]),
                                 "error": f"exit status {proc.returncode}: "
                                          f"{proc.stderr.strip()[-200:]}",
                                 "input": state["input"]})
            start = state["index"] + 1
        for key, value in done["counts"].items():
            totals[key] = totals.get(key, 0) + value
        examples.extend(done["examples"])
    totals["seconds"] = round(time.perf_counter() - began, 1)
    totals["examples"] = examples[:9]
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per target")
    parser.add_argument("--targets", default="", help="comma-separated (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case-timeout", type=float, default=10.0,
                        help="seconds one case may take before it counts as a hang")
    parser.add_argument("--preload", default="",
                        help="a Python file each worker runs first (e.g. to try a candidate "
                             "fix by monkeypatching before it lands)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--progress", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.preload:
            exec(compile(Path(args.preload).read_text(), args.preload, "exec"), {})  # noqa: S102
        done = worker(args.worker, args.start, args.cases, args.seed, args.case_timeout,
                      Path(args.progress))
        Path(args.out).write_text(json.dumps(done))
        return
    import tempfile

    import targets as T

    names = [n for n in args.targets.split(",") if n] or [*T.BYTE_TARGETS, *T.NET_TARGETS]
    unknown = sorted(set(names) - set(T.BYTE_TARGETS) - set(T.NET_TARGETS))
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {[*T.BYTE_TARGETS, *T.NET_TARGETS]}")
    with tempfile.TemporaryDirectory(prefix="dpgraph-fuzz-bench-") as tmp:
        results = {name: run_target(name, args.cases, args.seed, args.case_timeout,
                                    Path(tmp), args.preload) for name in names}
    bad = {n: r["untyped"] + r["hangs"] + r["crashes"] for n, r in results.items()}
    print(json.dumps({"cases_per_target": args.cases, "seed": args.seed,
                      "preload": args.preload or None,
                      "pass": not any(bad.values()), "failures": bad, "targets": results},
                     indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
