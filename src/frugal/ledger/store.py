"""Writing to and reading from the ledger: plans, runs (start, heartbeats, end), other costs.

Every write is one short transaction, so concurrent runs and their heartbeats interleave
safely (SQLite serializes them through its busy timeout; PostgreSQL through row locks).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Required, TypedDict, Unpack

from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from frugal.ledger.db import engine
from frugal.ledger.schema import CostEntry, Heartbeat, PlanRecord, RunRecord, Tag
from frugal.times import utc


def now() -> datetime:
    return datetime.now(UTC)


def aware(t: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC); PostgreSQL aware ones."""
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def stored(t: datetime | None) -> datetime:
    """A time to store: in UTC (SQLite keeps the wall clock of an aware time as given, so
    every write converts), now when None."""
    return now() if t is None else utc(t)


class RunStart(TypedDict, total=False):
    """A run as it starts (`Ledger.start_run`; a spooled start keeps these fields)."""

    model: Required[str]
    method: Required[str]
    config: Required[dict[str, Any]]  # the run config as trained
    price_per_hour_usd: Required[float | None]
    provider: str  # "local" when not given
    instance: str
    region: str
    gpu: str
    gpus: int  # 1 when not given
    spot: bool
    plan_id: int | None  # the plan it runs, when on the same books
    dry_run: bool
    predicted: dict[str, Any] | None  # the estimate of its hours, dollars, memory, speed
    tags: dict[str, str] | None
    run_id: str | None  # a new id when not given
    resource_id: str  # the machine it runs on
    output_dir: str


class RunEnd(TypedDict, total=False):
    """Where a run ended (`Ledger.end_run`)."""

    step: Required[int]
    tokens: Required[float]
    cost_usd: Required[float]
    hours: Required[float]
    predicted: dict[str, Any] | None  # replaces the start's, refined as the run went


class CostMore(TypedDict, total=False):
    """A cost's details beyond its amount and kind (`Ledger.add_cost`)."""

    tags: dict[str, str] | None
    run_id: str | None  # the run whose dollars it is (matched from a bill): not counted twice
    provider: str
    gpu_hours: float
    period_end: datetime | None  # a bill's line covers a period


