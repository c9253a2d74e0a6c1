"""What the DB, persistence and image-input ops use of this layer, handed to their kernels
by the runtime.

Those ops (:mod:`dpgraph.ops.db`, ``ops.persist``, ``ops.image_input``) sit in the ops
layer, below the DB and data packages; their kernels reach readers, DBs and the image
pipeline through ``ctx.workspace.storage`` (the :data:`SERVICES` instance every runtime
workspace carries), so no op module imports this layer.
"""

from __future__ import annotations

from typing import Any

from dpgraph.data import image, prefetch, records
from dpgraph.db.base import Mode, db_exists, open_db
from dpgraph.db.queue_db import BlobsQueueDB
from dpgraph.db.reader import DBReader


class StorageServices:
    """DB readers and DBs, and the ImageInput pipeline, for op kernels."""

    Mode = Mode
    reader_class = DBReader
    image_params = image.ImageParams
    prefetcher = prefetch.Prefetcher

    @staticmethod
    def is_reader(value: Any) -> bool:
        return isinstance(value, DBReader)

    @staticmethod
    def reader(db_type: str, source: str, num_shards: int = 1, shard_id: int = 0,
               name: str = "") -> DBReader:
        """A reader of ``source`` (READ mode) positioned at shard ``shard_id``."""
        return DBReader(db_type, source, num_shards, shard_id, name=name)

    @staticmethod
    def queue_reader(queue: Any, key_index: int, value_index: int, timeout_secs: float,
                     queue_name: str, name: str) -> DBReader:
        """A reader whose cursor pops records from a blobs queue."""
        db = BlobsQueueDB(queue, key_index, value_index, timeout_secs, name=queue_name)
        return DBReader.from_db(db, "blobs_queue_db", name)

    @staticmethod
    def open_db(db_type: str, source: str, mode: Any) -> Any:
        return open_db(db_type, source, mode)

    @staticmethod
    def db_exists(db_type: str, source: str) -> bool:
        return db_exists(db_type, source)

    # --- ImageInput ---------------------------------------------------------------------
    parse_tensor_protos = staticmethod(records.parse_tensor_protos)
    parse_caffe_datum = staticmethod(records.parse_caffe_datum)
    augment = staticmethod(image.augment)
    normalize = staticmethod(image.normalize)
    decode_pool = staticmethod(prefetch.decode_pool)
    batch_buffer = staticmethod(prefetch.batch_buffer)


#: The instance runtime workspaces carry as ``storage``.
SERVICES = StorageServices()
