"""Tables of the results store (SQLAlchemy Core; portable across SQLite and PostgreSQL).

This is the one declaration of the tables' current shape; ``migrations/versions`` holds the
Alembic revisions that bring an older store to it (a test checks the two agree).

JSON-shaped columns are stored as text we encode ourselves: it is the fastest portable path
at 100k+ samples and keeps the schema identical on both databases.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Index, MetaData, String, Table, Text

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

#: Version of the samples table's layout; a store written with another layout is refused
#: with a clear message instead of failing on a missing column in the middle of a run.
SAMPLES_LAYOUT = 2
#: Keys of a sample's ``detail`` column (what the debugging view shows, never filtered on).
DETAIL_KEYS = (
    "row_id",
    "prompt",
    "target",
    "output_text",
    "extracted_output",
    "judge",
    "error",
    "response_id",
    "dataset_row",
    "timings",
    "stdout",
    "stderr",
)

# Columns that queries filter or aggregate on stay columns; the rest of a sample is one JSON
# object in ``detail``. One encode and ten values per sample instead of six encodes and 21
# values keeps the store from pacing the engine (see ``evalkube.store.sample_writes``).
samples = Table(
    "evalkube_samples",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("sample_id", String(64), primary_key=True),
    Column("task_id", String(63), nullable=False),
    Column("model", String(253), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("error_stage", String(16)),
    Column("scores", Text, nullable=False),
    Column("model_calls", Text),
    Column("detail", Text, nullable=False),
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
    Column("model_calls", Text),
)
#: Each finished unit's aggregate of its samples (a partial :class:`TaskAggregate` as JSON),
#: computed once from the stored samples when the unit is done: the run's results are the
#: merge of these, not a read of every sample's scores (``evalkube.controller.results``).
#: Reporting a unit done again drops its row, so it is computed afresh.
unit_aggregates = Table(
    "evalkube_unit_aggregates",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("unit_id", String(253), primary_key=True),
    Column("task_id", String(63), nullable=False),
    Column("model", String(253), nullable=False),
    Column("aggregate", Text, nullable=False),
)

#: The Alembic revision (``migrations/versions``) that gives the tables the shape declared
#: here: a new revision file changes it. An up-to-date store is one whose version table says
#: this, which :meth:`ResultStore.open` checks without importing Alembic.
REVISION = "0004"
#: Nullable columns added to existing tables since revision 0001, oldest first (the revision
#: in ``migrations/versions`` that adds it, table, column): a store written before migrations
#: existed is at the last revision whose column it has (see ``evalkube.store.migrate``).
ADDED_COLUMNS = (("0002", "evalkube_task_results", "model_calls"),)

#: Model answers as they arrive, before their sample is graded and stored: a run stopped
#: between the two (Ctrl-C, a crash) reuses them on ``--resume`` instead of paying again.
answers = Table(
    "evalkube_answers",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("sample_id", String(64), primary_key=True),
    Column("purpose", String(16), primary_key=True),
    Column("answer", Text, nullable=False),
)
