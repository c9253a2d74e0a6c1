"""Soak test: the demo model trained for many iterations with data workers feeding it;
prints ONE JSON object with RSS and thread counts over time.

Two runs: ``local`` (the digits CNN of ``dpgraph demo``, ``Parallelize_CPU`` on 4 CPU
devices, ``data_workers`` fetcher threads feeding every device) and ``gloo`` (the same on
2 devices in each of 2 processes, gradients summed over a Gloo world through a FileStore).
Every ``--sample-every`` iterations each process records ``rss_mb`` (VmRSS), ``threads``
(OS threads, /proc/self/status) and ``py_threads`` (``threading.active_count()``).

Checks (``checks`` in the JSON, ``pass`` when all hold): after warm-up (the first
``--warmup`` fraction of the run) RSS grows < 5 % (the median of the last quarter of the
samples after warm-up against the median of their first quarter) and the thread count is
constant; after ``coordinator.stop()`` and ``ResetWorkspace()`` no data-worker thread is
alive, the threads are those from before the model was built (plus, in a gloo rank, the one
Gloo TCP device loop ``collectives/gloo.py`` keeps per process by design, listed in
``threads_added_after_stop``), and (gloo) the ranks exit with status 0 and leave no child
processes behind.

Run: ``python bench/soak.py [--iterations 2000] [--runs local,gloo] [--batch 32]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return ""


def _children() -> list[str]:
    """Command lines of this process's live child processes (all threads' children),
    except multiprocessing's resource tracker (it serves the parent until it exits)."""
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    lines = [f"{pid}: {_cmdline(pid)}" for pid in pids]
    return [line for line in lines if "resource_tracker" not in line]


def _thread_names() -> list[str]:
    """OS-level names of this process's threads (``/proc/self/task/*/comm``)."""
    names = []
    for task in sorted(Path("/proc/self/task").iterdir()):
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            continue
    return names


def sample(iteration: int) -> dict[str, Any]:
    return {"iteration": iteration, "rss_mb": round(_status("VmRSS") / 1024, 2),
            "threads": _status("Threads"), "py_threads": threading.active_count()}


def _fetcher(images: np.ndarray, labels: np.ndarray) -> Any:
    def fetch(worker_id: int, batch_size: int) -> list[np.ndarray]:
        rows = np.random.default_rng().integers(0, len(labels), batch_size)
        return [images[rows], labels[rows]]
    return fetch


