"""Caffe2's key-value DBs: a registry of DB types, cursors and transactions.

Built-in types (each under a CamelCase and a lower-case name): ``minidb`` (Caffe2's
single-file format), ``protodb`` (one ``TensorProtos`` file), ``lmdb`` (the ``lmdb``
package) and ``leveldb`` (``plyvel``, optional).  Register your own with
:func:`register_db`::

    from dpgraph.db import create_db, Mode
    db = create_db("minidb", "/tmp/x.db", Mode.new)
    txn = db.new_transaction(); txn.put(b"k", b"v"); txn.commit(); del txn
    db.close()
"""

from dpgraph.db import leveldb_db, lmdb_db, minidb, protodb  # noqa: F401  (register types)
from dpgraph.db.base import (
    DB,
    Cursor,
    Mode,
    Transaction,
    as_mode,
    create_db,
    db_exists,
    open_db,
    register_db,
    registered_dbs,
)
from dpgraph.db.reader import DBReader

__all__ = ["DB", "Cursor", "DBReader", "Mode", "Transaction", "as_mode", "create_db",
           "db_exists", "open_db", "register_db", "registered_dbs"]
