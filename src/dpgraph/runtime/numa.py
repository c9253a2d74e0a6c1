"""NUMA queries of Caffe2's workspace (``IsNUMAEnabled``, ``GetNumNUMANodes``,
``GetBlobNUMANode``).

dpgraph allocates with numpy and never binds memory to NUMA nodes (a ``numa_node_id`` in a
DeviceOption is accepted and ignored), so it answers as a Caffe2 built without NUMA
support (``USE_NUMA=OFF``, the default build) does, whatever ``--caffe2_cpu_numa_enabled``
says: NUMA is not enabled, the node count is -1 and so is every blob's node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.errors import BlobNotFoundError, WorkspaceError
from dpgraph.runtime import api

#: The GlobalInit flag Caffe2 reads for NUMA placement (accepted; see the module docstring).
NUMA_FLAG = "caffe2_cpu_numa_enabled"


def is_numa_enabled() -> bool:
    """False: dpgraph has no NUMA placement (Caffe2 without NUMA support)."""
    return False


def get_num_numa_nodes() -> int:
    """-1, Caffe2's answer when NUMA is not enabled."""
    return -1


def get_blob_numa_node(blob_name: Any) -> int:
    """The NUMA node of a CPU tensor blob's data: -1 (NUMA is not enabled).  As Caffe2, the
    blob must exist in the current workspace and hold a tensor with data."""
    name = api.StringifyBlobName(blob_name)
    if not api.HasBlob(name):
        raise BlobNotFoundError(f"GetBlobNUMANode: blob {name!r} does not exist in workspace "
                                f"{api.CurrentWorkspace()!r}.")
    value = api.FetchBlob(name)
    if not isinstance(value, np.ndarray) or value.size == 0:
        raise WorkspaceError(f"GetBlobNUMANode: blob {name!r} holds no CPU tensor data "
                             f"({type(value).__name__}); feed or compute a tensor first.")
    return -1
