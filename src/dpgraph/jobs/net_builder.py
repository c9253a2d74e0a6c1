"""Caffe2's ``net_builder``: build nets and execution steps with Python blocks.

Inside ``with NetBuilder():`` (or a Task), ``ops.<Op>(...)`` adds an operator to the current
net; ``ops.loop``, ``ops.If``/``Elif``/``Else``, ``ops.stop_guard`` and ``ops.stop_if``
build execution steps that stop on a stop blob; ``ops.IfNet``/``Else`` and
``ops.WhileNet``/``Condition`` build single nets with If/While ops (control_ops_util).
"""

from __future__ import annotations

from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir import net as _ir_net
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.net import Net
from dpgraph.ir.plan import ExecutionStep, to_execution_step
from dpgraph.jobs.context import Managed
from dpgraph.jobs.control_ops_util import add_if_op, add_while_op


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise NetError(message)


#: ir.net's hook for net-name prefixes, when the IR provides it (K-requests 9): as in Caffe2,
#: nets made while a NetBuilder (or Task) is current are named ``<builder name>/<name>``.
_NET_NAME_PREFIXES = getattr(_ir_net, "NET_NAME_PREFIXES", None)


class NetBuilder(Managed):
    """A scope in which ``ops.<Op>`` adds operators; its children (nets and sub-builders)
    become an execution step with :func:`dpgraph.core.to_execution_step`."""

    def __init__(self, name: str | None = None, initial_scope: Any = None,
                 _stop_blob_required: bool = False, _stop_blob: Any = None,
                 _fullname: str | None = None, _use_control_ops: bool = False) -> None:
        parent = NetBuilder.current(required=False)
        _check(not _fullname or not name, "Cannot set both _fullname and name")
        _check(not _use_control_ops or (not _stop_blob_required and not _stop_blob),
               "Stop blobs are not used with control operators")
        self.name = _fullname or "/".join(
            n for n in (parent.name if parent else None, name) if n)
        self._frozen = False
        self._current_net: Net | None = None
        self._children: list[Any] = []
        if parent:
            parent._update_lexical_scope()
        self._init_lexical_scope = set(parent._lexical_scope) if parent else set()
        if initial_scope:
            self._init_lexical_scope |= {str(b) for b in initial_scope}
        self._lexical_scope = set(self._init_lexical_scope)
        self._stop_blob = _stop_blob
        self._stop_blob_required = _stop_blob_required
        self._use_control_ops = _use_control_ops

    def stop_blob(self) -> BlobReference:
        """The stop blob of this builder (created, and reset to False at the start of each
        run of the builder, on first use)."""
        _check(not self._use_control_ops, "Stop blobs are not used with control operators")
        if self._stop_blob is None:
            net = self.current_net()
            self._stop_blob = BlobReference(net.NextName("stop_blob"), net=net)
            net.Const(False, blob_out=self._stop_blob)
            if self._current_net is not self._children[0]:
                self._children.insert(0, Net("stop_blob_init"))
                self._children[0].Const(False, blob_out=self._stop_blob)
        return self._stop_blob

    def stop_if(self, blob: Any) -> None:
        """Stop this builder's step once ``blob`` is true; later ops go to a new net."""
        _check(not self._use_control_ops, "Stop blobs are not used with control operators")
        stop_blob = self.stop_blob()
        ops.Or([stop_blob, blob], [stop_blob])
        self._current_net = None

    def _assert_mutable(self) -> None:
        _check(not self._frozen, f"This NetBuilder ({self.name}) has been built already.")

    def _update_lexical_scope(self) -> None:
        """The blobs visible here: the initial scope plus what the children use."""
        self._lexical_scope = set(self._init_lexical_scope)
        for child in self._children:
            if isinstance(child, Net):
                self._lexical_scope |= child.UsedBlobNames()
            elif isinstance(child, NetBuilder) and child._use_control_ops:
                self._lexical_scope |= child._lexical_scope

    def _reset_children(self) -> None:
        self._current_net = None
        self._children = []
        self._lexical_scope = set(self._init_lexical_scope)

    def add(self, child: Any) -> Any:
        self._assert_mutable()
        if self._use_control_ops:
            _check(isinstance(child, Net) or (isinstance(child, NetBuilder)
                                              and child._use_control_ops),
                   "Expected Net or NetBuilder with control ops")
        self._current_net = None
        self._children.append(child)
        if isinstance(child, Net):
            self._current_net = child
        self._update_lexical_scope()
        return child

    def current_net(self, name: str | None = None) -> Net:
        """The net ops go to (a new one when there is none, or when ``name`` is given)."""
        self._assert_mutable()
        if self._current_net is None or name is not None:
            self.add(Net(name or ("" if _NET_NAME_PREFIXES is not None else "net")))
        assert self._current_net is not None
        return self._current_net

    def freeze(self) -> None:
        for child in self._children:
            if hasattr(child, "freeze"):
                child.freeze()
        self._current_net = None
        self._frozen = True

    def get(self) -> list[Any]:
        """Freeze the builder and return its children."""
        self.freeze()
        return self._children

    def __exit__(self, etype: Any, *args: Any) -> None:
        super().__exit__(etype, *args)
        if self._use_control_ops and self._children:
            children = self._children
            self._reset_children()
            merged = NetBuilder.merge_nets(children, self._lexical_scope)
            _check(merged is not None, "Expected a non-empty merge of children")
            self._children = [merged]
            self._current_net = merged
        if etype is not None:
            return
        _check(not self._stop_blob_required or self._stop_blob is not None,
               f"This NetBuilder ({self.name}) requires a stop condition to be set with "
               "`stop` or `stop_if`")

    def __str__(self) -> str:
        return self.name or "Un-named NetBuilder"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, children={self._children!r})"

    @staticmethod
    def merge_nets(nets_or_builders: list[Any], outer_blob_names: Any) -> Net | None:
        """One net from nets and control-op builders (AppendNet); external outputs are
        kept only where they are visible outside."""
        net: Net | None = None
        for item in nets_or_builders:
            if isinstance(item, NetBuilder):
                _check(item._use_control_ops,
                       "Merging of NetBuilder supported only for control ops")
                nets = item.get()
                _check(len(nets) == 1 and isinstance(nets[0], Net),
                       "Invalid control op net builder")
                current = nets[0]
            else:
                _check(isinstance(item, Net), f"Cannot merge {type(item).__name__}")
                current = item
            if net is not None:
                net.AppendNet(current)
            else:
                net = current
        if net is not None:
            proto = net.Proto()
            outputs = [o for o in proto.external_output if o in outer_blob_names]
            del proto.external_output[:]
            proto.external_output.extend(outputs)
        return net


