"""Results store (SQLAlchemy 2): SQLite by default, PostgreSQL by URL."""

from evalkube.store.errors import StoreError
from evalkube.store.records import RunRecord, SampleRecord, TaskResultRecord
from evalkube.store.store import ResultStore, decode_cursor, default_url, encode_cursor
from evalkube.store.writer import SampleWriter

__all__ = [
    "ResultStore",
    "RunRecord",
    "SampleRecord",
    "SampleWriter",
    "StoreError",
    "TaskResultRecord",
    "decode_cursor",
    "default_url",
    "encode_cursor",
]
