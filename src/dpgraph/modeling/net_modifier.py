"""Caffe2's ``modeling.net_modifier``: the base of objects that add ops to a built net."""

from __future__ import annotations

import abc
from typing import Any


class NetModifier(abc.ABC):
    """Adds related ops to a generated net; subclasses implement :meth:`modify_net`::

        modifier = SomeNetModifier(opts)
        modifier(net, grad_map=grad_map)
    """

    @abc.abstractmethod
    def modify_net(self, net: Any, init_net: Any = None, grad_map: Any = None,
                   blob_to_device: Any = None, modify_output_record: bool = False) -> Any:
        """Add this modifier's ops to ``net`` (and ``init_net``)."""

    def __call__(self, net: Any, init_net: Any = None, grad_map: Any = None,
                 blob_to_device: Any = None, modify_output_record: bool = False) -> Any:
        return self.modify_net(net, init_net=init_net, grad_map=grad_map,
                               blob_to_device=blob_to_device,
                               modify_output_record=modify_output_record)
