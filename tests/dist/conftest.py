"""Launch several ranks of ``_worker.run_rank`` on loopback, with hard timeouts.

Ranks are forked from a multiprocessing forkserver that has already imported dpgraph and
torch.distributed, so each rank starts in milliseconds instead of re-importing torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _launch import FORKSERVER, free_port

FORKSERVER.set_forkserver_preload(["torch.distributed", "_worker"])


@pytest.fixture
def file_store(tmp_path: Path) -> dict[str, Any]:
    return {"kind": "file", "path": str(tmp_path / "rendezvous")}


@pytest.fixture
def tcp_store() -> dict[str, Any]:
    return {"kind": "tcp", "port": free_port()}
