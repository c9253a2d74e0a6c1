"""Blob names: :class:`BlobReference`, :class:`GradientSlice` and scoped names."""

from __future__ import annotations

from collections import namedtuple
from typing import TYPE_CHECKING, Any

from dpgraph.errors import BlobNameError, UnboundBlobError
from dpgraph.ir import scope
from dpgraph.ir.registry import OPERATORS

if TYPE_CHECKING:
    from dpgraph.ir.net import Net

GradientSlice = namedtuple("GradientSlice", ["indices", "values"])
GradientSlice.__doc__ = "A sparse gradient: the rows ``indices`` of a blob get ``values``."


def _as_str(name: Any) -> str:
    if type(name) is str:
        return name
    return name.decode("utf-8") if isinstance(name, bytes) else str(name)


class BlobConcatError(BlobNameError, RuntimeError):
    """``BlobReference + x`` with a non-string ``x`` (Caffe2 raised RuntimeError; this is
    that and a BlobNameError)."""


class BlobReference:
    """A blob name, optionally bound to the net that produces it.

    It hashes and compares like its name, so ``grad_map["fc_w"]`` works with a
    BlobReference key.  ``ref + "_grad"`` keeps the full (scoped) name.  Calling an op type
    on a bound reference (``ref.Relu([], "y")``) adds that op to its net with ``ref`` as the
    first input.
    """

    __slots__ = ("_name", "_from_net", "_meta")

    def __init__(self, name: str | bytes | Any, net: Net | None = None) -> None:
        self._name = _as_str(name)
        self._from_net = net
        self._meta: dict[str, Any] | None = None

    @property
    def meta(self) -> dict[str, Any]:
        """Free-form annotations (made on first use: most references never have any)."""
        if self._meta is None:
            self._meta = {}
        return self._meta

    @meta.setter
    def meta(self, value: dict[str, Any]) -> None:
        self._meta = value

    def __hash__(self) -> int:
        return hash(self._name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (str, BlobReference)):
            return self._name == str(other)
        if isinstance(other, bytes):
            return self._name == other.decode("utf-8")
        return False

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __lt__(self, other: object) -> bool:
        return self._name < str(other)

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f'BlobReference("{self._name}")'

    def __add__(self, other: object) -> BlobReference:
        if not isinstance(other, str):
            raise BlobConcatError(f"Cannot add BlobReference {self._name!r} to a non-string "
                                  f"({type(other).__name__}); add a str suffix.")
        return BlobReference(self._name + other, self._from_net)

    def __radd__(self, other: object) -> BlobReference:
        if not isinstance(other, str):
            raise BlobConcatError(f"Cannot add a non-string ({type(other).__name__}) to "
                                  f"BlobReference {self._name!r}; add a str prefix.")
        return BlobReference(other + self._name, self._from_net)

    def Net(self) -> Net | None:
        """The net this reference was created by, if any."""
        return self._from_net

    def GetNameScope(self) -> str:
        """Everything up to and including the last ``/`` (``''`` if unscoped)."""
        return self._name[: self._name.rfind(scope._NAMESCOPE_SEPARATOR) + 1]

    def GetUnscopedName(self) -> str:
        """The name after the last ``/``."""
        return self._name[self._name.rfind(scope._NAMESCOPE_SEPARATOR) + 1:]

    def _CreateAndAddToNet(self, op_type: str, inputs: Any = None, *args: Any,
                           **kwargs: Any) -> Any:
        if inputs is None:
            inputs = [self]
        elif isinstance(inputs, (str, bytes, BlobReference)):
            inputs = [self, inputs]
        else:
            inputs = [self, *inputs]
        assert self._from_net is not None
        return self._from_net.__getattr__(op_type)(inputs, *args, **kwargs)

    def __getattr__(self, op_type: str) -> Any:
        if op_type.startswith("__"):
            raise AttributeError(op_type)
        if self._from_net is None:
            raise UnboundBlobError(
                f"Cannot call {op_type} on blob {self._name!r}: it is not bound to a net. "
                "Create the op with net.<OpType>(...) instead."
            )
        OPERATORS.require_method(op_type)
        return lambda *args, **kwargs: self._CreateAndAddToNet(op_type, *args, **kwargs)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(OPERATORS.types()))


def ScopedName(name: str | bytes) -> str:
    """``name`` prefixed with the current name scope."""
    return scope.CurrentNameScope() + _as_str(name)


def ScopedBlobReference(name: str | bytes, *args: Any, **kwargs: Any) -> BlobReference:
    """A BlobReference whose name carries the current name scope."""
    return BlobReference(ScopedName(name), *args, **kwargs)


def blob_name(blob: Any, what: str = "blob") -> str:
    """The name of a str/bytes/BlobReference blob; anything else is a BlobNameError."""
    if isinstance(blob, BlobReference):
        return blob._name
    if isinstance(blob, str):
        return blob
    if isinstance(blob, bytes):
        return blob.decode("utf-8")
    raise BlobNameError(
        f"{what} must be a str, bytes or BlobReference, got {type(blob).__name__} {blob!r}."
    )
