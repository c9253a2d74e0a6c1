"""More of Caffe2's ``dataio``: reader builders, the composite reader, the time-limited
and the delaying readers."""

from __future__ import annotations

import time
from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.net import Net
from dpgraph.jobs.dataio import Reader, ReaderWithLimitBase
from dpgraph.jobs.schema import Struct
from dpgraph.proto import caffe2_pb2


class ReaderBuilder:
    """Makes readers, so that a reader can be used in distributed fashion: ``setup``
    once, then ``new_reader`` per user."""

    def schema(self) -> Any:
        raise NetError(f"{type(self).__name__} must implement `schema`.")

    def setup(self, **kwargs: Any) -> Any:
        raise NetError(f"{type(self).__name__} must implement `setup`.")

    def new_reader(self, **kwargs: Any) -> Any:
        raise NetError(f"{type(self).__name__} must implement `new_reader`.")


class PipedReaderBuilder(ReaderBuilder):
    """A builder whose readers are ``piper(reader=<the wrapped builder's reader>,
    **kwargs)`` (a Reader, or a Pipe whose reader is used)."""

    def __init__(self, builder: ReaderBuilder, piper: Any) -> None:
        self._builder = builder
        self._piper = piper

    def schema(self) -> Any:
        return self._builder.schema()

    def setup(self, **kwargs: Any) -> Any:
        return self._builder.setup(**kwargs)

    def new_reader(self, **kwargs: Any) -> Any:
        output = self._piper(reader=self._builder.new_reader(**kwargs), **kwargs)
        return output if isinstance(output, Reader) else output.reader()


class ReaderWithTimeLimit(ReaderWithLimitBase):
    """Stops after ``duration`` seconds (no limit when it is None or <= 0), measured from
    the global init net by a Timer."""

    def __init__(self, reader: Reader, duration: float | None = 0) -> None:
        super().__init__(reader)
        self.timer: Any = None
        self.duration = duration
        self.duration_ns_blob: Any = None

    def setup_limiter(self, global_init_net: Any, global_finish_net: Any) -> None:
        if self.duration is not None and self.duration > 0:
            duration_ns = int(self.duration * 10**9)
            self.timer = global_init_net.TimerBegin([], counter_name="epoch_timer")
            start_time = global_init_net.TimerGet(self.timer)
            self.duration_ns_blob = global_init_net.ConstantFill([start_time],
                                                                 value=duration_ns)
            global_finish_net.TimerEnd([self.timer], [])

    def check_limiter_condition(self, stop_condition_net: Any) -> Any:
        if self.duration:
            elapsed = stop_condition_net.TimerGet(self.timer)
            return stop_condition_net.GE([elapsed, self.duration_ns_blob])
        return stop_condition_net.ConstantFill([], 1, shape=[], value=False,
                                               dtype=caffe2_pb2.TensorProto.BOOL)


class ReaderWithDelay(Reader):
    """A test reader sleeping ``delay`` seconds before each batch of ``reader``."""

    def __init__(self, reader: Reader, delay: float) -> None:
        Reader.__init__(self, schema=reader._schema)
        self.reader = reader
        self.delay = delay

    def setup_ex(self, global_init_net: Any, global_finish_net: Any) -> None:
        self.reader.setup_ex(global_init_net, global_finish_net)

    def read_ex(self, local_init_net: Any, local_finish_net: Any) -> tuple[Any, ...]:
        read_net = Net("reader_body")
        delay = self.delay

        def sleep_op(inputs: Any, outputs: Any) -> None:
            time.sleep(delay)

        read_net.Python(sleep_op)([], [])
        return ([read_net], *self.reader.read(read_net))


class CompositeReader(Reader):
    """Reads from several readers at once: the record is a Struct of their records under
    ``names``; it stops as soon as one of them does."""

    def __init__(self, names: list[str], readers: list[Reader]) -> None:
        if len(names) != len(readers):
            raise NetError(f"{len(names)} names for {len(readers)} readers.")
        super().__init__(schema=Struct(*[(name, reader.schema())
                                         for name, reader in zip(names, readers)]))
        self._names = names
        self._readers = readers

    def setup_ex(self, init_net: Any, finish_net: Any) -> None:
        for reader in self._readers:
            reader.setup_ex(init_net, finish_net)

    def read_ex(self, local_init_net: Any, local_finish_net: Any) -> tuple[Any, ...]:
        fields: list[Any] = []
        stops, nets = [], []
        for reader in self._readers:
            sub_nets, should_stop, record = reader.read_record_ex(local_init_net,
                                                                  local_finish_net)
            stops.append(should_stop)
            nets.append(sub_nets)
            fields.extend(record.field_blobs())
        local_should_stop = stops[-1]
        read_nets: list[Any] = []
        for name, sub_nets, stop in zip(self._names, nets, stops):
            read_nets.extend(sub_nets)
            if stop == local_should_stop:
                continue  # Or([A, A], A) is not a valid op
            stop_net = Net(f"{name}_stop")
            stop_net.Or([local_should_stop, stop], local_should_stop)
            read_nets.append(stop_net)
        return read_nets, local_should_stop, fields

    def reset(self, net: Any) -> None:
        for reader in self._readers:
            reader.reset(net)


class CompositeReaderBuilder(ReaderBuilder):
    """Builds CompositeReaders from one builder per name."""

    def __init__(self, names: list[str], reader_builders: list[ReaderBuilder]) -> None:
        self._names = names
        self._reader_builders = reader_builders
        self._schema = Struct(*[(name, builder.schema())
                                for name, builder in zip(names, reader_builders)])

    def schema(self) -> Any:
        return self._schema

    def setup(self, **kwargs: Any) -> dict[Any, Any]:
        """Set up every builder (a ``limiter`` goes to the last one only, so a batch is
        counted only when every reader has data); returns their data-finished blobs."""
        limiter = kwargs.pop("limiter", None)
        finished: dict[Any, Any] = {}
        for i, builder in enumerate(self._reader_builders):
            if i == len(self._reader_builders) - 1 and limiter is not None:
                kwargs["limiter"] = limiter
            blobs = builder.setup(**kwargs)
            keys = set(finished) & set(blobs)
            values = set(finished.values()) & set(blobs.values())
            if keys or values:
                raise NetError(f"Overlapping data-finished blobs: {keys or values}")
            finished.update(blobs)
        return finished

    def new_reader(self, **kwargs: Any) -> CompositeReader:
        readers = []
        for builder in self._reader_builders:
            reader = builder.new_reader(**kwargs)
            if not isinstance(reader, Reader):
                if not hasattr(reader, "reader"):
                    raise ValueError("reader must be an instance of Reader or Pipe")
                reader = reader.reader()
            readers.append(reader)
        composite = CompositeReader(self._names, readers)
        if composite.schema() != self._schema:
            raise NetError("the readers' schemas differ from the builders' schemas.")
        return composite


__all__ = ["CompositeReader", "CompositeReaderBuilder", "PipedReaderBuilder",
           "ReaderBuilder", "ReaderWithDelay", "ReaderWithTimeLimit"]
