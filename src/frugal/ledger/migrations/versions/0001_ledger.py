"""The ledger: plans, runs, tags, heartbeats, other costs.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

WHEN = sa.DateTime(timezone=True)


def _job_on_offer() -> list[sa.Column]:
    """What was trained on what: the columns plans and runs share (fresh for each table)."""
    return [
        sa.Column("model", sa.String(300), nullable=False),
        sa.Column("method", sa.String(20), nullable=False),
        sa.Column("provider", sa.String(50), nullable=False),
        sa.Column("instance", sa.String(100), nullable=False),
        sa.Column("region", sa.String(50), nullable=False),
        sa.Column("gpu", sa.String(50), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("created_at", WHEN, nullable=False),
        *_job_on_offer(),
        sa.Column("price_per_hour_usd", sa.Float(), nullable=False),
        sa.Column("est_hours", sa.Float(), nullable=False),
        sa.Column("est_cost_usd", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("plan_id", sa.Integer(), sa.ForeignKey("plans.id"), nullable=True),
        sa.Column("started_at", WHEN, nullable=False),
        sa.Column("heartbeat_at", WHEN, nullable=False),
        sa.Column("ended_at", WHEN, nullable=True),
        sa.Column("outcome", sa.String(20), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        *_job_on_offer(),
        sa.Column("price_per_hour_usd", sa.Float(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("hours", sa.Float(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("predicted", sa.JSON(), nullable=False),
        sa.Column("actual", sa.JSON(), nullable=False),
    )
    op.create_table(
        "tags",
        sa.Column("kind", sa.String(10), primary_key=True),
        sa.Column("ref", sa.String(36), primary_key=True),
        sa.Column("key", sa.String(100), primary_key=True),
        sa.Column("value", sa.String(300), nullable=False),
    )
    op.create_index("ix_tags_key_value", "tags", ["key", "value"])
    op.create_table(
        "heartbeats",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(36), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("at", WHEN, nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
    )
    op.create_index("ix_heartbeats_run", "heartbeats", ["run_id", "at"])
    op.create_table(
        "costs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", WHEN, nullable=False),
        sa.Column("kind", sa.String(50), nullable=False),
        sa.Column("amount_usd", sa.Float(), nullable=False),
        sa.Column("description", sa.String(500), nullable=False),
        sa.Column("resource_id", sa.String(300), nullable=False),
        sa.Column("source", sa.String(300), nullable=False),
    )


def downgrade() -> None:
    for table in ("costs", "heartbeats", "tags", "runs", "plans"):
        op.drop_table(table)
