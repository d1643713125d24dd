"""The store's tables as the first evalkube with migrations found them (samples layout 2).

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "evalkube_runs",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("suite_name", sa.String(253), nullable=False),
        sa.Column("suite_version", sa.String(80), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("sandbox", sa.String(64), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True)),
        sa.Column("summary", sa.Text),
    )
    op.create_table(
        "evalkube_units",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("unit_id", sa.String(253), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("info", sa.Text),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "evalkube_samples",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("sample_id", sa.String(64), primary_key=True),
        sa.Column("task_id", sa.String(63), nullable=False),
        sa.Column("model", sa.String(253), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_stage", sa.String(16)),
        sa.Column("scores", sa.Text, nullable=False),
        sa.Column("model_calls", sa.Text),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index(
        "ix_evalkube_samples_order", "evalkube_samples", ["run_id", "task_id", "model", "seq"]
    )
    op.create_table(
        "evalkube_task_results",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("task_id", sa.String(63), primary_key=True),
        sa.Column("model", sa.String(253), primary_key=True),
        sa.Column("metrics", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("problems", sa.Text),
    )
    op.create_table(
        "evalkube_answers",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("sample_id", sa.String(64), primary_key=True),
        sa.Column("purpose", sa.String(16), primary_key=True),
        sa.Column("answer", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in (
        "evalkube_answers",
        "evalkube_task_results",
        "evalkube_samples",
        "evalkube_units",
        "evalkube_runs",
    ):
        op.drop_table(table)