class Ledger:
    def __init__(self, url: str | None = None) -> None:
        self.engine: Engine = engine(url)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def exclusive(self) -> Iterator[Session]:
        """A session that writes alone from its first statement, so what it reads stays
        true until it commits: an import that skips the rows already on the books, run
        twice at once, adds them once. SQLite: a no-op write takes the database's one write
        lock (the other writer waits, busy_timeout); PostgreSQL: an advisory lock."""
        with self.session() as s:
            if s.get_bind().dialect.name == "postgresql":
                s.execute(text("SELECT pg_advisory_xact_lock(7340032)"))
            else:
                s.execute(text("UPDATE alembic_version SET version_num = version_num"))
            yield s

    def _tag(self, s: Session, kind: str, ref: str, tags: dict[str, str]) -> None:
        s.add_all(Tag(kind=kind, ref=ref, key=k, value=str(v)[:300]) for k, v in tags.items())

    def record_plan(
        self, plan: dict[str, Any], model: str, tokens: float, tags: dict[str, str] | None = None
    ) -> int:
        """Record a plan: what `frugal plan --json` prints (its `recommendation` fills the
        columns), or the recommendation object alone."""
        whole, plan = plan, plan.get("recommendation", plan)
        with self.session() as s:
            rec = PlanRecord(
                created_at=now(),
                model=model,
                method=plan["method"],
                provider=plan["provider"],
                instance=plan["instance"],
                region=plan.get("region") or "",
                gpu=plan["gpu"],
                gpus=plan["gpus"],
                spot=plan["spot"],
                price_per_hour_usd=plan["price_per_hour_usd"],
                est_hours=plan["est_hours"],
                est_cost_usd=plan["est_cost_usd"],
                tokens=tokens,
                record=whole,
            )
            s.add(rec)
            s.flush()
            self._tag(s, "plan", str(rec.id), tags or {})
            return rec.id

    def start_run(self, at: datetime | None = None, **run: Unpack[RunStart]) -> str:
        """Record a run's start (at `at`, default now); returns its id. Starting a run id
        that is already on the books (a resumed run, a spooled start sent twice) keeps the
        first record."""
        rid = run.get("run_id") or str(uuid.uuid4())
        t = stored(at)
        predicted = run.get("predicted") or {}
        plan_id = run.get("plan_id")
        with self.session() as s:
            if s.get(RunRecord, rid) is not None:
                return rid
            if plan_id is not None and s.get(PlanRecord, plan_id) is None:
                plan_id = None  # planned against another ledger: not on these books
            s.add(
                RunRecord(
                    id=rid,
                    plan_id=plan_id,
                    started_at=t,
                    heartbeat_at=t,
                    ended_at=None,
                    outcome=None,
                    dry_run=run.get("dry_run", False),
                    model=run["model"],
                    method=run["method"],
                    provider=run.get("provider", "local"),
                    instance=run.get("instance", ""),
                    region=run.get("region", ""),
                    gpu=run.get("gpu", ""),
                    gpus=run.get("gpus", 1),
                    spot=run.get("spot", False),
                    price_per_hour_usd=run["price_per_hour_usd"],
                    step=0,
                    tokens=0.0,
                    cost_usd=0.0,
                    hours=0.0,
                    config=run["config"],
                    predicted=predicted,
                    actual={},
                    resource_id=run.get("resource_id", "")[:300],
                    output_dir=run.get("output_dir", "")[:1000],
                    est_hours=predicted.get("hours"),
                    est_cost_usd=predicted.get("cost_usd"),
                )
            )
            s.flush()
            self._tag(s, "run", rid, run.get("tags") or {})
        return rid

    def resume_run(self, run_id: str, at: datetime | None = None) -> None:
        """A run on the books starts again (resumed after a stop, at `at`): running until it
        ends."""
        with self.session() as s:
            run = s.get(RunRecord, run_id, with_for_update=True)
            if run is not None:  # seen now: other runs of its budgets count it as running
                run.ended_at = run.outcome = None
                run.heartbeat_at = stored(at)

    def heartbeat(
        self,
        run_id: str,
        step: int,
        tokens: float,
        cost_usd: float,
        at: datetime | None = None,
        total_steps: int | None = None,
    ) -> None:
        """A run's progress at `at` (default now). The same heartbeat sent twice (a spool
        flushed again after a crash) is kept once."""
        explicit, t = at is not None, stored(at)
        with self.session() as s:
            run = s.get(RunRecord, run_id, with_for_update=True)
            if explicit and s.scalar(
                select(Heartbeat.id).where(Heartbeat.run_id == run_id, Heartbeat.at == t)
            ):
                return
            s.add(Heartbeat(run_id=run_id, at=t, step=step, tokens=tokens, cost_usd=cost_usd))
            if run is not None and run.ended_at is None and t >= aware(run.heartbeat_at):
                run.heartbeat_at, run.step, run.tokens, run.cost_usd = t, step, tokens, cost_usd
                if total_steps is not None:
                    run.total_steps = total_steps

    def end_run(
        self,
        run_id: str,
        outcome: str,
        actual: dict[str, Any],
        at: datetime | None = None,
        **end: Unpack[RunEnd],
    ) -> None:
        """A run's end; `predicted` replaces the start's prediction (refined once the run
        knew its micro-batch and device)."""
        predicted = end.get("predicted")
        with self.session() as s:
            run = s.get(RunRecord, run_id, with_for_update=True)
            if run is None:
                raise KeyError(run_id)
            run.ended_at, run.outcome, run.actual = stored(at), outcome, actual
            if predicted is not None:
                run.predicted = predicted
                run.est_hours, run.est_cost_usd = predicted.get("hours"), predicted.get("cost_usd")
            run.heartbeat_at = run.ended_at
            run.step, run.tokens = end["step"], end["tokens"]
            run.cost_usd, run.hours = end["cost_usd"], end["hours"]

    def add_cost(
        self,
        amount_usd: float,
        kind: str,
        description: str = "",
        resource_id: str = "",
        source: str = "manual",
        at: datetime | None = None,
        **more: Unpack[CostMore],
    ) -> int:
        """Put a cost on the books (at `at`, default now); returns its id."""
        end = more.get("period_end")
        with self.session() as s:
            c = CostEntry(
                at=stored(at),
                kind=kind,
                amount_usd=amount_usd,
                description=description[:500],
                resource_id=resource_id[:300],
                source=source[:300],
                run_id=more.get("run_id"),
                provider=more.get("provider", "")[:50],
                gpu_hours=more.get("gpu_hours", 0.0),
                period_end=None if end is None else stored(end),
            )
            s.add(c)
            s.flush()
            self._tag(s, "cost", str(c.id), more.get("tags") or {})
            return c.id

    def run(self, run_id: str) -> RunRecord | None:
        with self.session() as s:
            return s.get(RunRecord, run_id)

    def runs(self) -> list[RunRecord]:
        with self.session() as s:
            return list(s.scalars(select(RunRecord).order_by(RunRecord.started_at)))

    def tags(self, kind: str, ref: str) -> dict[str, str]:
        with self.session() as s:
            rows = s.scalars(select(Tag).where(Tag.kind == kind, Tag.ref == ref))
            return {t.key: t.value for t in rows}

    def total_cost(self) -> float:
        """All dollars on the books (a cost matched to a run is in the run's)."""
        with self.session() as s:
            runs = sum(r.cost_usd for r in s.scalars(select(RunRecord)))
            other = s.scalars(select(CostEntry).where(CostEntry.run_id.is_(None)))
            return runs + sum(c.amount_usd for c in other)