def train(devices: int, iterations: int, batch: int, every: int,
          rendezvous: Any = None, tag: str = "local") -> dict[str, Any]:
    """Build, feed and train the demo CNN; return the samples and the shutdown checks.
    (Every rank of a gloo run must use the same ``tag``: it names the model's nets.)"""
    from dpgraph import data_parallel_model, data_workers, model_helper, workspace
    from dpgraph.demo import DemoConfig, add_training_forward, load_data, make_optimizer

    images, labels, _, _ = load_data(0)
    before, before_names = sample(0), _thread_names()
    source = f"soak_{tag}"

    def add_input(model: Any) -> None:
        data_workers.init_data_input_workers(model, ["data", "label"],
                                             _fetcher(images, labels), batch, 2,
                                             input_source_name=source,
                                             max_buffered_batches=32)

    model = model_helper.ModelHelper(name=f"soak_{tag}")
    data_parallel_model.Parallelize_CPU(
        model, add_input, add_training_forward,
        optimizer_builder_fun=make_optimizer(DemoConfig(learning_rate=0.02)),
        devices=list(range(devices)), rendezvous=rendezvous)
    coordinator = data_workers.global_coordinator
    coordinator.start()
    data_parallel_model.RunInitNet(model)
    samples, losses = [], []
    start = time.perf_counter()
    for iteration in range(1, iterations + 1):
        data_parallel_model.RunNet(model, 1)
        if iteration % every == 0 or iteration == iterations:
            samples.append(sample(iteration))
            losses.append(float(workspace.FetchBlob("cpu_0/loss")))
    seconds = time.perf_counter() - start
    stopped = bool(coordinator.stop())
    workspace.ResetWorkspace()
    time.sleep(0.2)
    after = sample(iterations)
    leftover = [t.name for t in threading.enumerate()
                if t.is_alive() and ("fetcher" in t.name or "Enqueuer" in t.name)]
    return {"samples": samples, "before": before, "after_stop": after,
            "thread_names_before": before_names, "thread_names_after_stop": _thread_names(),
            "stop_returned": stopped, "leftover_worker_threads": leftover,
            "children_after_stop": _children(), "iterations_per_sec":
            round(iterations / seconds, 1), "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None}


#: Process-wide threads that outlive a model by design (one each, reused by later models):
#: the Gloo TCP device's event loop (collectives/gloo.py caches one device per interface).
SINGLETONS = ("gloo_tcp_loop",)


def checks(run: dict[str, Any], warmup: float) -> dict[str, Any]:
    samples = run["samples"]
    extra = list(run["thread_names_after_stop"])
    for name in run["thread_names_before"]:
        if name in extra:
            extra.remove(name)
    settled = [s for s in samples if s["iteration"] > warmup * samples[-1]["iteration"]]
    settled = settled or samples[-1:]
    quarter = max(1, len(settled) // 4)  # medians of the first and last quarter: no jitter
    early = float(np.median([s["rss_mb"] for s in settled[:quarter]]))
    late = float(np.median([s["rss_mb"] for s in settled[-quarter:]]))
    growth = (late - early) / early
    threads = sorted({s["threads"] for s in settled})
    result = {
        "rss_growth_after_warmup_pct": round(100 * growth, 2),
        "rss_ok": growth < 0.05,
        "threads_after_warmup": threads,
        "threads_constant": len(threads) == 1,
        "threads_added_after_stop": extra,
        "threads_back_to_baseline": not [n for n in extra if n not in SINGLETONS]
        and all(extra.count(n) <= 1 for n in SINGLETONS),
        "no_worker_threads_left": not run["leftover_worker_threads"],
        "no_children_left": not run["children_after_stop"],
    }
    result["pass"] = all(v for k, v in result.items() if k.endswith(("ok", "constant",
                                                                      "baseline", "left")))
    return result


def _rank(rank: int, size: int, store: str, args: argparse.Namespace, out: str) -> None:
    from dpgraph import core, workspace

    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator(
        "FileStoreHandlerCreate", [], ["store_handler"], path=store, prefix="soak"))
    rendezvous = {"kv_handler": "store_handler", "shard_id": rank, "num_shards": size,
                  "engine": "GLOO"}
    with contextlib.redirect_stdout(sys.stderr):  # worker shutdown logs; stdout is the JSON
        run = train(2, args.iterations, args.batch, args.sample_every, rendezvous, "gloo")
    Path(out).write_text(json.dumps(run))


def gloo(args: argparse.Namespace) -> dict[str, Any]:
    """Two ranks as spawned processes; each writes its run as JSON."""
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="dpgraph-soak-") as tmp:
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(2)]
        procs = [ctx.Process(target=_rank, args=(r, 2, os.path.join(tmp, "store"), args,
                                                  outs[r])) for r in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(args.timeout)
        exitcodes = [proc.exitcode for proc in procs]
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        ranks = [json.loads(Path(o).read_text()) if os.path.exists(o) else None
                 for o in outs]
    time.sleep(0.2)
    return {"exitcodes": exitcodes, "children_left_in_parent": _children(),
            "ranks": [dict(r, checks=checks(r, args.warmup)) if r else None for r in ranks]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--runs", default="local,gloo")
    parser.add_argument("--batch", type=int, default=32, help="rows per device per batch")
    parser.add_argument("--sample-every", type=int, default=0,
                        help="iterations between samples (default: iterations / 20)")
    parser.add_argument("--warmup", type=float, default=0.25,
                        help="fraction of the run treated as warm-up")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per gloo rank")
    args = parser.parse_args()
    args.sample_every = args.sample_every or max(1, args.iterations // 20)
    runs = [r for r in args.runs.split(",") if r]
    report: dict[str, Any] = {"iterations": args.iterations, "batch_per_device": args.batch}
    if "local" in runs:
        with contextlib.redirect_stdout(sys.stderr):  # worker shutdown logs
            run = train(4, args.iterations, args.batch, args.sample_every)
        report["local"] = dict(run, checks=checks(run, args.warmup))
    if "gloo" in runs:
        report["gloo"] = gloo(args)
    ok = []
    if "local" in report:
        ok.append(report["local"]["checks"]["pass"])
    if "gloo" in report:
        g = report["gloo"]
        ok.append(g["exitcodes"] == [0, 0] and not g["children_left_in_parent"]
                  and all(r and r["checks"]["pass"] for r in g["ranks"]))
    report["pass"] = bool(ok) and all(ok)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
