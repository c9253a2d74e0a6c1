"""workspace.C's DB names: registered_dbs() and the module-level mode constants."""

from __future__ import annotations

from dpgraph import workspace


def test_registered_dbs_and_modes() -> None:
    assert {"minidb", "lmdb", "leveldb"} <= set(workspace.C.registered_dbs())
    assert (workspace.C.read, workspace.C.write, workspace.C.new) == (
        workspace.C.Mode.read, workspace.C.Mode.write, workspace.C.Mode.new)
