"""Launch several ranks of ``_worker.run_rank`` on loopback, with hard timeouts.

Ranks are forked from a multiprocessing forkserver that has already imported dpgraph and
torch.distributed, so each rank starts in milliseconds instead of re-importing torch.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from _launch import FORKSERVER, launch, rank_configs

FORKSERVER.set_forkserver_preload(["torch.distributed", "_worker"])


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

    configs = rank_configs(scenario, size, store, timeout_ms, processes, **extra)
    return launch(_worker.run_rank, configs, hard_timeout)


@pytest.fixture
def file_store(tmp_path: Path) -> dict[str, Any]:
    return {"kind": "file", "path": str(tmp_path / "rendezvous")}


@pytest.fixture
def tcp_store() -> dict[str, Any]:
    return {"kind": "tcp", "port": free_port()}
