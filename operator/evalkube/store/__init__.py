"""The results store (SQLAlchemy 2): SQLite (a file, the embedded default) or PostgreSQL."""

from evalkube.store.database import default_url
from evalkube.store.errors import StoreError
from evalkube.store.records import RunRecord, SampleRecord, TaskResultRecord
from evalkube.store.run_state import RunState
from evalkube.store.sample_reads import SampleReads, decode_cursor, encode_cursor
from evalkube.store.sample_writes import SampleWrites
from evalkube.store.writer import SampleWriter


class ResultStore(RunState, SampleWrites, SampleReads):
    """Runs, units, samples and task results on SQLite or PostgreSQL."""


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
