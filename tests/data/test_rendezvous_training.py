"""Two processes train from one LMDB through ImageInput with a file-store rendezvous, as
resnet50_trainer does, save with the predictor exporter and resume from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _records import image_record, jpeg_bytes, write_lmdb

SCRIPT = Path(__file__).with_name("_rendezvous_image_trainer.py")


@pytest.mark.slow
def test_two_ranks_shard_the_lmdb_agree_and_resume(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the GLOO engine runs on torch.distributed
    rng = np.random.default_rng(0)
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(rng.integers(0, 256, (20, 24, 3),
                                                                      dtype=np.uint8)), j % 2)
                                 for j in range(16)])
    (tmp_path / "store").mkdir()
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(rank), "2",
                               str(tmp_path / "db"), str(tmp_path / "store"),
                               str(tmp_path / f"rank{rank}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    for proc in procs:
        output, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, output[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # keys sort "0", "1", "10", ...: shard 0 reads the even records, shard 1 the odd ones
    assert ranks[0]["labels"] == [0, 0, 0, 0] and ranks[1]["labels"] == [1, 1, 1, 1]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # gradients all-reduced across ranks
    for rank in ranks:
        assert rank["iteration"] == 3 and rank["resumed_weights_equal"] and rank["after"] == 4
