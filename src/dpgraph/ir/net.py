"""The :class:`Net` builder: a live NetDef plus Caffe2's op-creation conveniences."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from dpgraph.errors import BlobNotFoundError, GradientError, NetError
from dpgraph.ir.arguments import MakeArgument
from dpgraph.ir.blob import BlobReference, ScopedBlobReference, ScopedName, blob_name
from dpgraph.ir.device import DeviceOption, IsGPUDeviceType
from dpgraph.ir.operator import fill_operator, rectified_names
from dpgraph.ir.python_funcs import python_op_arguments
from dpgraph.ir.registry import NET_EXTENSIONS, OPERATORS
from dpgraph.proto import caffe2_pb2

#: ``{net name: {op index: [(file, line, function), ...] most recent first}}`` (Caffe2's
#: layout), shown when an op fails.
operator_tracebacks: defaultdict[str, dict[int, list[tuple[str, int, str]]]] = \
    defaultdict(dict)

_names_lock = threading.Lock()
_used_net_names: set[str] = set()


#: Callables returning a prefix for new net names (Caffe2: the current NetBuilder's name);
#: dpgraph.jobs.net_builder installs one.
NET_NAME_PREFIXES: list[Callable[[], str]] = []


def _unique_net_name(name: str) -> str:
    """``[prefix/]name``, or with ``_1``, ``_2``, ... if a net of that name already exists."""
    prefix = "/".join(p for p in (f() for f in NET_NAME_PREFIXES) if p)
    base = "/".join(x for x in (prefix, name) if x)
    with _names_lock:
        candidate, index = base, 0
        while candidate in _used_net_names:
            index += 1
            candidate = f"{base}_{index}"
        _used_net_names.add(candidate)
        return candidate


def _next_blob_index(net_name: str, proto: caffe2_pb2.NetDef) -> int:
    """One more than the largest N of ``<net>_blob_N`` names already in the net."""
    prefix = net_name + "_blob_"
    best = -1
    for op in proto.op:
        for name in list(op.input) + list(op.output):
            if name.startswith(prefix) and name[len(prefix):len(prefix) + 1].isdigit():
                best = max(best, int(name[len(prefix)]))
    return best + 1


class Net:
    """A network under construction; ``Proto()`` is the live NetDef of record."""

    def __init__(self, name_or_proto: str | caffe2_pb2.NetDef | Net, inplace: bool = False) -> None:
        if isinstance(name_or_proto, Net):
            name_or_proto = name_or_proto.Proto()
        if isinstance(name_or_proto, caffe2_pb2.NetDef):
            if inplace:
                self._net = name_or_proto
            else:
                self._net = caffe2_pb2.NetDef()
                self._net.CopyFrom(name_or_proto)
            self._net.name = _unique_net_name(self._net.name)
        elif isinstance(name_or_proto, (str, bytes)):
            name = name_or_proto.decode() if isinstance(name_or_proto, bytes) else name_or_proto
            self._net = caffe2_pb2.NetDef(name=_unique_net_name(name))
        else:
            raise NetError(
                f"Net() takes a name or a NetDef, got {type(name_or_proto).__name__}."
            )
        self._next_name_index = _next_blob_index(self._net.name, self._net)
        self._registered_blob_names: set[str] = set()
        self._attr_dict: defaultdict[str, list[Any]] = defaultdict(list)
        self._input_record: Any = None
        self._output_record: Any = None
        self._recreate_lookup_tables = True
        self._op_outputs: set[str] = set()
        self._external_input_map: set[str] = set()

    # --- identity ----------------------------------------------------------------------
    def Name(self) -> str:
        return self._net.name

    def __str__(self) -> str:
        return self.Name()

    def __repr__(self) -> str:
        return f"Net({self.Name()!r}, {len(self._net.op)} ops)"

    def Proto(self) -> caffe2_pb2.NetDef:
        """The live NetDef; callers may mutate it."""
        self._recreate_lookup_tables = True
        return self._net

    def proto_for_reading(self) -> caffe2_pb2.NetDef:
        """The live NetDef for code that only reads it: unlike :meth:`Proto` it keeps the
        blob lookup tables valid (no rescan of the whole net at the next op).  Never
        mutate it; use :meth:`Proto` for that."""
        return self._net

    def _lookup(self) -> None:
        if self._recreate_lookup_tables:
            self._op_outputs = {o for op in self._net.op for o in op.output}
            self._external_input_map = set(self._net.external_input)
            self._recreate_lookup_tables = False

    # --- blob queries ------------------------------------------------------------------
    def BlobIsDefined(self, blob: Any) -> bool:
        self._lookup()
        name = str(blob)
        return name in self._op_outputs or name in self._external_input_map

    def is_external_input(self, blob: Any) -> bool:
        self._lookup()
        return str(blob) in self._external_input_map

    def UsesBlob(self, blob: Any) -> bool:
        name = str(blob)
        return name in self._net.external_input or any(name in op.input for op in self._net.op)

    def UsedBlobNames(self) -> set[str]:
        names = set(self._net.external_input) | set(self._net.external_output)
        for op in self._net.op:
            names.update(op.input)
            names.update(op.output)
        return names

    def GetBlobRef(self, blob_name_: Any) -> BlobReference:
        name = str(blob_name_)
        if not self.BlobIsDefined(name):
            raise BlobNotFoundError(f"Net {self.Name()!r} does not define blob {name!r}.")
        return BlobReference(name, self)

    # --- automatic names ---------------------------------------------------------------
    def NextName(self, prefix: str | None = None, output_id: int | None = None) -> str:
        """An unused name: ``<net>_blob_<N>``, or ``<net>/<prefix>[_k][:<output_id>]``."""
        if prefix is None:
            name = f"{self._net.name}_blob_{self._next_name_index}"
            self._next_name_index += 1
            return name
        base = f"{self._net.name}/{prefix}"
        suffix = "" if output_id is None else f":{output_id}"
        name, index = base + suffix, 2
        while self.BlobIsDefined(ScopedName(name)):
            name, index = f"{base}_{index}{suffix}", index + 1
        return name

    def NextBlob(self, prefix: str = "unnamed") -> BlobReference:
        """``prefix`` if unused, else ``prefix_auto_<k>``; the result is reserved."""
        name, index = prefix, 0
        while name in self._registered_blob_names or self.BlobIsDefined(name):
            name, index = f"{prefix}_auto_{index}", index + 1
        self._registered_blob_names.add(name)
        return BlobReference(name)

    def NextScopedBlob(self, prefix: str = "unnamed") -> BlobReference:
        return self.NextBlob(ScopedName(prefix))

    # --- external inputs and outputs ---------------------------------------------------
    def AddExternalInput(self, *inputs: Any) -> BlobReference | list[BlobReference]:
        """Declare external inputs; each must be new to the net."""
        if not inputs:
            raise NetError("AddExternalInput needs at least one input.")
        # Caffe2 returns unbound references here (its _get_blob_ref never passes the net).
        names = [_external_input_name(i) for i in inputs]
        refs = [BlobReference(n) for n in names]
        self._lookup()
        for name in names:
            if name in self._external_input_map or names.count(name) > 1:
                raise NetError(f"Net already contains an input named {name}")
        self._net.external_input.extend(names)
        self._external_input_map.update(names)  # keep the tables valid: no O(net) rescan
        return refs[0] if len(refs) == 1 else refs

    AddExternalInputs = AddExternalInput

    def AddScopedExternalInputs(self, *inputs: Any) -> list[BlobReference]:
        result = self.AddExternalInput(*[ScopedBlobReference(blob_name(i)) for i in inputs])
        return result if isinstance(result, list) else [result]

    def AddExternalOutput(self, *outputs: Any) -> None:
        """Declare external outputs; each must be a BlobReference defined in the net."""
        for output in outputs:
            if not isinstance(output, BlobReference):
                raise NetError(
                    f"AddExternalOutput takes BlobReferences, got {type(output).__name__} "
                    f"{output!r}; use net.GetBlobRef(name)."
                )
            if not self.BlobIsDefined(output):
                raise NetError(f"{output} is not defined in net {self.Name()!r}.")
        self._net.external_output.extend(str(o) for o in outputs)

    AddExternalOutputs = AddExternalOutput

    def AddScopedExternalOutputs(self, *outputs: Any) -> list[BlobReference]:
        refs = [ScopedBlobReference(blob_name(o)) for o in outputs]
        self.AddExternalOutput(*refs)
        return refs

    @property
    def external_inputs(self) -> list[BlobReference]:
        return [BlobReference(n) for n in self._net.external_input]

    @property
    def external_outputs(self) -> list[BlobReference]:
        return [BlobReference(n) for n in self._net.external_output]

    # --- op creation -------------------------------------------------------------------
    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        if op_type.startswith("__") or op_type.startswith("_"):
            raise AttributeError(op_type)
        OPERATORS.require_method(op_type)
        if op_type not in _NET_ATTRIBUTES and not any(
                op_type in vars(klass) for klass in type(self).__mro__):
            setattr(Net, op_type, _OpMethod(op_type))  # found directly from now on
        return functools.partial(self._CreateAndAddToSelf, op_type)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(OPERATORS.types()))

    def _auto_outputs(self, op_type: str, outputs: Any) -> Any:
        if outputs is None:
            return self.NextName(prefix=op_type)
        if isinstance(outputs, int) and not isinstance(outputs, bool):
            return [self.NextName(prefix=op_type, output_id=i) for i in range(outputs)]
        return outputs

    def _CreateAndAddToSelf(self, op_type: str, inputs: Any, outputs: Any = None,
                            **kwargs: Any) -> Any:
        """Create an op, declare unknown inputs external, append it, return its outputs.

        The op is built in place at the end of the NetDef (no copy); when building it or
        checking its inputs raises, it is removed again and nothing else has changed.
        """
        input_names = rectified_names(inputs)
        if outputs is None or isinstance(outputs, int):
            outputs = self._auto_outputs(op_type, outputs)
        output_names = rectified_names(outputs)
        refs = [BlobReference(name, self) for name in output_names]
        self._lookup()  # fresh tables now: the new op's outputs are not in them yet
        ops = self._net.op
        op = ops.add()
        try:
            fill_operator(op, op_type, input_names, output_names, **kwargs)
            external = self._new_external_inputs(inputs, input_names)
        except BaseException:
            del ops[-1]
            raise
        if external:  # new and distinct by construction: AddExternalInput's checks hold
            self._net.external_input.extend(external)
            self._external_input_map.update(external)
        self._op_outputs.update(output_names)
        operator_tracebacks[self._net.name][len(ops) - 1] = _creation_stack()
        if not refs:
            return None
        return refs[0] if len(refs) == 1 else tuple(refs)

    def _new_external_inputs(self, inputs: Any, names: list[str]) -> list[str]:
        """The input names this net does not define yet (each once), which become external;
        a reference bound to this net must be defined."""
        blobs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        new: list[str] = []
        for blob, name in zip(blobs, names):
            if name in self._op_outputs or name in self._external_input_map or name in new:
                continue
            if isinstance(blob, BlobReference) and blob.Net() is self:
                raise NetError(f"Blob {blob} claims to come from this net but is undefined.")
            new.append(name)
        return new

    def _ExtendOps(self, new_ops: Iterable[caffe2_pb2.OperatorDef]) -> None:
        new_ops = list(new_ops)
        self._net.op.extend(new_ops)
        if not self._recreate_lookup_tables:
            update = self._op_outputs.update
            for op in new_ops:
                update(op.output[:])

    extend_ops = _ExtendOps

    def extend_ops_in_place(self, fill: Callable[[Any], None], outputs: Iterable[str]) -> None:
        """As :meth:`extend_ops`, for the ops ``fill(ops)`` appends to this net's op list
        itself (``ops.add()`` and writes: no standalone op, no copy); ``outputs`` are their
        output names.  If ``fill`` raises, the ops it added are removed."""
        ops = self._net.op
        start = len(ops)
        try:
            fill(ops)
        except BaseException:
            del ops[start:]
            raise
        if not self._recreate_lookup_tables:
            self._op_outputs.update(outputs)

    def add_op(self, **fields: Any) -> caffe2_pb2.OperatorDef:
        """Append ``OperatorDef(**fields)`` built in place in the NetDef (no copy, unlike
        :meth:`extend_ops`) and return it.  Its inputs are not declared external: check
        them with :meth:`BlobIsDefined` and :meth:`AddExternalInput` first, as
        ``net.<Op>(...)`` does."""
        op = self._net.op.add(**fields)
        if not self._recreate_lookup_tables:
            self._op_outputs.update(op.output)
        return op

    def append_op(self, fill: Callable[..., None], inputs: Sequence[str],
                  outputs: Sequence[str], *fill_args: Any) -> caffe2_pb2.OperatorDef:
        """Append an op that ``fill(op, *fill_args)`` writes in place (no copy, nothing read
        back from the proto); ``inputs`` and ``outputs`` are the names it writes.  As for
        ``extend_ops`` after declaring each undefined input external (in order, once),
        and atomic: if ``fill`` raises, the op is removed and nothing has changed."""
        self._lookup()  # fresh tables now: the new op's outputs are not in them yet
        ops = self._net.op
        op = ops.add()
        try:
            fill(op, *fill_args)
        except BaseException:
            del ops[-1]
            raise
        defined, external = self._op_outputs, self._external_input_map
        new: list[str] = []
        for name in inputs:
            if name not in defined and name not in external and name not in new:
                new.append(name)
        if new:
            self._net.external_input.extend(new)
            external.update(new)
        defined.update(outputs)
        return op

    def append_ops_like(self, template: caffe2_pb2.OperatorDef,
                        outputs: Sequence[Sequence[str]],
                        device_ids: Sequence[int] | None = None) -> None:
        """Append one copy of ``template`` per entry of ``outputs``, writing those outputs
        (and, with ``device_ids``, on that device id): what :meth:`append_op` of each
        would make, in one go (the template's undefined inputs are declared external
        once, before the first copy, as the first ``append_op`` would; the others then
        declare nothing)."""
        self._lookup()
        defined, external = self._op_outputs, self._external_input_map
        new: list[str] = []
        for name in template.input:
            if name not in defined and name not in external and name not in new:
                new.append(name)
        ops = self._net.op
        start = len(ops)
        try:
            for index, names in enumerate(outputs):
                op = ops.add()
                op.CopyFrom(template)
                op.output[:] = names
                if device_ids is not None:
                    op.device_option.device_id = device_ids[index]
        except BaseException:
            del ops[start:]
            raise
        if new and start < len(ops):
            self._net.external_input.extend(new)
            external.update(new)
        for names in outputs:
            defined.update(names)

    # --- whole-net transformations -----------------------------------------------------
    def Clone(
        self,
        name: str,
        blob_remap: dict[Any, Any] | None = None,
        op_id_mask: Sequence[int] | None = None,
        remap_funcs: dict[str, Callable[..., Any]] | None = None,
        keep_schema: bool = True,
        update_external_list: bool = False,
    ) -> Net:
        """A copy named ``name`` with blobs renamed through ``blob_remap`` and only the
        ops of ``op_id_mask`` (in mask order)."""
        remap = {str(k): str(v) for k, v in (blob_remap or {}).items()}
        remap_funcs = {**DEFAULT_REMAP_FUNCS, **(remap_funcs or {})}

        def rename(blob: str) -> str:
            return remap.get(blob, blob)

        proto = caffe2_pb2.NetDef()
        proto.CopyFrom(self._net)
        proto.name = name
        mask = range(len(self._net.op)) if op_id_mask is None else op_id_mask
        del proto.op[:]
        for index in mask:
            op = proto.op.add()
            op.CopyFrom(self._net.op[index])
            _rename_op(op, rename)
            if op.type in remap_funcs:
                remap_funcs[op.type](op, name + "/" if name else "", remap)
        for field in ("external_input", "external_output"):
            renamed = [rename(b) for b in getattr(proto, field)]
            del getattr(proto, field)[:]
            getattr(proto, field).extend(renamed)
        if update_external_list:
            _recompute_externals(proto)
        new_net = Net(proto, inplace=True)
        if keep_schema:
            new_net._input_record = _renamed_record(self._input_record, new_net, rename)
            new_net._output_record = _renamed_record(self._output_record, new_net, rename)
        new_net._attr_dict = defaultdict(list, {k: list(v) for k, v in self._attr_dict.items()})
        return new_net

    def ClonePartial(self, name: str, inputs: Sequence[Any], outputs: Sequence[Any],
                     remap_funcs: dict[str, Callable[..., Any]] | None = None
                     ) -> tuple[Net, list[BlobReference]]:
        """The subgraph computing ``outputs`` from ``inputs``.

        Blobs the subgraph defines get the ``name/`` prefix; the inputs and blobs it reads
        without defining keep their names and become its external inputs.
        """
        from dpgraph.ir.analysis import get_op_ids_in_path, get_ssa, get_undefined_blobs

        input_map = {str(k): str(v) for k, v in _input_pairs(inputs)}
        for output in outputs:
            if not self.BlobIsDefined(output):
                raise NetError(f"{output} is not defined in net {self.Name()!r}")
        input_names = list(input_map)
        output_names = [str(o) for o in outputs]
        ssa, blob_versions = get_ssa(self._net, dict.fromkeys(input_names, 0))
        used = get_op_ids_in_path(ssa, blob_versions, input_names, output_names)
        disallowed = get_op_ids_in_path(ssa, blob_versions, [], input_names)
        if set(used) & set(disallowed):
            raise NetError(
                f"Cannot partially clone net {self.Name()!r}: some of the ops required would "
                f"generate the given inputs {input_names}.")
        undefined = get_undefined_blobs([ssa[i] for i in used]) - set(input_names)
        prefix = name + "/" if name else ""
        mapping = {b: input_map[b] if b in input_map else b if b in undefined else prefix + b
                   for b in blob_versions}
        new_net = self.Clone(name, mapping, used, remap_funcs)
        new_inputs = [mapping[i] for i in input_names] + sorted(undefined)
        new_outputs = [mapping[o] for o in output_names]
        proto = new_net._net
        del proto.external_input[:]
        proto.external_input.extend(new_inputs)
        del proto.external_output[:]
        proto.external_output.extend(new_outputs)
        new_net._recreate_lookup_tables = True
        return new_net, [new_net.GetBlobRef(o) for o in new_outputs]

    def AppendNet(self, net: Net | caffe2_pb2.NetDef,
                  device_option: caffe2_pb2.DeviceOption | None = None) -> Net:
        """Append another net's ops (and its externals this net lacks)."""
        other = net.Proto() if isinstance(net, Net) else net
        self._lookup()
        for blob in other.external_input:
            if blob not in self._external_input_map and blob not in self._op_outputs:
                self._net.external_input.append(blob)
                self._external_input_map.add(blob)
        for blob in other.external_output:
            if blob not in self._net.external_output:
                self._net.external_output.append(blob)
        new_ops = []
        for op in other.op:
            copy = caffe2_pb2.OperatorDef()
            copy.CopyFrom(op)
            if device_option is not None:
                _place_with_step_nets(copy, device_option)
            new_ops.append(copy)
        self._ExtendOps(new_ops)
        return self

    def AddArgument(self, arg_name: str, arg_value: Any) -> None:
        self._net.arg.extend([MakeArgument(arg_name, arg_value)])

    def add_attribute(self, name: str, obj: Any) -> None:
        self._attr_dict[name].append(obj)

    def get_attributes(self, name: str) -> list[Any]:
        return self._attr_dict.get(name, [])

    def set_rand_seed(self, seed: int = 100, sequence_seed: bool = True,
                      seed_on_op_def: bool = False) -> None:
        """Give every op a random seed (the same one, or seed+index with sequence_seed)."""
        for index, op in enumerate(self._net.op):
            op.device_option.random_seed = seed + index if sequence_seed else seed

    def Const(self, array: Any, blob_out: Any = None, dtype: Any = None) -> BlobReference:
        """A fill op holding ``array`` (GivenTensor*Fill, or ConstantFill for a bool)."""
        if isinstance(array, bool):
            return self.ConstantFill([], blob_out or 1, dtype=caffe2_pb2.TensorProto.BOOL,
                                     value=array)
        array = np.asarray(array, dtype=dtype)
        fills = {np.dtype(np.int32): "GivenTensorIntFill",
                 np.dtype(np.int64): "GivenTensorInt64Fill",
                 np.dtype(np.bool_): "GivenTensorBoolFill"}
        values: list[Any]
        if array.dtype.kind in "USO":
            op_type, values = "GivenTensorStringFill", [str(v) for v in array.flatten()]
        else:
            op_type = fills.get(array.dtype, "GivenTensorFill")
            values = array.flatten().tolist()
            if op_type == "GivenTensorFill":
                values = [float(v) for v in values]
        return getattr(self, op_type)([], blob_out or 1, shape=list(array.shape), values=values)

    def RunAllOnGPU(self, gpu_id: int = 0, use_cudnn: bool = False) -> None:
        """Put the whole net on GPU ``gpu_id`` (and its RecurrentNetwork step nets)."""
        from dpgraph.ir.device import CUDA

        self._net.device_option.CopyFrom(DeviceOption(CUDA, gpu_id))
        for op in self._net.op:
            if use_cudnn:
                op.engine = "CUDNN"
            for argument in op.arg:
                if argument.name == "step_net" and argument.HasField("n"):
                    argument.n.device_option.CopyFrom(DeviceOption(CUDA, gpu_id))

    def RunAllOnIDEEP(self) -> None:
        self._net.device_option.CopyFrom(DeviceOption(caffe2_pb2.PROTO_IDEEP))

    def RunAllOnMKL(self) -> None:
        self._net.device_option.CopyFrom(DeviceOption(caffe2_pb2.PROTO_MKLDNN))

    # --- observers (on the net created in the current workspace) -------------------------
    def AddObserver(self, observer_type: str) -> Any:
        """Attach a ``"TimeObserver"`` or ``"RunCountObserver"`` to this net as created in
        the current workspace (see dpgraph.runtime.observers); returns the observer."""
        return NET_EXTENSIONS.lookup("add_observer")(self._net.name, observer_type)

    def RemoveObserver(self, observer: Any) -> None:
        NET_EXTENSIONS.lookup("remove_observer")(self._net.name, observer)

    def NumObservers(self) -> int:
        return NET_EXTENSIONS.lookup("num_observers")(self._net.name)

    # --- autodiff ----------------------------------------------------------------------
    def AddGradientOperators(self, ys: Any, skip: int = 0) -> dict[BlobReference, Any]:
        """Append the backward pass for ``ys``; return ``{blob: gradient}``."""
        backward_pass = NET_EXTENSIONS.lookup("backward_pass")  # dpgraph.autodiff's
        self._lookup()  # the net's op outputs and external inputs
        known = (self._op_outputs, self._external_input_map)
        named = ys if isinstance(ys, (list, tuple, dict)) else []  # others: the pass says why
        unknown = [blob_name(y) for y in named if all(blob_name(y) not in k for k in known)]
        if unknown:
            raise GradientError(
                f"AddGradientOperators on net {self._net.name!r}: {unknown} is neither the "
                f"output of an op of this net nor an external input; pass the loss blob(s) "
                f"the forward pass returns (e.g. the output of AveragedLoss).")
        grad_ops, input_to_grad = backward_pass(self._net.op[skip:], ys)
        self._ExtendOps(grad_ops)
        return input_to_grad

    def DeduplicateGradientSlices(self, g: Any, aggregator: str = "sum") -> Any:
        """Sum (or average) the values of repeated indices of a GradientSlice."""
        from dpgraph.ir.blob import GradientSlice

        if aggregator not in ("sum", "mean"):
            raise NetError(f"Unknown aggregator {aggregator!r}; use 'sum' or 'mean'.")
        unique, remapping = self.Unique([g.indices], 2)
        op = "UnsortedSegmentSum" if aggregator == "sum" else "UnsortedSegmentMean"
        new_values = getattr(self, op)([g.values, remapping], 1)
        return GradientSlice(indices=unique, values=new_values)

    def LogInfo(self, *msg_or_blobs: Any) -> None:
        """Print each message (a string, via a one-element string fill) or blob at run time."""
        for msg_or_blob in msg_or_blobs:
            if isinstance(msg_or_blob, BlobReference):
                blob = msg_or_blob
            else:
                blob = self.GivenTensorStringFill(
                    [], self.NextName("log"), shape=[], values=[msg_or_blob])
            self.Print(blob, [])

    def Python(self, f: Any, grad_f: Any = None, python_func_type: Any = None,
               pass_workspace: bool = False, grad_output_indices: Sequence[int] | None = None,
               grad_input_indices: Sequence[int] | None = None) -> Callable[..., Any]:
        """A builder for a ``Python`` op running ``f(inputs, outputs)`` (see ops.python_op):
        ``net.Python(f, grad_f)(inputs, outputs, **kwargs)``."""
        core_kwargs = python_op_arguments(f, grad_f, python_func_type, pass_workspace)

        def build(inputs: Any, outputs: Any = None, **kwargs: Any) -> Any:
            kwargs.update(grad_output_indices=list(grad_output_indices or []),
                          grad_input_indices=list(grad_input_indices or []), **core_kwargs)
            return self._CreateAndAddToSelf("Python", inputs, outputs, **kwargs)

        return build

    def input_record(self) -> Any:
        """The input schema record (dpgraph keeps whatever was set; usually None)."""
        return self._input_record

    def output_record(self) -> Any:
        """The output schema record (dpgraph keeps whatever was set; usually None)."""
        return self._output_record

    def _new_record(self, record: Any) -> Any:
        """A copy of schema ``record`` whose scalars are new scoped blobs of this net."""
        from dpgraph.ir.scope import NameScope

        result = record.clone_schema()
        with NameScope(self.Name()):
            names = result.field_names()
            for scalar, name in zip(result.all_scalars(), names):
                scalar.set_value(self.NextScopedBlob(name or "unnamed_scalar"), unsafe=True)
        return result

    def set_input_record(self, input_record: Any) -> Any:
        """Set the input schema record (new blobs when it has none); its blobs become
        external inputs."""
        if self._input_record is not None and not (
                input_record.has_blobs() and set(input_record.field_blobs())
                == set(self._input_record.field_blobs())):
            raise NetError(f"Net {self.Name()!r}: input schema cannot be reset")
        self._input_record = (input_record if input_record.has_blobs()
                              else self._new_record(input_record))
        for blob in self._input_record.field_blobs():
            if not self.is_external_input(blob):
                self.AddExternalInput(blob)
        return self._input_record

    def set_output_record(self, record: Any) -> None:
        """Set the output schema record; its blobs must be defined and become external
        outputs."""
        if self._output_record is not None:
            raise NetError(f"Net {self.Name()!r}: output record cannot be reset")
        for blob in record.field_blobs():
            if not self.BlobIsDefined(blob):
                raise NetError(f"{blob} is not defined in net {self.Name()!r}; produce it "
                               "before setting the output record")
        for blob in record.field_blobs():
            if str(blob) not in self._net.external_output:
                self.AddExternalOutput(BlobReference(str(blob)))
        self._output_record = record

    def AppendOutputRecordField(self, field_name: str, record: Any) -> None:
        """Add ``record`` as field ``field_name`` of the output record (which must exist);
        its blobs must be defined and become external outputs."""
        if self._output_record is None:
            raise NetError(f"Net {self.Name()!r}: tried to append to a missing output record; "
                           "set one with set_output_record first")
        for blob in record.field_blobs():
            if not self.BlobIsDefined(blob):
                raise NetError(f"{blob} is not defined in net {self.Name()!r}")
        for blob in record.field_blobs():
            if str(blob) not in self._net.external_output:
                self.AddExternalOutput(BlobReference(str(blob)))
        struct = type(self._output_record)  # schema.Struct (ir does not import jobs)
        self._output_record = self._output_record + struct((field_name, record))

    def has_input_record(self) -> bool:
        return self._input_record is not None

    def has_output_record(self) -> bool:
        return self._output_record is not None

    def _CheckLookupTables(self) -> None:
        """Caffe2's test hook: the blob lookup tables cover the proto's op outputs and
        external inputs."""
        self._lookup()
        missing = ({o for op in self._net.op for o in op.output} - self._op_outputs) | (
            set(self._net.external_input) - self._external_input_map)
        if missing:
            raise NetError(f"net {self.Name()!r}: lookup tables miss {sorted(missing)}")

    def PopulateProtoWithFileName(self) -> None:
        """Name each op ``file:line:function`` after the code that created it (Caffe2)."""
        stacks = operator_tracebacks.get(self.Name(), {})
        for index, op in enumerate(self._net.op):
            if stacks.get(index):
                op.name = ":".join(map(str, stacks[index][0]))

    def insert_op_at_idx(self, op: caffe2_pb2.OperatorDef, op_idx: int) -> None:
        """Insert ``op`` before op ``op_idx`` (the external lists stay as they are)."""
        if op_idx < 0:
            raise NetError(f"insert_op_at_idx: index {op_idx} of net {self.Name()!r} is "
                           "negative")
        tail = []
        for old in self._net.op[op_idx:]:
            copy = caffe2_pb2.OperatorDef()
            copy.CopyFrom(old)
            tail.append(copy)
        del self._net.op[op_idx:]
        self._net.op.extend([op, *tail])
        self._recreate_lookup_tables = True

    def reroute_tensor(self, tensor: Any, new_producer: caffe2_pb2.OperatorDef,
                       can_modify: Any = None) -> int:
        """Insert ``new_producer`` (which reads ``tensor``) right after ``tensor``'s producer
        and make the ops of ``can_modify`` read its first output instead; returns how many
        ops were rerouted (Caffe2; assumes no in-place blob)."""
        tensor = str(tensor)
        if tensor in self._net.external_input:
            index = -1
        else:
            if tensor not in new_producer.input:
                raise NetError(f"new producer {new_producer.type} is not taking in {tensor}")
            index = next((i for i, op in enumerate(self._net.op) if tensor in op.output), -2)
        self.insert_op_at_idx(new_producer, index + 1)
        new_tensor = new_producer.output[0]
        if tensor in self._net.external_output:
            renamed = [new_tensor if b == tensor else b for b in self._net.external_output]
            del self._net.external_output[:]
            self._net.external_output.extend(renamed)
        count = 0
        for op in self._net.op if can_modify else ():
            if op in can_modify:
                remap_input(op, {tensor: new_tensor})
                count += 1
        return count

    def IsGPU(self) -> bool:
        return IsGPUDeviceType(self._net.device_option.device_type)


