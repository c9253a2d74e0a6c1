"""The dpgraph exception hierarchy.

Every user-facing failure raises a subclass of :class:`DpgraphError`.  Messages name the
op, blob and device involved and say how to fix the problem.  Where Caffe2 raised
``AssertionError`` for a user error, the dpgraph error also subclasses ``AssertionError`` so
existing ``except AssertionError`` code keeps working; likewise for Caffe2's ``ValueError``,
``KeyError``, ``TypeError``, ``AttributeError`` and ``RuntimeError``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DpgraphError(Exception):
    """Base class of every error dpgraph raises on purpose."""


# --- IR and graph construction -------------------------------------------------------------
class ProtoError(DpgraphError, ValueError):
    """A protobuf message could not be parsed or does not fit the schema."""


class ScopeError(DpgraphError, AssertionError):
    """A name or device scope was misused (wrong type, unbalanced exit)."""


class BlobNameError(DpgraphError, TypeError):
    """A blob name is not a string, bytes or BlobReference."""


class ArgumentError(DpgraphError, ValueError):
    """An operator argument has a value that cannot be encoded or is invalid."""


class UnknownOperatorError(DpgraphError, AttributeError):
    """An operator type is not registered."""


class OperatorSchemaError(DpgraphError, ValueError):
    """An operator does not fit its schema (arity, in-place pairs)."""


class NetError(DpgraphError, AssertionError):
    """A net was used inconsistently (duplicate external input, undefined output, ...)."""


class BlobNotFoundError(DpgraphError, KeyError):
    """A blob does not exist in a net or workspace."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class VerificationError(DpgraphError, AssertionError):
    """``dpgraph.ir.verify`` found problems in a net; ``problems`` lists them all."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class TextFormatError(DpgraphError, ValueError):
    """The compact text format of a net could not be parsed."""


class DeviceOptionError(ArgumentError, AssertionError):
    """A DeviceOption was built with inconsistent fields (Caffe2 asserted here)."""


class UnboundBlobError(DpgraphError, AttributeError, RuntimeError):
    """An op was called on a BlobReference that is not bound to a net (Caffe2 raised
    RuntimeError in 2018 and AttributeError later; this is both)."""


class DeviceOptionTypeError(DeviceOptionError, TypeError):
    """A DeviceOption field got a value of the wrong type, e.g. ``DeviceOption("cuda", 0)``
    (a TypeError, as protobuf's field assignment raised in Caffe2)."""


# --- autodiff ------------------------------------------------------------------------------
class GradientError(DpgraphError, RuntimeError):
    """Gradient generation failed (SSA version mismatch, mixed dense/sparse, devices)."""


class NoGradientError(GradientError):
    """An op needed a gradient but has no registered gradient maker."""


class StopGradientError(DpgraphError, ValueError):
    """A StopGradient output is never used in the forward pass."""


# --- runtime -------------------------------------------------------------------------------
class WorkspaceError(DpgraphError, RuntimeError):
    """A workspace-level failure (missing net or blob, refusing to overwrite a net)."""


class DeviceError(DpgraphError, RuntimeError):
    """A device is unavailable or a blob was read from a device that cannot reach it."""


class ShapeError(DpgraphError, ValueError):
    """Tensor shapes or dtypes do not fit an operator."""


class OperatorError(DpgraphError, RuntimeError):
    """An operator failed while running; the kernel's exception is chained."""


class NetCancelledError(WorkspaceError):
    """A net's run was cancelled (``workspace.C.Net.cancel()``) before it finished."""


class OperatorFailedError(OperatorError):
    """An operator reported failure without an exception of its own (Caffe2's RunOnDevice
    returned false: ``Fail``, a queue op on a closed queue). ``RunNet(..., allow_fail=True)``
    returns False for it; an exception a kernel throws still propagates, as in Caffe2."""


class QueueClosedError(OperatorFailedError):
    """A blobs queue was closed while an op waited on it."""


class WorkspaceNameError(DpgraphError, TypeError, AssertionError):
    """A blob or net name given to the workspace API has the wrong type (Caffe2 asserted
    "Expected a string or BlobReference/Net")."""


class UnregisteredOperatorError(UnknownOperatorError, RuntimeError):
    """A net being created or run has an op of unregistered type (a RuntimeError, as
    Caffe2's C++ net creation raised, and an UnknownOperatorError)."""


class OperatorDefError(OperatorSchemaError, RuntimeError):
    """A net being created or run has an op that does not fit its schema or has no kernel
    (a RuntimeError, as in Caffe2's C++ net creation)."""


# --- modeling and passes -------------------------------------------------------------------
class ModelError(DpgraphError, AssertionError):
    """A ModelHelper, brew helper or optimizer was misused."""


class HelperError(ModelError, AttributeError):
    """A brew helper is unknown or registered twice."""


class ParallelizeError(DpgraphError, AssertionError):
    """Parallelize was called with inconsistent arguments or a graph it cannot replicate."""


class MissingGpuError(ParallelizeError, DeviceError):
    """Parallelize was asked for GPUs this process does not have (Caffe2 only logged; set
    DPGRAPH_ALLOW_MISSING_GPUS=1 for that)."""


class NotSupportedError(DpgraphError, NotImplementedError):
    """A feature combination dpgraph does not support; the message says what to use."""


class UntrustedInputError(DpgraphError, PermissionError):
    """A file or peer asks to run code (a pickled Python builder) the caller has not chosen
    to trust; opt in with dpgraph.ir.python_funcs.allow_untrusted_pickles() or
    DPGRAPH_TRUST_PICKLES=1 (see docs/security.md)."""


class MemongerError(DpgraphError, AssertionError):
    """Memory optimisation would change the graph's meaning."""


class CheckpointError(DpgraphError, ValueError):
    """A checkpoint file is truncated, corrupt or does not match the model."""


class OpsLibraryError(NotSupportedError, OSError):
    """``dyndep.InitOpsLibrary`` was given a Caffe2 ops library dpgraph does not provide."""


class ModelConfigError(ModelError, ValueError):
    """A model or helper got an invalid setting (storage order, dims, shapes)."""


class ModelStateError(ModelError, RuntimeError):
    """A model method was called at the wrong time (gradients added twice, no model)."""


class NotParallelizedError(ParallelizeError, AttributeError):
    """A data_parallel_model helper (RunNet, RunInitNet, GetCheckpointParams, ...) got a
    model that Parallelize never built (Caffe2 failed with AttributeError on the missing
    ``model._data_parallel_model_nets`` or ``_device_grouped_blobs``)."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (the path is a directory, not writable, ...); an
    OSError like the underlying failure, and nothing is left at the target path."""


# --- collectives ---------------------------------------------------------------------------
class CollectiveError(DpgraphError, RuntimeError):
    """A collective operation failed or was set up inconsistently across ranks."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective did not complete within its timeout (a peer died or never joined)."""


class RendezvousError(CollectiveError):
    """The rendezvous description is incomplete or ranks disagree about it."""


class CollectiveMismatchError(CollectiveError):
    """Ranks would issue different collectives (order, blobs, shapes, dtypes or reduction);
    raised on every rank, naming the first differing collective and the ranks that differ."""


class MissingDependencyError(DpgraphError, ImportError):
    """An optional dependency is not installed; the message says what to install."""


# --- data input and persistence ------------------------------------------------------------
class DBError(DpgraphError, RuntimeError):
    """A database could not be opened, read or written (missing path, wrong type, closed);
    the message names the DB type, the path and, where there is one, the key."""


class CorruptDataError(DBError, ValueError):
    """A file or record is truncated, corrupt or of the wrong type (a DB file, a serialized
    blob, a checkpoint); the message names the file, the key and the blob."""


class SerializationError(DpgraphError, ValueError):
    """A blob could not be serialized or deserialized (unsupported dtype, bad TensorProto)."""


class DataInputError(DpgraphError, RuntimeError):
    """A data input pipeline failed (a fetcher raised, an image could not be decoded, a
    worker stopped); the message names the input source and the blob."""


class ResourceLimitError(DpgraphError, MemoryError):
    """A file or message declares more than the configured limit allows (a huge tensor, a
    deeply nested structure); refused before any memory is allocated."""


class CommandError(DpgraphError, RuntimeError):
    """A ``dpgraph`` command-line subcommand failed on its input (unreadable or wrong file)."""


# --- export --------------------------------------------------------------------------------
class ExportError(DpgraphError, ValueError):
    """A net could not be exported (unsupported ops, missing parameter values)."""


def did_you_mean(name: str, candidates: Iterable[str], limit: int = 5) -> str:
    """Return a " Did you mean: a, b?" suffix for an unknown ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(candidates), n=limit, cutoff=0.6)
    return f" Did you mean: {', '.join(close)}?" if close else ""