class Operations:
    """``ops``: operators on the current net, plus the control-flow blocks."""

    def net(self, net: Any = None, name: str | None = None) -> Any:
        """Add ``net`` to the current builder, or return the current net."""
        if net is not None:
            NetBuilder.current().add(net)
            return net
        return NetBuilder.current().current_net(name=name)

    def __getattr__(self, op_type: str) -> Any:
        if op_type.startswith("__"):
            raise AttributeError(op_type)
        if NetBuilder.current(required=False) is None:
            raise AttributeError("No active NetBuilder.")
        return getattr(self.net(), op_type)

    def task_group(self) -> Any:
        from dpgraph.jobs.task import Cluster, Node, TaskGroup

        group = NetBuilder.current()
        with Cluster(), Node("local"):
            tg = TaskGroup()
            group.add(tg)
            return tg

    def stop(self) -> None:
        self.stop_if(ops.Const(True))

    def stop_if(self, stop_condition: Any) -> None:
        NetBuilder.current().stop_if(stop_condition)

    def loop(self, iters: Any = None, name: str | None = None) -> Any:
        """A block run ``iters`` times (a number or a blob), or until ``ops.stop_if``."""
        return NetBuilder.current().add(_Loop(iters, name=name))

    def stop_guard(self, has_stopped_blob: Any = None, name: str | None = None) -> Any:
        """A block run once; ``.has_stopped()`` tells whether it stopped early."""
        return NetBuilder.current().add(
            _StopGuard(has_stopped_blob=has_stopped_blob, name=name))

    def If(self, cond: Any, name: str | None = None) -> Any:
        """A block run once if ``cond`` is true (execution steps); ``.Elif``/``.Else``."""
        return NetBuilder.current().add(_RunIf(cond, name=name))

    def IfNet(self, cond: Any, name: str | None = None) -> Any:
        """A block run if ``cond`` is true, built as one net with an If op."""
        return NetBuilder.current().add(_RunIfNet(cond, name=name))

    def Else(self, name: str | None = None) -> Any:
        return _RunElseNet(name=name)

    def WhileNet(self, name: str | None = None) -> Any:
        """A loop built as one net with a While op; ``ops.Condition()`` sets its test."""
        return NetBuilder.current().add(_RunWhileNet(name=name))

    def Condition(self, name: str | None = None) -> Any:
        return _RunWhileCondition(name=name)

    def _setup(self, key: str, kind: str, name: str | None = None) -> Any:
        setup = _SetupBuilder(kind, name)
        self.net().add_attribute(key, setup)
        return setup

    def task_init(self) -> Any:
        """A block run once when the task starts."""
        return self._setup(_task_setup_key(), _SetupBuilder.INIT)

    def task_exit(self) -> Any:
        """A block run once when the task ends."""
        return self._setup(_task_setup_key(), _SetupBuilder.EXIT)

    def task_instance_init(self) -> Any:
        """A block run when each instance of the task starts (in its own workspace)."""
        return self._setup(_task_setup_key(instance=True), _SetupBuilder.INIT)

    def task_instance_exit(self) -> Any:
        return self._setup(_task_setup_key(instance=True), _SetupBuilder.EXIT)

    def local_init(self) -> Any:
        """A block run once per node before the task group's tasks."""
        return self._setup("local_setup", _SetupBuilder.INIT)

    def local_exit(self, name: str | None = None) -> Any:
        return self._setup("local_setup", _SetupBuilder.EXIT, name)

    def task_reporter(self, interval_ms: int = 1000, name: str | None = None) -> Any:
        """A block run every ``interval_ms`` while the task group runs."""
        return NetBuilder.current().add(_ReporterBuilder(interval_ms, name=name))

    def local_reporter(self, interval_ms: int = 1000, name: str | None = None) -> Any:
        """A block run every ``interval_ms`` while the current task runs."""
        return NetBuilder.current().add(_ReporterBuilder(interval_ms, net=self.net(),
                                                         name=name))


