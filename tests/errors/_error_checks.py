"""Shared assertions of the error-path tests: the dpgraph type, the Caffe2-compatible
builtin type and the names the message must carry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dpgraph.errors import DpgraphError


def expect_error(call: Callable[[], Any], dpgraph_type: type[DpgraphError],
                 builtin: type[BaseException] | tuple[type[BaseException], ...],
                 *fragments: str) -> BaseException:
    """Run ``call``; it must raise ``dpgraph_type`` that is also ``builtin`` and whose
    message contains every fragment.  Returns the error for further checks."""
    with pytest.raises(DpgraphError) as info:
        call()
    error = info.value
    assert isinstance(error, dpgraph_type), f"{type(error).__mro__} is not {dpgraph_type}"
    assert isinstance(error, builtin), f"{type(error).__mro__} is not {builtin}"
    message = str(error)
    missing = [f for f in fragments if f not in message]
    assert not missing, f"message lacks {missing}: {message}"
    return error