#: ``Net``'s own attributes, installed op methods included (``Net.__dict__``).
_NET_ATTRIBUTES = vars(Net)


class _OpMethod:
    """``net.<op_type>`` once an op type was used: a class attribute, so the lookup does not
    fail first (a failed lookup makes an AttributeError, ~1 us, before ``__getattr__``
    runs).  Behaves as ``Net.__getattr__``: the op type must still be registered, an
    instance attribute of the same name wins, and the class itself has no such attribute."""

    __slots__ = ("op_type",)

    def __init__(self, op_type: str) -> None:
        self.op_type = op_type

    def __get__(self, net: Net | None, owner: type | None = None) -> Callable[..., Any]:
        if net is None:
            raise AttributeError(f"type object 'Net' has no attribute {self.op_type!r}")
        OPERATORS.require_method(self.op_type)
        return functools.partial(net._CreateAndAddToSelf, self.op_type)


#: ``{(id(code), instruction offset): ((file, line, function), code)}``: one frame entry per
#: call site, shared by every stack through it (computing a frame's line scans its code's
#: line table, and the same sites recur for every op a builder makes).  The code object is
#: kept alive by its entry, so its id is not reused while the entry exists.  Bounded.
_SITES: dict[tuple[int, int], tuple[tuple[str, int, str], Any]] = {}
_SITES_LIMIT = 1 << 16