def _task_setup_key(instance: bool = False) -> str:
    return "task_instance_setup" if instance else "task_setup"


ops = Operations()


def _builder_name_prefix() -> str:
    """The current NetBuilder's name ('' outside any), Caffe2's ``Net.current_prefix``."""
    builder = NetBuilder.current(required=False)
    return builder.name if builder else ""


if _NET_NAME_PREFIXES is not None and _builder_name_prefix not in _NET_NAME_PREFIXES:
    _NET_NAME_PREFIXES.append(_builder_name_prefix)


class _ReporterBuilder(NetBuilder):
    def __init__(self, interval_ms: int, net: Any = None, name: str | None = None) -> None:
        NetBuilder.__init__(self, name)
        self._net = net
        self.interval_ms = interval_ms

    def __exit__(self, etype: Any, *args: Any) -> None:
        if etype is None:
            from dpgraph.jobs.task import Task, TaskGroup

            step = to_execution_step(self)
            step.RunEveryMillis(self.interval_ms)
            if self._net:
                self._net.add_attribute(Task.REPORT_STEP, step)
            else:
                TaskGroup.current().report_step(step, interval_ms=self.interval_ms)
        NetBuilder.__exit__(self, etype, *args)


class _SetupBuilder(NetBuilder):
    INIT = "init"
    EXIT = "exit"

    def __init__(self, type: str, name: str | None = None) -> None:
        NetBuilder.__init__(self, name)
        self.type = type

    def setup(self, net: Any) -> ExecutionStep | None:
        if self.type == _SetupBuilder.INIT:
            return to_execution_step(self)
        return None

    def exit(self, net: Any) -> ExecutionStep | None:
        if self.type == _SetupBuilder.EXIT:
            return to_execution_step(self)
        return None


