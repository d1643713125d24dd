"""Tables of the results store (SQLAlchemy Core; portable across SQLite and PostgreSQL).

JSON-shaped columns are stored as text we encode ourselves: it is the fastest portable path
at 100k+ samples and keeps the schema identical on both databases.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

runs = Table(
    "evalkube_runs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("suite_name", String(253), nullable=False),
    Column("suite_version", String(80), nullable=False),
    Column("spec", Text, nullable=False),
    Column("sandbox", String(64), nullable=False),
    Column("phase", String(16), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("completed_at", DateTime(timezone=True)),
    Column("summary", Text),
)

units = Table(
    "evalkube_units",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("unit_id", String(253), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("info", Text),
    Column("finished_at", DateTime(timezone=True)),
)

samples = Table(
    "evalkube_samples",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("sample_id", String(64), primary_key=True),
    Column("task_id", String(63), nullable=False),
    Column("model", String(253), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("row_id", String(253)),
    Column("prompt", Text),
    Column("target", Text),
    Column("output_text", Text),
    Column("extracted_output", Text),
    Column("scores", Text, nullable=False),
    Column("judge", Text),
    Column("error", Text),
    Column("error_stage", String(16)),
    Column("model_calls", Text),
    Column("response_id", String(253)),
    Column("dataset_row", Text),
    Column("timings", Text),
    Column("stdout", Text),
    Column("stderr", Text),
    Index("ix_evalkube_samples_order", "run_id", "task_id", "model", "seq"),
)

task_results = Table(
    "evalkube_task_results",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("task_id", String(63), primary_key=True),
    Column("model", String(253), primary_key=True),
    Column("metrics", Text, nullable=False),
    Column("error", Text),
    Column("problems", Text),
)