#: Per thread: the frames of :class:`shared_creation_stack` blocks now running, innermost
#: last, each with the entries of its callers (fixed while the frame runs).
_ROOTS = threading.local()
_SUSPENDABLE = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                | inspect.CO_ITERABLE_COROUTINE)


def _site(frame: Any) -> tuple[str, int, str]:
    code = frame.f_code
    site = (id(code), frame.f_lasti)
    known = _SITES.get(site)
    if known is None or known[1] is not code:
        if len(_SITES) > _SITES_LIMIT:
            _SITES.clear()
        known = _SITES[site] = ((code.co_filename, frame.f_lineno, code.co_name), code)
    return known[0]


class shared_creation_stack:  # noqa: N801 (used like a function: ``with ...():``)
    """Within this block, ops record the creation stack of the frame running it without
    walking that frame's callers again for every op: their entries are read once, on
    entry (a running frame's callers and their lines cannot change until it returns).
    The recorded stacks are the same; only building them is cheaper.  Parallelize's
    pass driver runs each pass in one (builders make thousands of ops per pass)."""

    __slots__ = ("_frame",)

    def __enter__(self) -> None:
        frame = sys._getframe(1)
        if frame.f_code.co_flags & _SUSPENDABLE:
            self._frame = None  # resumable elsewhere: its callers may change
            return
        self._frame = frame
        roots = _ROOTS.__dict__.setdefault("stack", [])
        roots.append((frame, _walk(frame.f_back)))  # (cheap when nested: stops at the root)

    def __exit__(self, *exc: Any) -> None:
        if self._frame is not None:
            roots = _ROOTS.stack
            if roots and roots[-1][0] is self._frame:
                roots.pop()
            self._frame = None


