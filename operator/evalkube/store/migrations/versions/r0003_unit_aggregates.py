"""Each finished unit's aggregate of its samples (``evalkube_unit_aggregates``).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "evalkube_unit_aggregates",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("unit_id", sa.String(253), primary_key=True),
        sa.Column("task_id", sa.String(63), nullable=False),
        sa.Column("model", sa.String(253), nullable=False),
        sa.Column("aggregate", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("evalkube_unit_aggregates")
