"""Launch several ranks of ``_worker.run_rank`` on loopback, with hard timeouts.

Ranks are forked from a multiprocessing forkserver that has already imported dpgraph and
torch.distributed, so each rank starts in milliseconds instead of re-importing torch.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["torch.distributed", "_worker"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(scenario: str, size: int, store: dict[str, Any], processes: int | None = None,
              hard_timeout: float = 30.0, timeout_ms: int = 5000,
              **extra: Any) -> list[dict[str, Any]]:
    """Start ``processes`` (default ``size``) ranks; kill any still running after
    ``hard_timeout`` seconds; return each rank's JSON result (``ok=None``: no result)."""
    import _worker  # tests/dist is on sys.path (rootdir conftest)

    out_dir = Path(tempfile.mkdtemp(prefix="dpgraph-dist-"))
    procs = []
    for rank in range(size if processes is None else processes):
        cfg = {"rank": rank, "size": size, "scenario": scenario, "store": store,
               "timeout_ms": timeout_ms, **extra}
        out = out_dir / f"rank{rank}.json"
        proc = _CONTEXT.Process(target=_worker.run_rank, args=(cfg, str(out)), daemon=True)
        proc.start()
        procs.append((proc, out))
    deadline = time.monotonic() + hard_timeout
    results = []
    for rank, (proc, out) in enumerate(procs):
        proc.join(max(0.1, deadline - time.monotonic()))
        killed = proc.is_alive()
        if killed:
            proc.kill()
            proc.join(5)
        result = json.loads(out.read_text()) if out.exists() else {"rank": rank, "ok": None}
        results.append({**result, "returncode": proc.exitcode, "killed": killed})
    shutil.rmtree(out_dir, ignore_errors=True)
    return results


@pytest.fixture
def file_store(tmp_path: Path) -> dict[str, Any]:
    return {"kind": "file", "path": str(tmp_path / "rendezvous")}


@pytest.fixture
def tcp_store() -> dict[str, Any]:
    return {"kind": "tcp", "port": free_port()}