def _creation_stack() -> list[tuple[str, int, str]]:
    """Caffe2's ``_extract_stacktrace``: ``(file, line, function)`` of each caller frame,
    most recent first, read from the frames alone (no source file access)."""
    frame: Any = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return _walk(frame)


def _walk(frame: Any) -> list[tuple[str, int, str]]:
    """The entries of ``frame`` and its callers, up to the innermost shared root."""
    roots = _ROOTS.__dict__.get("stack")
    root, above = roots[-1] if roots else (None, [])
    result: list[tuple[str, int, str]] = []
    append, sites = result.append, _SITES
    while frame is not None:
        code = frame.f_code
        known = sites.get((id(code), frame.f_lasti))
        append(known[0] if known is not None and known[1] is code else _site(frame))
        if frame is root:
            result += above
            break
        frame = frame.f_back
    return result


def _rename_op(op: caffe2_pb2.OperatorDef, rename: Callable[[str], str]) -> None:
    for field in ("input", "output", "control_input"):
        renamed = [rename(b) for b in getattr(op, field)]
        del getattr(op, field)[:]
        getattr(op, field).extend(renamed)


def _recompute_externals(proto: caffe2_pb2.NetDef) -> None:
    """Caffe2's ``update_external_list``: external inputs are the op inputs no earlier op
    writes; external outputs are the op outputs no later op reads (in op order, as Caffe2
    lists them)."""
    produced: set[str] = set()
    used: set[str] = set()
    inputs: list[str] = []
    for op in proto.op:
        for blob in op.input:
            if blob in produced:
                used.add(blob)
            else:
                inputs.append(blob)
        produced.update(op.output)
    del proto.external_input[:]
    proto.external_input.extend(inputs)
    del proto.external_output[:]
    proto.external_output.extend(o for op in proto.op for o in op.output if o not in used)


