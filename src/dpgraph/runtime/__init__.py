"""dpgraph's runtime: workspaces, blob placement, devices, executors, plans, shapes.

``Workspace`` can be used directly; :mod:`dpgraph.workspace` is the Caffe2-style facade over
the current workspace.
"""

from dpgraph.runtime.devices import NumGpuDevices, SetVirtualGpus
from dpgraph.runtime.executor import DagExecutor, SimpleExecutor
from dpgraph.runtime.operator import OpInstance
from dpgraph.runtime.workspace import NetInstance, Workspace

__all__ = ["DagExecutor", "NetInstance", "NumGpuDevices", "OpInstance", "SetVirtualGpus",
           "SimpleExecutor", "Workspace"]
