"""Start ranks (processes, or threads of this process), bound their run time, and collect
each rank's result."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: Ranks fork from one forkserver that preloads torch and dpgraph (see conftest.py).
FORKSERVER = multiprocessing.get_context("forkserver")


def launch(target: Callable[[dict[str, Any], str], Any], configs: Sequence[dict[str, Any]],
           hard_timeout: float) -> list[dict[str, Any]]:
    """Run ``target(config, out_path)`` in one process per config; kill any still running
    after ``hard_timeout`` seconds; return each rank's JSON result (``ok=None``: none)."""
    out_dir = Path(tempfile.mkdtemp(prefix="dpgraph-dist-"))
    procs = []
    for cfg in configs:
        out = out_dir / f"rank{cfg['rank']}.json"
        proc = FORKSERVER.Process(target=target, args=(cfg, str(out)), daemon=True)
        proc.start()
        procs.append((cfg["rank"], proc, out))
    deadline = time.monotonic() + hard_timeout
    results = []
    for rank, proc, out in procs:
        proc.join(max(0.1, deadline - time.monotonic()))
        killed = proc.is_alive()
        if killed:
            proc.kill()
            proc.join(5)
        result = json.loads(out.read_text()) if out.exists() else {"rank": rank, "ok": None}
        results.append({**result, "returncode": proc.exitcode, "killed": killed})
    shutil.rmtree(out_dir, ignore_errors=True)
    return results


def rank_configs(scenario: str, size: int, store: dict[str, Any], timeout_ms: int,
                 processes: int | None = None, **extra: Any) -> list[dict[str, Any]]:
    """One config per started rank (``processes`` defaults to ``size``)."""
    return [{"rank": rank, "size": size, "scenario": scenario, "store": store,
             "timeout_ms": timeout_ms, **extra}
            for rank in range(size if processes is None else processes)]


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(scenario: str, size: int, store: dict[str, Any], processes: int | None = None,
              hard_timeout: float = 30.0, timeout_ms: int = 5000,
              **extra: Any) -> list[dict[str, Any]]:
    """Start ``processes`` (default ``size``) ranks of ``_worker.run_rank``; kill any still
    running after ``hard_timeout`` seconds; return each rank's JSON result (``ok=None``: no
    result)."""
    import _worker  # tests/dist is on sys.path (rootdir conftest)

    configs = rank_configs(scenario, size, store, timeout_ms, processes, **extra)
    return launch(_worker.run_rank, configs, hard_timeout)


def on_ranks(size: int, fn: Callable[[int], Any], timeout: float = 20) -> list[Any]:
    """Run ``fn(rank)`` for every rank in its own thread; exceptions are returned."""
    results: list[Any] = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except Exception as error:
            results[rank] = error

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results