def _input_pairs(inputs: Any) -> list[tuple[Any, Any]]:
    """``ClonePartial``'s inputs as (name, new name) pairs: a mapping, a list of pairs, or
    names kept as they are."""
    if isinstance(inputs, Mapping):
        return list(inputs.items())
    if isinstance(inputs, list) and all(isinstance(i, tuple) and len(i) == 2 for i in inputs):
        return list(inputs)
    return [(i, i) for i in inputs]


def remap_input(op: caffe2_pb2.OperatorDef, blob_name_remapping: dict[str, str]) -> None:
    """Caffe2's ``core.remap_input``: rename ``op``'s inputs through the mapping."""
    renamed = [blob_name_remapping.get(b, b) for b in op.input]
    del op.input[:]
    op.input.extend(renamed)


def clone_and_bind_net(net: Net, name: str, prefix: str,
                       blob_remap: dict[str, str] | None = None, inputs: Any = None,
                       keep_schema: bool = True) -> tuple[Net, dict[str, str]]:
    """Clone ``net`` as ``name``, prefixing every blob it defines with ``prefix``.

    Blobs the net reads before writing keep their names.  ``inputs`` (a schema record with
    the field names of the net's input record) binds those fields to its blobs; without
    ``keep_schema`` it becomes the clone's input record.  Returns ``(clone, blob_remap)``.
    """
    from dpgraph.ir.analysis import get_ssa, get_undefined_blobs

    blob_remap = {} if blob_remap is None else blob_remap
    if inputs is not None:
        _bind_inputs(net, inputs, blob_remap)
    ssa, blob_versions = get_ssa(net.Proto())
    undefined = get_undefined_blobs(ssa)
    for blob in blob_versions:
        if blob not in blob_remap:
            blob_remap[blob] = blob if blob in undefined else prefix + blob
    for blob in undefined:
        blob_remap.setdefault(blob, blob)
    cloned = net.Clone(name, blob_remap, keep_schema=keep_schema)
    if not keep_schema and inputs is not None:
        cloned.set_input_record(inputs)
    return cloned, blob_remap


