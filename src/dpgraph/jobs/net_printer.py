"""Caffe2's ``net_printer``: check and pretty-print nets, execution steps, tasks, task
groups and jobs.

``analyze(obj)`` walks the execution as it would run (one workspace per node; private
tasks and ``create_workspace`` steps get a copy) and asserts that every blob is defined
before use and that concurrent substeps do not create the same blob.  ``to_string(obj)``
renders pseudo-Python: ``with loop(...)``, ``with parallel(...)``, ``core.Net('n')``,
``n.Op([inputs], [outputs], arg=...)``.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from copy import copy
from itertools import chain
from typing import Any

from dpgraph.ir.net import Net
from dpgraph.ir.plan import ExecutionStep, Plan
from dpgraph.jobs.task import Task, TaskGroup, TaskOutput, WorkspaceType
from dpgraph.proto import caffe2_pb2
from dpgraph.proto.caffe2_pb2 import NetDef, OperatorDef


def _is_job(obj: Any) -> bool:
    return hasattr(obj, "init_group") and hasattr(obj, "epoch_group")


class Visitor:
    """Dispatch on the exact type of the visited object (``register(Type)``)."""

    visitors: dict[type, Callable[..., Any]]

    @classmethod
    def register(cls, Type: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if "visitors" not in cls.__dict__:
            cls.visitors = {}
        if Type in cls.visitors:
            raise AssertionError(f"{Type} already registered!")

        def _register(func: Callable[..., Any]) -> Callable[..., Any]:
            cls.visitors[Type] = func
            return func

        return _register

    def __call__(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        if obj is None:
            return None
        func = type(self).visitors.get(type(obj))
        if func is None and _is_job(obj):
            func = type(self).visitors.get(_Job)
        if func is None:
            raise TypeError(f"{type(self).__name__}: unsupported object type: {type(obj)}")
        return func(self, obj, *args, **kwargs)


class _Job:
    """Marker key for checkpoint Jobs (objects with init_group and epoch_group)."""


class Analyzer(Visitor):
    """Tracks the blobs defined in each workspace while walking the execution."""

    PREFIXES_TO_IGNORE = {"distributed_ctx_init"}

    def __init__(self) -> None:
        self.workspaces: defaultdict[str, defaultdict[str, int]] = defaultdict(
            lambda: defaultdict(int))
        # a default workspace, so that nets and steps can be analyzed on their own
        self.workspace_ctx: list[Any] = [self.workspaces["local"]]

    @property
    def workspace(self) -> Any:
        return self.workspace_ctx[-1]

    @contextlib.contextmanager
    def set_workspace(self, node: Any = None, ws: Any = None,
                      do_copy: bool = False) -> Iterator[Any]:
        if ws is None:
            ws = self.workspaces[str(node)] if node is not None else self.workspace
        if do_copy:
            ws = copy(ws)
        self.workspace_ctx.append(ws)
        try:
            yield ws
        finally:
            del self.workspace_ctx[-1]

    def define_blob(self, blob: str) -> None:
        self.workspace[blob] += 1

    def need_blob(self, blob: str) -> None:
        if any(blob.startswith(p) for p in Analyzer.PREFIXES_TO_IGNORE):
            return
        if blob not in self.workspace:
            raise AssertionError(f"Blob undefined: {blob}")


@Analyzer.register(OperatorDef)
def analyze_op(analyzer: Analyzer, op: OperatorDef) -> None:
    for name in op.input:
        analyzer.need_blob(name)
    for name in op.output:
        analyzer.define_blob(name)


@Analyzer.register(Net)
def analyze_net(analyzer: Analyzer, net: Net) -> None:
    for op in net.Proto().op:
        analyzer(op)


@Analyzer.register(ExecutionStep)
def analyze_step(analyzer: Analyzer, step: ExecutionStep) -> None:
    proto = step.Proto()
    all_new: set[str] = set()
    with analyzer.set_workspace(do_copy=proto.create_workspace):
        if proto.report_net:
            with analyzer.set_workspace(do_copy=True):
                analyzer(step.get_net(proto.report_net))
        for sub in step.Substeps() + [step.get_net(n) for n in proto.network]:
            with analyzer.set_workspace(do_copy=proto.concurrent_substeps) as ws_in:
                analyzer(sub)
                if proto.should_stop_blob:
                    analyzer.need_blob(proto.should_stop_blob)
            if proto.concurrent_substeps:
                new = set(ws_in) - set(analyzer.workspace)
                both = all_new & new
                if both:
                    raise AssertionError("Error: Blobs created by multiple parallel steps: "
                                         + ", ".join(sorted(both)))
                all_new |= new
    for name in all_new:
        analyzer.define_blob(name)


@Analyzer.register(Task)
def analyze_task(analyzer: Analyzer, task: Task) -> None:
    step = task.get_step()
    plan = Plan(task.node)
    plan.AddStep(step)
    size = len(plan.Proto().SerializeToString())
    if size >= 2 ** 26:
        raise AssertionError("Due to a protobuf limitation, serialized tasks must be smaller "
                             f"than 64Mb, but this task has {size} bytes.")
    with analyzer.set_workspace(do_copy=task.workspace_type() != WorkspaceType.GLOBAL):
        analyzer(step)


@Analyzer.register(TaskGroup)
def analyze_task_group(analyzer: Analyzer, tg: TaskGroup) -> None:
    for task in tg.tasks_by_node().tasks():
        with analyzer.set_workspace(node=task.node):
            analyzer(task)


@Analyzer.register(_Job)
def analyze_job(analyzer: Analyzer, job: Any) -> None:
    analyzer(job.init_group)
    analyzer(job.epoch_group)


def analyze(obj: Any) -> None:
    """Assert that ``obj`` uses no undefined blob and that concurrent steps do not define
    the same blob."""
    Analyzer()(obj)


class Text:
    """Indented lines; ``context(text)`` opens a ``with text:`` block."""

    def __init__(self) -> None:
        self._indent = 0
        self._lines_in_context = [0]
        self.lines: list[str] = []

    @contextlib.contextmanager
    def context(self, text: str | None) -> Iterator[None]:
        if text is not None:
            self.add(f"with {text}:")
            self._indent += 4
            self._lines_in_context.append(0)
        try:
            yield
        finally:
            if text is not None:
                if self._lines_in_context[-1] == 0:
                    self.add("pass")
                self._indent -= 4
                del self._lines_in_context[-1]

    def add(self, text: str) -> None:
        self._lines_in_context[-1] += 1
        self.lines.append(" " * self._indent + text)

    def __str__(self) -> str:
        return "\n".join(self.lines)


class Printer(Visitor, Text):
    """Renders objects as pseudo-Python text."""

    def __init__(self, factor_prefixes: bool = False, c2_syntax: bool = True) -> None:
        Text.__init__(self)
        self.factor_prefixes = factor_prefixes
        self.c2_syntax = c2_syntax
        self.c2_net_name: str | None = None


def _sanitize_str(s: Any) -> str:
    if isinstance(s, bytes):
        s = s.decode("ascii", errors="ignore")
    s = str(s)
    return f"'{s}'" if len(s) < 64 else f"'{s[:64]}'...<+len={len(s) - 64}>"


def _arg_val(arg: caffe2_pb2.Argument) -> str:
    if arg.HasField("f"):
        return str(arg.f)
    if arg.HasField("i"):
        return str(arg.i)
    if arg.HasField("s"):
        return _sanitize_str(arg.s)
    if arg.floats:
        return str(list(arg.floats))
    if arg.ints:
        return str(list(arg.ints))
    if arg.strings:
        return str([_sanitize_str(s) for s in arg.strings])
    return "[]"


def commonprefix(m: list[str]) -> str:
    """The longest common prefix of the strings."""
    if not m:
        return ""
    s1, s2 = min(m), max(m)
    for i, c in enumerate(s1):
        if c != s2[i]:
            return s1[:i]
    return s1


def format_value(val: Any) -> str:
    if isinstance(val, list):
        return "[" + ", ".join(f"'{v}'" for v in val) + "]"
    return str(val)


def factor_prefix(vals: list[Any], do_it: bool) -> str:
    texts = [format_value(v) for v in vals]
    prefix = commonprefix(texts) if len(texts) > 1 and do_it else ""
    joined = ", ".join(v[len(prefix):] for v in texts)
    return f"{prefix}[{joined}]" if prefix else joined


def call(op: str, inputs: Any = None, outputs: Any = None,
         factor_prefixes: bool = False) -> str:
    """``outputs = op(inputs, key=value)`` as text."""
    text = ""
    if inputs:
        positional = [a for a in inputs if not isinstance(a, tuple)]
        keywords = [a for a in inputs if isinstance(a, tuple)]
        text = ", ".join(x for x in chain([factor_prefix(positional, factor_prefixes)],
                                          (f"{k}={v}" for k, v in keywords)) if x)
    result = f"{op}({text})"
    return result if not outputs else f"{factor_prefix(list(outputs), factor_prefixes)} = {result}"


def format_device_option(dev_opt: Any) -> str | None:
    if not dev_opt or not (dev_opt.device_type or dev_opt.device_id or dev_opt.node_name):
        return None
    return call("DeviceOption", [dev_opt.device_type, dev_opt.device_id,
                                 f"'{dev_opt.node_name}'"])


@Printer.register(OperatorDef)
def print_op(text: Printer, op: OperatorDef) -> None:
    args = [(a.name, _arg_val(a)) for a in op.arg]
    device = format_device_option(op.device_option)
    if device:
        args.append(("device_option", device))
    if text.c2_net_name:
        text.add(call(f"{text.c2_net_name}.{op.type}", [list(op.input), list(op.output)] + args))
    else:
        text.add(call(op.type, list(op.input) + args, op.output,
                      factor_prefixes=text.factor_prefixes))
    for arg in op.arg:
        if arg.HasField("n"):
            with text.context(f"arg: {arg.name}"):
                text(arg.n)


@Printer.register(NetDef)
def print_net_def(text: Printer, net_def: NetDef) -> None:
    if text.c2_syntax:
        text.add(call("core.Net", [f"'{net_def.name}'"], [net_def.name]))
        text.c2_net_name = net_def.name
    else:
        text.add(f"# net: {net_def.name}")
    for op in net_def.op:
        text(op)
    if text.c2_syntax:
        text.c2_net_name = None


@Printer.register(Net)
def print_net(text: Printer, net: Net) -> None:
    text(net.Proto())


def _get_step_context(step: ExecutionStep) -> tuple[str | None, bool]:
    proto = step.Proto()
    if proto.should_stop_blob:
        return call("loop"), False
    if proto.num_iter and proto.num_iter != 1:
        return call("loop", [proto.num_iter]), False
    if proto.num_concurrent_instances > 1:
        return (call("parallel", [("num_instances", proto.num_concurrent_instances)]),
                len(step.Substeps()) > 1)
    if proto.concurrent_substeps and len(step.Substeps()) > 1:
        return call("parallel"), True
    if proto.report_net:
        return call("run_once"), False
    return None, False


@Printer.register(ExecutionStep)
def print_step(text: Printer, step: ExecutionStep) -> None:
    proto = step.Proto()
    step_ctx, do_substep = _get_step_context(step)
    with text.context(step_ctx):
        if proto.report_net:
            with text.context(call("report_net", [proto.report_interval])):
                text(step.get_net(proto.report_net))
        for sub in step.Substeps() + [step.get_net(n) for n in proto.network]:
            sub_proto = sub.Proto() if isinstance(sub, ExecutionStep) else None
            if sub_proto is not None and sub_proto.run_every_ms:
                ctx = call("reporter", [str(sub), ("interval_ms", sub_proto.run_every_ms)])
            elif do_substep:
                title = ("workspace" if sub_proto is not None and sub_proto.create_workspace
                         else "step")
                ctx = call(title, [str(sub)])
            else:
                ctx = None
            with text.context(ctx):
                text(sub)
                if proto.should_stop_blob:
                    text.add(call("yield stop_if", [proto.should_stop_blob]))


def _print_task_output(x: TaskOutput) -> str:
    return "Output[" + ", ".join(str(n) for n in x.names) + "]"


@Printer.register(Task)
def print_task(text: Printer, task: Task) -> None:
    outs = ", ".join(_print_task_output(o) for o in task.outputs())
    with text.context(call("Task", [("node", task.node), ("name", task.name),
                                    ("outputs", outs)])):
        text(task.get_step())


@Printer.register(TaskGroup)
def print_task_group(text: Printer, tg: TaskGroup, header: str | None = None) -> None:
    with text.context(header or call("TaskGroup")):
        for task in tg.tasks_by_node().tasks():
            text(task)


@Printer.register(_Job)
def print_job(text: Printer, job: Any) -> None:
    text(job.init_group, "Job.current().init_group")
    text(job.epoch_group, "Job.current().epoch_group")
    with text.context("Job.current().stop_conditions"):
        for out in getattr(job, "stop_conditions", []):
            text.add(_print_task_output(out))
    for group in ("download_group", "exit_group"):
        if getattr(job, group, None) is not None:
            text(getattr(job, group), f"Job.current().{group}")


def to_string(obj: Any, **kwargs: Any) -> str:
    """A pseudo-Python description of a Net, ExecutionStep, Task, TaskGroup or Job."""
    printer = Printer(**kwargs)
    printer(obj)
    return str(printer)


def debug_net(net: Net) -> Net:
    """A copy of ``net`` that logs each operator call (LogInfo) before running it."""
    if not isinstance(net, Net):
        raise TypeError(f"debug_net takes a core.Net, got {type(net).__name__}")
    result = Net(str(net))
    for op in net.Proto().op:
        printer = Printer()
        print_op(printer, op)
        result.LogInfo(str(printer))
        result.Proto().op.extend([op])
    return result


__all__ = ["Analyzer", "Printer", "Text", "Visitor", "analyze", "call", "commonprefix",
           "debug_net", "factor_prefix", "format_device_option", "format_value",
           "to_string"]
