"""The ledger's tables. Prices are stored as they were at the time (a plan's, a run's hourly
price at launch): nothing is re-priced later from today's catalog. Changing a table means a
new Alembic migration in `migrations/versions/` (a test compares the two)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        datetime: DateTime(timezone=True),
    }


class JobOnOffer:
    """What was trained on what: the columns a plan and a run share."""

    model: Mapped[str] = mapped_column(String(300))
    method: Mapped[str] = mapped_column(String(20))
    provider: Mapped[str] = mapped_column(String(50))
    instance: Mapped[str] = mapped_column(String(100))
    region: Mapped[str] = mapped_column(String(50))
    gpu: Mapped[str] = mapped_column(String(50))
    gpus: Mapped[int]
    spot: Mapped[bool]


class PlanRecord(JobOnOffer, Base):
    """A plan `frugal plan` chose, with its estimate."""

    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime]
    price_per_hour_usd: Mapped[float] = mapped_column(Float)
    est_hours: Mapped[float] = mapped_column(Float)
    est_cost_usd: Mapped[float] = mapped_column(Float)
    tokens: Mapped[float] = mapped_column(Float)
    record: Mapped[dict[str, Any]]  # the plan's whole JSON, as printed by --json


class RunRecord(JobOnOffer, Base):
    """One `frugal train` run: its start, its last heartbeat, its end."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_started_at", "started_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id"))
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(String(20))  # None while running
    dry_run: Mapped[bool]
    price_per_hour_usd: Mapped[float | None] = mapped_column(Float)  # at launch
    step: Mapped[int]
    tokens: Mapped[float] = mapped_column(Float)
    cost_usd: Mapped[float] = mapped_column(Float)
    hours: Mapped[float] = mapped_column(Float)
    config: Mapped[dict[str, Any]]
    predicted: Mapped[dict[str, Any]]
    actual: Mapped[dict[str, Any]]
    # revision 0002
    resource_id: Mapped[str] = mapped_column(String(300), server_default="")  # the machine's
    output_dir: Mapped[str] = mapped_column(String(1000), server_default="")
    est_hours: Mapped[float | None] = mapped_column(Float)  # the prediction, for reports
    est_cost_usd: Mapped[float | None] = mapped_column(Float)
    # revision 0003
    total_steps: Mapped[int | None]  # sent with the heartbeats: a live page's ETA
    # revision 0004: the dollars a running run may reach before it asks again (stop budgets)
    reserved_usd: Mapped[float | None] = mapped_column(Float)

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus


class Tag(Base):
    """A tag of a plan, a run or a cost entry (project, team, model, env, user, or free)."""

    __tablename__ = "tags"
    __table_args__ = (Index("ix_tags_key_value", "key", "value"),)

    kind: Mapped[str] = mapped_column(String(10), primary_key=True)  # plan | run | cost
    ref: Mapped[str] = mapped_column(String(36), primary_key=True)
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(String(300))


class Heartbeat(Base):
    __tablename__ = "heartbeats"
    __table_args__ = (Index("ix_heartbeats_run", "run_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    at: Mapped[datetime]
    step: Mapped[int]
    tokens: Mapped[float] = mapped_column(Float)
    cost_usd: Mapped[float] = mapped_column(Float)


class CostEntry(Base):
    """Money spent outside `frugal train`: a notebook's GPU hours, a storage bill, a row of
    a FOCUS billing export."""

    __tablename__ = "costs"
    __table_args__ = (Index("ix_costs_at", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(50))
    amount_usd: Mapped[float] = mapped_column(Float)
    description: Mapped[str] = mapped_column(String(500))
    resource_id: Mapped[str] = mapped_column(String(300))
    source: Mapped[str] = mapped_column(String(300))
    # revision 0002
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id"))  # the run it paid for
    provider: Mapped[str] = mapped_column(String(50), server_default="")
    gpu_hours: Mapped[float] = mapped_column(Float, server_default="0")
    period_end: Mapped[datetime | None]  # `at` is the start of the charge period


class Budget(Base):
    """Money a scope (runs and costs carrying all of `scope`'s tags) may spend per period."""

    __tablename__ = "budgets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime]
    scope: Mapped[dict[str, Any]]  # tag key -> value; {} is everything
    period: Mapped[str] = mapped_column(String(10))  # week | month | total
    amount_usd: Mapped[float] = mapped_column(Float)
    thresholds: Mapped[list[float]] = mapped_column(JSON)  # percent of amount, ascending
    action: Mapped[str] = mapped_column(String(10))  # warn | stop


class Alert(Base):
    """A threshold of a budget that fired in one period: the unique key makes it fire once,
    however many processes see it crossed."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("budget_id", "period_start", "threshold"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    budget_id: Mapped[int] = mapped_column(ForeignKey("budgets.id", ondelete="CASCADE"))
    period_start: Mapped[datetime]
    threshold: Mapped[float] = mapped_column(Float)
    fired_at: Mapped[datetime]
    spend_usd: Mapped[float] = mapped_column(Float)
