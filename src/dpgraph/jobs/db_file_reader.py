"""Caffe2's ``db_file_reader``: a Reader over a dataset saved in a DB file (one blob per
column), and ``cached_reader``'s CachedReader, which builds that file from another reader.
"""

from __future__ import annotations

import os
from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.net import Net
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.plan import execution_step
from dpgraph.ir.scope import CurrentNameScope, NameScope
from dpgraph.jobs.dataio import Reader
from dpgraph.jobs.dataset import Dataset
from dpgraph.jobs.schema import from_column_list
from dpgraph.runtime import api
from dpgraph.runtime.c_api import registered_dbs


class DBFileReader(Reader):
    """Reads, in random order, the columns stored in DB ``db_path`` (of ``db_type``).

    Without ``field_names`` the schema comes from the DB's blob names (sorted, so they
    must be in alphabetical order); ``batch_size`` records per read (default 100);
    ``loop_over`` reads forever.  Blobs get the prefix ``name`` (default
    ``<db file name>_db_file_reader``).
    """

    default_name_suffix = "db_file_reader"

    def __init__(self, db_path: str, db_type: str, name: str | None = None,
                 batch_size: int = 100, loop_over: bool = False,
                 field_names: list[str] | None = None) -> None:
        if db_path is None:
            raise NetError("db_path can't be None.")
        if db_type not in registered_dbs():
            raise NetError(f"db_type [{db_type}] is not available.\nChoose one of these: "
                           f"{registered_dbs()}.")
        self.db_path = os.path.expanduser(db_path)
        self.db_type = db_type
        self.name = name or f"{self._db_name()}_{self.default_name_suffix}"
        self.batch_size = batch_size
        self.loop_over = loop_over
        super().__init__(self._init_reader_schema(field_names))
        self.ds = Dataset(self._schema, self.name + "_dataset")
        self.ds_reader: Any = None

    def _db_name(self) -> str:
        return os.path.basename(self.db_path).rsplit(".", 1)[0]

    def _init_reader_schema(self, field_names: list[str] | None = None) -> Any:
        """The schema: from ``field_names``, or from the names of the blobs in the DB
        (loaded into the current workspace under this reader's prefix)."""
        if field_names:
            return from_column_list(field_names)
        with NameScope(self.name):
            prefix = CurrentNameScope()
        api.RunOperatorOnce(CreateOperator(
            "Load", [], [], absolute_path=True, db=self.db_path, db_type=self.db_type,
            load_all=True, add_prefix=prefix))
        columns = [name[len(prefix):] for name in sorted(api.Blobs())
                   if name.startswith(prefix)]
        return from_column_list(columns)

    def setup_ex(self, init_net: Any, finish_net: Any) -> None:
        """Create the dataset blobs, load them from the DB and make a random reader
        (done once; later calls set up the same reader again)."""
        if self.ds_reader is not None:
            self.ds_reader.setup_ex(init_net, finish_net)
            return
        self._init_field_blobs_as_empty(init_net)
        self._feed_field_blobs_from_db_file(init_net)
        self.ds_reader = self.ds.random_reader(init_net, batch_size=self.batch_size,
                                               loop_over=self.loop_over)
        self.ds_reader.sort_and_shuffle(init_net)
        self.ds_reader.computeoffset(init_net)

    def read(self, read_net: Any) -> tuple[Any, Any]:
        if self.ds_reader is None:
            raise NetError("setup_ex must be called first")
        return self.ds_reader.read(read_net)

    def _init_field_blobs_as_empty(self, init_net: Any) -> None:
        with NameScope(self.name):
            self.ds.init_empty(init_net)

    def _feed_field_blobs_from_db_file(self, net: Any) -> None:
        net.Load([], self.ds.get_blobs(), db=self.db_path, db_type=self.db_type,
                 absolute_path=True, source_blob_names=self.ds.field_names())


class CachedReader(DBFileReader):
    """A DBFileReader whose DB is a cache of ``original_reader``'s data, written by
    ``build_cache_step()`` (when the file does not exist yet, or with ``overwrite``)."""

    default_name_suffix = "cached_reader"

    def __init__(self, original_reader: Reader, db_path: str, db_type: str = "LevelDB",
                 name: str | None = None, batch_size: int = 100,
                 loop_over: bool = False) -> None:
        if original_reader is None:
            raise NetError("original_reader can't be None")
        self.original_reader = original_reader
        super().__init__(db_path, db_type, name, batch_size, loop_over)

    def _init_reader_schema(self, field_names: list[str] | None = None) -> Any:
        return self.original_reader._schema

    def build_cache_step(self, overwrite: bool = False) -> Any:
        """A step that reads all of the original reader into the dataset blobs (16
        threads) and saves them to ``db_path``; an empty step when the cache exists."""
        from dpgraph.jobs.pipeline import pipe
        from dpgraph.jobs.task import Cluster, TaskGroup

        if os.path.exists(self.db_path) and not overwrite:
            return execution_step("build_step", [])
        init_net = Net("init")
        self._init_field_blobs_as_empty(init_net)
        with Cluster(), NameScope(self.name), TaskGroup() as copy_tg:
            pipe(self.original_reader, self.ds.writer(), num_threads=16)
            copy_step = copy_tg.to_task().get_step()
        save_net = Net("save")
        save_net.Save(self.ds.get_blobs(), [], db=self.db_path, db_type=self.db_type,
                      blob_name_overrides=self.ds.field_names(), absolute_path=True)
        return execution_step("build_cache", [init_net, copy_step, save_net])


__all__ = ["CachedReader", "DBFileReader"]
