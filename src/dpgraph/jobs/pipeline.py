"""Caffe2's ``pipeline``: ``pipe`` builds a Task that reads records (from a reader,
dataset or queue), optionally processes them, and writes them to a writer or to a new
queue it returns."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import NetError, NotSupportedError
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.net import Net
from dpgraph.ir.plan import execution_step
from dpgraph.jobs import queue_util
from dpgraph.jobs.dataio import Reader, Writer
from dpgraph.jobs.net_builder import NetBuilder, ops
from dpgraph.jobs.schema import Field, as_record
from dpgraph.jobs.task import Task, TaskGroup
from dpgraph.proto import caffe2_pb2

_DEFAULT_CAPACITY = 100


class Output:
    """What a processor returns: nets to run, the output record, and a stop blob."""

    def __init__(self, nets: Any = None, record: Any = None, should_stop: Any = None) -> None:
        builder_children = NetBuilder.current().get()
        if nets is not None and builder_children:
            raise NetError("Cannot both use `ops` syntax and return a list of nets.")
        if nets is None:
            nets = builder_children
        if isinstance(nets, Net):
            nets = [nets]
        self.nets = [] if nets is None else list(nets)
        self.record = None if record is None else as_record(record)
        self.should_stop = should_stop


def normalize_processor_output(output: Any) -> Output:
    """An Output from a processor's result: an Output, a record, ``(record, stop)``,
    ``(nets, record[, stop])`` or nets."""
    if isinstance(output, Output):
        return output
    if isinstance(output, Field):
        return Output(record=output)
    if isinstance(output, tuple):
        if len(output) == 2 and isinstance(output[0], Field) and \
                isinstance(output[1], BlobReference):
            return Output(None, *output)
        return Output(*output)
    return Output(output)


def processor_name(processor: Any) -> str:
    if hasattr(processor, "name"):
        return str(processor.name)
    if hasattr(processor, "__name__"):
        if processor.__name__ == "<lambda>":
            return processor.__module__
        return processor.__name__
    return type(processor).__name__


def make_processor(processor: Any, reader: Any = None) -> Any:
    if processor is None:
        return lambda rec: rec
    if isinstance(processor, Net):
        raise NotSupportedError(
            f"pipe(processor=<Net {processor.Name()}>): net processors are not supported; "
            "pass a function taking the input record and returning ([net], output_record).")
    if reader is not None and hasattr(processor, "schema_func"):
        processor.schema = lambda: processor.schema_func(reader)
    return processor


class ProcessingReader(Reader):
    """Reads from ``reader`` and hands each record to ``processor``."""

    def __init__(self, reader: Reader, processor: Any) -> None:
        Reader.__init__(self)
        self.reader = reader
        self.processor = make_processor(processor, reader)

    def schema(self) -> Any:
        return self.processor.schema()

    def setup_ex(self, init_net: Any, finish_net: Any) -> None:
        self.reader.setup_ex(init_net, finish_net)

    def read_ex(self, init_net: Any, exit_net: Any) -> tuple[Any, ...]:
        read_nets, status, rec = self.reader.read_record_ex(init_net, exit_net)
        with NetBuilder() as nb:
            result = normalize_processor_output(self.processor(rec))
        read_nets = list(read_nets) + result.nets
        if result.should_stop is not None or nb._stop_blob is not None:
            stop_net = Net("stop_net")
            if result.should_stop is not None:
                stop_net.Or([status, result.should_stop], [status])
            if nb._stop_blob is not None:
                stop_net.Or([status, nb._stop_blob], [status])
            read_nets.append(stop_net)
        if hasattr(self.processor, "setup"):
            init_net.add_attribute(TaskGroup.LOCAL_SETUP, self.processor)
        self._set_schema(result.record)
        fields = result.record.field_blobs() if result.record else None
        return read_nets, status, fields


def _init_output(output: Any, capacity: int | None, global_init_net: Any,
                 global_exit_net: Any) -> tuple[Any, Writer]:
    if output is None:
        out_queue: Any = queue_util.Queue(
            capacity=capacity if capacity is not None else _DEFAULT_CAPACITY)
        writer = out_queue.writer()
    elif isinstance(output, Writer):
        if capacity is not None:
            raise NetError("capacity would not be used.")
        out_queue, writer = None, output
    elif hasattr(output, "writer"):
        if capacity is not None:
            raise NetError("capacity would not be used.")
        out_queue, writer = output, output.writer()
    else:
        raise NetError("output must be a reader, queue or stream.")
    writer.setup_ex(global_init_net, global_exit_net)
    return out_queue, writer


def _pipe_step(input: Any, output: Any = None, num_threads: int = 1, processor: Any = None,
               name: str | None = None, capacity: int | None = None, group: Any = None,
               num_runtime_threads: int = 1, final_outputs: Any = None) -> tuple[Any, Any]:
    if num_threads > 1 and num_runtime_threads > 1:
        raise NetError("Only one of num_threads or num_runtime_threads must be set.")
    if isinstance(input, Reader):
        reader = input
    elif hasattr(input, "reader"):
        reader = input.reader()
    else:
        raise NetError("in must be a reader, queue or stream.")
    if processor is not None:
        reader = ProcessingReader(reader, processor)
    if num_threads == 0 or num_runtime_threads == 0:
        if output is not None:
            raise NetError("output must be None when no thread runs the pipe")
        return reader, None
    if name is None and processor is not None:
        name = processor_name(processor)
    if name is None and output is not None:
        name = "pipe_into:" + processor_name(output)
    if name is None:
        name = "pipe_from:" + processor_name(input)
    instances = max(num_threads, num_runtime_threads)
    with Task(name=name, group=group, outputs=final_outputs,
              num_instances=instances) as task:
        global_exit_net = Net("pipe:exit")
        global_init_net = Net("pipe:init")
        reader.setup_ex(global_init_net, global_exit_net)
        init_net = Net("pipe:instance:init")
        exit_net = Net("pipe:instance:exit")
        read_nets, status, rec = reader.read_record_ex(init_net, exit_net)
        init_net.ConstantFill([], [status], shape=[], value=False,
                              dtype=caffe2_pb2.TensorProto.BOOL)
        if rec is not None:
            out_queue, writer = _init_output(output, capacity, global_init_net,
                                             global_exit_net)
            write_nets = writer.write_record_ex(rec, init_net, exit_net, status)
        else:
            out_queue, write_nets = None, []
        with ops.task_init():
            ops.net(global_init_net)
        with ops.task_instance_init():
            ops.net(init_net)
        ops.net(execution_step("body", list(read_nets) + list(write_nets),
                               should_stop_blob=status))
        with ops.task_instance_exit():
            ops.net(exit_net)
        with ops.task_exit():
            ops.net(global_exit_net)
    return out_queue, task


def pipe(input: Any, output: Any = None, num_threads: int = 1, processor: Any = None,
         name: str | None = None, capacity: int | None = None, group: Any = None,
         num_runtime_threads: int = 1) -> Any:
    """A Task (in the current TaskGroup) piping ``input`` into ``output`` through
    ``processor``; returns the output queue when ``output`` is None, else ``output``'s
    queue side (or None)."""
    result, _ = _pipe_step(input, output, num_threads, processor, name, capacity, group,
                           num_runtime_threads)
    return result


def pipe_and_output(input: Any, output: Any = None, num_threads: int = 1,
                    processor: Any = None, name: str | None = None,
                    capacity: int | None = None, group: Any = None,
                    num_runtime_threads: int = 1, final_outputs: Any = None) -> Any:
    """Like ``pipe``; returns ``(queue, task outputs)``."""
    if final_outputs is None:
        raise NetError("pipe_and_output needs final_outputs")
    result, task = _pipe_step(input, output, num_threads, processor, name, capacity, group,
                              num_runtime_threads, final_outputs)
    output = None
    if final_outputs is not None:
        output = task.outputs()
        if type(final_outputs) not in (list, tuple):
            output = output[0]
    return result, output


__all__ = ["Output", "ProcessingReader", "make_processor",
           "normalize_processor_output", "pipe", "pipe_and_output", "processor_name"]