def _bind_inputs(net: Net, inputs: Any, blob_remap: dict[str, str]) -> None:
    """Map each blob of ``net``'s input record to the blob of the same field in ``inputs``."""
    original = net.input_record()
    if original is None:
        raise NetError(f"clone_and_bind_net(inputs=...): net {net.Name()!r} has no input "
                       "record to bind; set one with net.set_input_record first.")
    differ = set(original.field_names()) ^ set(inputs.field_names())
    if differ:
        raise NetError(f"clone_and_bind_net: the fields of inputs and of net {net.Name()!r}'s "
                       f"input record differ: {sorted(differ)}")
    by_field = dict(zip(original.field_names(), original.field_blobs()))
    for field, blob in zip(inputs.field_names(), inputs.field_blobs()):
        blob_remap[str(by_field[field])] = str(blob)


def _renamed_record(record: Any, net: Net, rename: Callable[[str], str]) -> Any:
    """A copy of schema ``record`` whose blobs are renamed and bound to ``net`` (what
    Caffe2's ``Clone(keep_schema=True)`` keeps); ``None`` stays ``None``."""
    if record is None:
        return None
    result = record.clone_schema()
    for scalar, blob in zip(result.all_scalars(), record.field_blobs()):
        scalar.set_value(BlobReference(rename(str(blob)), net=net), unsafe=True)
    return result