class _RunOnce(NetBuilder):
    def __exit__(self, etype: Any, *args: Any) -> None:
        if etype is None and self._stop_blob is not None:
            ops.stop()
        NetBuilder.__exit__(self, etype, *args)


class _StopGuard(_RunOnce):
    def __init__(self, has_stopped_blob: Any = None, name: str | None = None) -> None:
        _RunOnce.__init__(self, name)
        self._stopped = has_stopped_blob
        self._ran = False

    def __enter__(self) -> Any:
        result = _RunOnce.__enter__(self)
        self._stopped = ops.Const(True, blob_out=self._stopped)
        return result

    def __exit__(self, etype: Any, *args: Any) -> None:
        if etype is None:
            self._ran = True
            ops.Const(False, blob_out=self._stopped)
        _RunOnce.__exit__(self, etype, *args)

    def has_stopped(self) -> Any:
        """A bool blob, True after the block ran iff it was stopped early."""
        _check(self._ran, "Context not used yet.")
        return self._stopped


class _Loop(NetBuilder):
    def __init__(self, iters: Any = None, name: str | None = None) -> None:
        NetBuilder.__init__(self, name, _stop_blob_required=True)
        if iters is not None:
            self._inc = ops.Const(1)
            self._iter = ops.Const(0)
            self._num_iters = (iters if isinstance(iters, BlobReference)
                               else ops.Const(iters))
        else:
            self._num_iters = None

    def iter(self) -> Any:
        _check(self._num_iters is not None, "This loop does not have a number of iterations.")
        return self._iter

    def __enter__(self) -> Any:
        builder = NetBuilder.__enter__(self)
        if self._num_iters is not None:
            ops.stop_if(ops.GE([self._iter, self._num_iters]))
        return builder

    def __exit__(self, etype: Any, *args: Any) -> None:
        if etype is None and self._num_iters is not None:
            self.current_net().Add([self._iter, self._inc], [self._iter])
        NetBuilder.__exit__(self, etype, *args)


class _RunIf(_RunOnce):
    def __init__(self, cond_blob: Any = None, name: str | None = None,
                 _already_ran: Any = None) -> None:
        _RunOnce.__init__(self, name)
        _check(cond_blob is not None or _already_ran is not None,
               "If needs a condition blob")
        self._is_else = cond_blob is None
        if _already_ran is None:
            self._else_blob = ops.Not(cond_blob)
            self._already_ran = ops.Const(False)
        else:
            self._already_ran = _already_ran
            self._else_blob = (_already_ran if cond_blob is None
                               else ops.Or([_already_ran, ops.Not(cond_blob)]))

    def __enter__(self) -> Any:
        result = _RunOnce.__enter__(self)
        ops.stop_if(self._else_blob)
        ops.Const(True, blob_out=self._already_ran)
        return result

    def Elif(self, cond: Any, name: str | None = None) -> Any:
        _check(not self._is_else, "Else not allowed for an Else.")
        return NetBuilder.current().add(_RunIf(cond, name=name or self.name,
                                               _already_ran=self._already_ran))

    def Else(self, name: str | None = None) -> Any:
        _check(not self._is_else, "Elif not allowed for an Else.")
        return NetBuilder.current().add(_RunIf(name=name or self.name,
                                               _already_ran=self._already_ran))


