"""The books: budgets and their alerts; what reports and FOCUS imports need of runs and costs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.add_column(sa.Column("resource_id", sa.String(300), server_default="", nullable=False))
        t.add_column(sa.Column("output_dir", sa.String(1000), server_default="", nullable=False))
        t.add_column(sa.Column("est_hours", sa.Float(), nullable=True))
        t.add_column(sa.Column("est_cost_usd", sa.Float(), nullable=True))
        t.create_index("ix_runs_started_at", ["started_at"])
    with op.batch_alter_table("costs") as t:
        t.add_column(sa.Column("run_id", sa.String(36), nullable=True))
        t.add_column(sa.Column("provider", sa.String(50), server_default="", nullable=False))
        t.add_column(sa.Column("gpu_hours", sa.Float(), server_default="0", nullable=False))
        t.add_column(sa.Column("period_end", WHEN, nullable=True))
        t.create_foreign_key("fk_costs_run_id", "runs", ["run_id"], ["id"])
        t.create_index("ix_costs_at", ["at"])
    op.create_table(
        "budgets",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("scope", sa.JSON(), nullable=False),
        sa.Column("period", sa.String(10), nullable=False),
        sa.Column("amount_usd", sa.Float(), nullable=False),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("action", sa.String(10), nullable=False),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "budget_id",
            sa.Integer(),
            sa.ForeignKey("budgets.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("period_start", WHEN, nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("fired_at", WHEN, nullable=False),
        sa.Column("spend_usd", sa.Float(), nullable=False),
        sa.UniqueConstraint("budget_id", "period_start", "threshold"),
    )


def downgrade() -> None:
    op.drop_table("alerts")
    op.drop_table("budgets")
    with op.batch_alter_table("costs") as t:
        t.drop_index("ix_costs_at")
        t.drop_constraint("fk_costs_run_id", type_="foreignkey")
        for c in ("period_end", "gpu_hours", "provider", "run_id"):
            t.drop_column(c)
    with op.batch_alter_table("runs") as t:
        t.drop_index("ix_runs_started_at")
        for c in ("est_cost_usd", "est_hours", "output_dir", "resource_id"):
            t.drop_column(c)
