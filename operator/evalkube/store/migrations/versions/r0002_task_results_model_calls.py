"""Task results keep the model calls of grade_batch graders (``model_calls``).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("evalkube_task_results", sa.Column("model_calls", sa.Text))


def downgrade() -> None:
    op.drop_column("evalkube_task_results", "model_calls")
