"""SQLite storage of the daemon: schema and migrations, the batched writer,
and read-only queries for the control protocol.

Importing this package loads sqlite-utils only (never torch or hivemind).
"""

from .database import Database
from .schema import SCHEMA_VERSION, SchemaTooNewError, StorageError

__all__ = ["Database", "SCHEMA_VERSION", "SchemaTooNewError", "StorageError"]
