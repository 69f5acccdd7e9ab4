"""A run's total steps, sent with its heartbeats: what a live page needs for its ETA.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.add_column(sa.Column("total_steps", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.drop_column("total_steps")