def _external_input_name(blob: Any) -> str:
    """Caffe2 names an external input ``str(input)``, whatever the object."""
    if isinstance(blob, (str, bytes, BlobReference)):
        return blob_name(blob, "external input")
    return str(blob)


def _place_with_step_nets(op: caffe2_pb2.OperatorDef,
                          device_option: caffe2_pb2.DeviceOption) -> None:
    """Put ``op`` (and, for RecurrentNetwork, its step nets' ops) on ``device_option``."""
    op.device_option.CopyFrom(device_option)
    if op.type != "RecurrentNetwork":
        return
    for argument in op.arg:
        if argument.name.endswith("step_net"):
            for step_op in argument.n.op:
                step_op.device_option.CopyFrom(device_option)


def recurrent_network_op_remap(op: caffe2_pb2.OperatorDef, prefix: str,
                               blob_remap: dict[str, str]) -> None:
    """Caffe2's remap for RecurrentNetwork(-Gradient) in ``Net.Clone``: every string-list
    argument element, the ``timestep`` argument and every ``*step_net`` argument (cloned
    as ``cloned_sub_net``) go through ``blob_remap``."""
    def remapped(value: bytes) -> bytes:
        name = value.decode("utf-8")
        return blob_remap.get(name, name).encode("utf-8")

    for argument in op.arg:
        if len(argument.strings) > 0:
            for i, value in enumerate(argument.strings):
                argument.strings[i] = remapped(value)
        elif argument.name == "timestep":
            argument.s = remapped(argument.s)
        elif argument.name.endswith("step_net") and argument.HasField("n"):
            cloned = Net(argument.n).Clone("cloned_sub_net", blob_remap)
            argument.n.CopyFrom(cloned.Proto())