class _RunIfNet(NetBuilder):
    """One net with an If op over the block (the then branch)."""

    def __init__(self, cond_blob: Any, name: str | None = None) -> None:
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        _check(cond_blob is not None, "Conditional blob is not specified for an If net")
        self._cond_blob = cond_blob
        self._then_net: Net | None = None
        self._else_net: Net | None = None

    def __exit__(self, etype: Any, *args: Any) -> None:
        if etype is None:
            then_nets = self._children
            self._reset_children()
            self._then_net = NetBuilder.merge_nets(then_nets, self._lexical_scope)
            if self._then_net is None:
                self._then_net = Net("empty_then_net")
            if_net = Net(self.name + "/if_net")
            add_if_op(if_net, self._cond_blob, self._lexical_scope, self._then_net,
                      self._else_net)
            self._current_net = if_net
            self._children = [if_net]
        NetBuilder.__exit__(self, etype, *args)


class _RunElseNet(NetBuilder):
    """The else branch of the IfNet block just before it."""

    def __init__(self, name: str | None = None) -> None:
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        parent = NetBuilder.current(required=False)
        _check(parent is not None and len(parent._children) > 0
               and isinstance(parent._children[-1], _RunIfNet), "Invalid use of Else builder")
        self._if_builder = parent._children[-1]

    def __exit__(self, etype: Any, *args: Any) -> None:
        if etype is None:
            else_nets = self._children
            self._reset_children()
            builder = self._if_builder
            builder._else_net = NetBuilder.merge_nets(else_nets, self._lexical_scope)
            if builder._else_net is not None:
                if_else_net = Net(self.name + "/if_else_net")
                add_if_op(if_else_net, builder._cond_blob, self._lexical_scope,
                          builder._then_net, builder._else_net)
                builder._current_net = if_else_net
                builder._children = [if_else_net]
        NetBuilder.__exit__(self, etype, *args)


class _RunWhileNet(NetBuilder):
    """One net with a While op over the block (the loop body)."""

    def __init__(self, name: str | None = None) -> None:
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        self._cond_builder: _RunWhileCondition | None = None

    def __exit__(self, etype: Any, *args: Any) -> None:
        if etype is None:
            _check(self._cond_builder is not None,
                   "Condition builder must be specified in While op")
            assert self._cond_builder is not None
            body = self._children
            self._reset_children()
            body_net = NetBuilder.merge_nets(body, self._lexical_scope)
            if body_net is None:
                body_net = Net("empty_loop_body_net")
            while_net = Net(self.name + "/while_net")
            add_while_op(while_net, self._cond_builder._cond_blob, self._lexical_scope,
                         body_net, self._cond_builder._cond_net)
            self._current_net = while_net
            self._children = [while_net]
        NetBuilder.__exit__(self, etype, *args)


class _RunWhileCondition(NetBuilder):
    """The loop condition of a WhileNet: its last op's single output is the condition."""

    def __init__(self, name: str | None = None) -> None:
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        parent = NetBuilder.current(required=False)
        _check(isinstance(parent, _RunWhileNet), "Invalid use of loop condition builder")
        _check(parent._cond_builder is None, "Multiple loop condition builders specified")
        _check(len(parent._children) == 0,
               "Condition definition must be specified before the loop's body")
        parent._cond_builder = self
        self._cond_blob: Any = None
        self._cond_net: Net | None = None

    def __exit__(self, etype: Any, *args: Any) -> None:
        if etype is None:
            body = self._children
            self._reset_children()
            self._cond_net = NetBuilder.merge_nets(body, self._lexical_scope)
            _check(self._cond_net is not None and len(self._cond_net.Proto().op) > 0,
                   "Invalid loop condition specified")
            assert self._cond_net is not None
            last_op = self._cond_net.Proto().op[-1]
            _check(len(last_op.output) == 1, "Invalid condition net")
            self._cond_blob = BlobReference(last_op.output[0])
            self._current_net = self._cond_net
            self._children = [self._cond_net]
        NetBuilder.__exit__(self, etype, *args)


__all__ = ["NetBuilder", "Operations", "ops"]