#: Remap functions ``Net.Clone`` always applies (a caller's ``remap_funcs`` override them).
def control_op_remap(op: caffe2_pb2.OperatorDef, prefix: str,
                     blob_remap: dict[str, str]) -> None:
    """Caffe2's remap for If/AsyncIf (``then_net``, ``else_net``) and While (``loop_net``,
    ``cond_net``) in ``Net.Clone``: the nested nets are cloned through ``blob_remap``."""
    names = ("then_net", "else_net") if op.type in ("If", "AsyncIf") else ("loop_net",
                                                                           "cond_net")
    for argument in op.arg:
        if argument.name in names:
            if not argument.HasField("n"):
                raise NetError(f"Expected non empty net in {op.type}'s {argument.name} "
                               "argument")
            subnet = Net(argument.n)
            remapped = subnet.Clone(name=subnet.Name() + "_remapped", blob_remap=blob_remap)
            argument.n.CopyFrom(remapped.Proto())


DEFAULT_REMAP_FUNCS: dict[str, Callable[..., Any]] = {
    "RecurrentNetwork": recurrent_network_op_remap,
    "RecurrentNetworkGradient": recurrent_network_op_remap,
    "If": control_op_remap,
    "AsyncIf": control_op_remap,
    "While": control_op_remap,
}
