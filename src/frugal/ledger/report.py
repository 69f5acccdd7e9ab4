"""Reports over the books: spend grouped by project, team, model, GPU, provider, method,
outcome or any tag, with the month-end projection and the spend anomalies (`forecast.py`).

**Attribution.** A run counts, with all its dollars, in the period its start (`started_at`)
falls in, however long it ran; another cost counts by its date (`at`, the start of its
charge period). A cost matched to a run (a billing row of the run's machine) is in the
run's dollars already and is not added again. Dry runs count: they were paid for. This is
how budgets count spend (`budgets.spend`), which the projection uses.

**Per group**: spend (runs + other costs), GPU-hours (runs' hours x GPUs + the GPU-hours
of other costs), tokens, dollars per million tokens (runs' dollars / runs' tokens: what the
compute that made the tokens cost), runs by outcome, dollars lost to failed and preempted
runs, and the estimate error: over *completed* runs with an estimate (`est_cost_usd`), the
median of |actual / estimate - 1| and the median of actual / estimate - 1, in percent (a
stopped run's dollars say nothing about its estimate).

**Projection** and **anomalies**: `forecast.py`.

Everything is aggregated in SQL (GROUP BY, a join on tags for tag groupings, made once);
the estimate ratios of a group come back as one comma-separated text, for the medians. No
run is loaded as an object. Weeks start on Monday 00:00 UTC.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, String, and_, case, cast, func, literal_column, select
from sqlalchemy.orm import Session, aliased

from frugal.errors import FrugalError
from frugal.ledger.budgets import utc_day
from frugal.ledger.forecast import ANOMALY_RULE, Anomaly, Projection, anomalies, projection
from frugal.ledger.periods import (
    Period,
    parse_period,
)
from frugal.ledger.schema import CostEntry, RunRecord, Tag
from frugal.ledger.store import Ledger, aware, now
from frugal.ledger.tags import STANDARD, check_key

OUTCOMES = ("completed", "preempted", "budget-stopped", "idle-stopped", "failed")
RUNNING = "running"  # a run without an outcome yet
LOST = ("failed", "preempted")
NONE = "(none)"  # the group of spend without the tag (or a cost, by a run-only column)
TOTAL = "(total)"
RUN_COLUMNS = ("gpu", "provider", "method", "outcome")
BY_FORMS = "project, team, model, gpu, provider, method, outcome or tag:NAME"


# -- grouping --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grouping:
    name: str  # as asked: project, gpu, tag:env, ...
    column: str | None = None  # a run column (costs have provider only)
    key: str | None = None  # a tag key; for model, runs without the tag take their column


def parse_by(text: str) -> Grouping:
    t = text.strip()
    if t in RUN_COLUMNS:
        return Grouping(t, column=t)
    if t.startswith("tag:"):
        return Grouping(t, key=check_key(t[4:].strip(), "--by tag:"))
    if t in STANDARD:
        return Grouping(t, key=t)
    raise FrugalError(f"--by {text!r}: use {BY_FORMS}")


def label(value: Any, column: str | None = None) -> str:
    if value is None and column == "outcome":
        return RUNNING
    return NONE if value is None or value == "" else str(value)


# -- the report ------------------------------------------------------------------------------


@dataclass
class Group:
    name: str
    run_usd: float = 0.0
    other_usd: float = 0.0
    gpu_hours: float = 0.0
    tokens: float = 0.0
    runs: int = 0
    other_costs: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*OUTCOMES, RUNNING), 0))
    lost_usd: float = 0.0
    errors_pct: list[float] = field(default_factory=list)  # actual / estimate - 1, in %

    @property
    def spend_usd(self) -> float:
        return self.run_usd + self.other_usd

    @property
    def usd_per_million_tokens(self) -> float | None:
        return self.run_usd / self.tokens * 1e6 if self.tokens > 0 else None

    @property
    def est_error_median_abs_pct(self) -> float | None:
        return statistics.median(abs(e) for e in self.errors_pct) if self.errors_pct else None

    @property
    def est_error_median_pct(self) -> float | None:
        return statistics.median(self.errors_pct) if self.errors_pct else None

    def add(self, other: Group) -> None:
        self.run_usd += other.run_usd
        self.other_usd += other.other_usd
        self.gpu_hours += other.gpu_hours
        self.tokens += other.tokens
        self.runs += other.runs
        self.other_costs += other.other_costs
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        self.lost_usd += other.lost_usd
        self.errors_pct += other.errors_pct

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.name,
            "spend_usd": _r(self.spend_usd),
            "run_spend_usd": _r(self.run_usd),
            "other_spend_usd": _r(self.other_usd),
            "gpu_hours": _r(self.gpu_hours),
            "tokens": self.tokens,
            "usd_per_million_tokens": _r(self.usd_per_million_tokens),
            "runs": self.runs,
            "runs_by_outcome": dict(self.outcomes),
            "other_costs": self.other_costs,
            "lost_usd": _r(self.lost_usd),
            "est_error_median_abs_pct": _r(self.est_error_median_abs_pct, 2),
            "est_error_median_pct": _r(self.est_error_median_pct, 2),
            "est_error_runs": len(self.errors_pct),
        }


CSV_COLUMNS = (
    "group",
    "spend_usd",
    "run_spend_usd",
    "other_spend_usd",
    "gpu_hours",
    "tokens",
    "usd_per_million_tokens",
    "runs",
    *(o.replace("-", "_") for o in OUTCOMES),
    RUNNING,
    "other_costs",
    "lost_usd",
    "est_error_median_abs_pct",
    "est_error_median_pct",
    "est_error_runs",
)


def csv_row(g: Group) -> list[Any]:
    j = g.to_json()
    out = j | {o.replace("-", "_"): n for o, n in g.outcomes.items()}
    return ["" if out[c] is None else out[c] for c in CSV_COLUMNS]


@dataclass
class SpendReport:
    period: Period
    by: str
    groups: list[Group]
    totals: Group
    projection: Projection | None = None
    anomalies: list[Anomaly] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "period": self.period.to_json(),
            "by": self.by,
            "attribution": "runs by their start, other costs by their date",
            "groups": [g.to_json() for g in self.groups],
            "totals": self.totals.to_json(),
            "projection": self.projection.to_json() if self.projection else None,
            "anomalies": [a.to_json() for a in self.anomalies],
            "anomaly_rule": ANOMALY_RULE,
        }


def report(
    led: Ledger,
    by: str = "project",
    period: str = "this-month",
    at: datetime | None = None,
    extras: bool = True,
) -> SpendReport:
    """The report of `period` grouped `by`; `extras` adds the month-end projection and the
    anomalies of the period's days."""
    at = aware(at or now()).astimezone(UTC)
    g, p = parse_by(by), parse_period(period, at)
    with led.session() as s:
        groups = group_spend(s, g, p.start, p.end)
        biggest_first = sorted(groups.values(), key=lambda x: (-x.spend_usd, x.name))
        out = SpendReport(p, g.name, biggest_first, totals(groups.values()))
        if extras:
            out.projection = projection(s, at)
            out.anomalies = anomalies(s, p.start, p.end, at)
    return out


def totals(groups: Iterable[Group]) -> Group:
    t = Group(TOTAL)
    for g in groups:
        t.add(g)
    return t


def within(col: Any, start: datetime | None, end: datetime | None) -> list[ColumnElement[bool]]:
    return [
        *([col >= start] if start is not None else []),
        *([col < end] if end is not None else []),
    ]


def _run_key(g: Grouping, t: Any) -> Any:
    """A run's group: its column, or the value of its tag (joined as `t`)."""
    if g.column:
        return getattr(RunRecord, g.column)
    if g.key == "model":
        return func.coalesce(t.value, RunRecord.model)
    return t.value


def _cost_key(g: Grouping, c: Any) -> Any:
    """A cost's group: its provider or the value of its tag (joined as `c`); None when a
    cost has no such thing (it is `(none)`)."""
    if g.column == "provider":
        return CostEntry.provider
    return c.value if g.key else None


def _join_run_tag(q: Any, g: Grouping, t: Any) -> Any:
    if not g.key:
        return q
    return q.outerjoin(t, and_(t.kind == "run", t.ref == RunRecord.id, t.key == g.key))


def _join_cost_tag(q: Any, g: Grouping, c: Any) -> Any:
    if not g.key:
        return q
    ref = cast(CostEntry.id, String)
    return q.outerjoin(c, and_(c.kind == "cost", c.ref == ref, c.key == g.key))


def daily_spend_by(
    led: Ledger, by: str, period: str, at: datetime | None = None
) -> dict[str, dict[str, float]]:
    """Dollars per group and UTC day of `period` (day as YYYY-MM-DD), counted as reports
    count them: runs on the day they started, unmatched costs on their date."""
    g, p = parse_by(by), parse_period(period, at)
    out: dict[str, dict[str, float]] = {}
    with led.session() as s:
        dialect = s.get_bind().dialect.name
        t, c = aliased(Tag), aliased(Tag)
        rk, rd = _run_key(g, t), utc_day(RunRecord.started_at, dialect)
        runs = _join_run_tag(select(rk, rd, func.sum(RunRecord.cost_usd)), g, t)
        runs = runs.where(*within(RunRecord.started_at, p.start, p.end)).group_by(rk, rd)
        ck, cd = _cost_key(g, c), utc_day(CostEntry.at, dialect)
        cols = [ck] if ck is not None else [literal_column("NULL")]
        costs = _join_cost_tag(select(*cols, cd, func.sum(CostEntry.amount_usd)), g, c)
        costs = costs.where(CostEntry.run_id.is_(None), *within(CostEntry.at, p.start, p.end))
        costs = costs.group_by(*([ck] if ck is not None else []), cd)
        for q, column in ((runs, g.column), (costs, None)):
            for key, day, usd in s.execute(q):
                days = out.setdefault(label(key, column), {})
                d = str(day)[:10]
                days[d] = days.get(d, 0.0) + float(usd or 0.0)
    return out


def group_spend(
    s: Session, g: Grouping, start: datetime | None, end: datetime | None
) -> dict[str, Group]:
    """Spend in [start, end) by group: runs by start, unmatched costs by date."""
    groups: dict[str, Group] = {}

    def group(name: str) -> Group:
        return groups.setdefault(name, Group(name))

    _add_runs(s, g, start, end, group)
    _add_costs(s, g, start, end, group)
    return groups


def _add_runs(
    s: Session,
    g: Grouping,
    start: datetime | None,
    end: datetime | None,
    group: Callable[[str], Group],
) -> None:
    """Each group's runs of [start, end): dollars, GPU-hours, tokens, outcomes, estimate
    errors."""
    t = aliased(Tag)
    run_key = _run_key(g, t)
    lost = case((RunRecord.outcome.in_(LOST), RunRecord.cost_usd), else_=0.0)
    # the estimate's ratios ride along as text, so the join on tags is made once
    ratio = case(
        (
            and_(RunRecord.outcome == "completed", RunRecord.est_cost_usd > 0),
            RunRecord.cost_usd / RunRecord.est_cost_usd,
        ),
    )
    q = select(
        run_key,
        func.count(),
        func.sum(RunRecord.cost_usd),
        func.sum(RunRecord.hours * RunRecord.gpus),
        func.sum(RunRecord.tokens),
        func.sum(lost),
        _concat(ratio, s.get_bind().dialect.name),
        RunRecord.outcome,
    ).where(*within(RunRecord.started_at, start, end))
    q = _join_run_tag(q, g, t)
    for key, n, usd, gpu_h, tokens, lost_usd, ratios, outcome in s.execute(
        q.group_by(run_key, RunRecord.outcome)
    ):
        x = group(label(key, g.column))
        x.runs += n
        x.run_usd += usd or 0.0
        x.gpu_hours += gpu_h or 0.0
        x.tokens += tokens or 0.0
        x.lost_usd += lost_usd or 0.0
        x.outcomes[outcome or RUNNING] = x.outcomes.get(outcome or RUNNING, 0) + n
        if ratios:
            x.errors_pct += [(float(r) - 1.0) * 100.0 for r in ratios.split(",")]


def _add_costs(
    s: Session,
    g: Grouping,
    start: datetime | None,
    end: datetime | None,
    group: Callable[[str], Group],
) -> None:
    """Each group's costs of [start, end) not matched to a run."""
    c = aliased(Tag)
    cost_key = _cost_key(g, c)
    cq = select(
        *([cost_key] if cost_key is not None else []),
        func.count(),
        func.sum(CostEntry.amount_usd),
        func.sum(CostEntry.gpu_hours),
    ).where(CostEntry.run_id.is_(None), *within(CostEntry.at, start, end))
    cq = _join_cost_tag(cq, g, c)
    if cost_key is not None:
        cq = cq.group_by(cost_key)
    for row in s.execute(cq):
        key = row[0] if cost_key is not None else None
        n, usd, gpu_h = row[-3:]
        if not n:
            continue
        x = group(label(key))
        x.other_costs += n
        x.other_usd += usd or 0.0
        x.gpu_hours += gpu_h or 0.0


def _concat(expr: Any, dialect: str) -> Any:
    """The group's non-null values of `expr` as comma-separated text (SQLite writes a REAL
    with 15 significant digits, PostgreSQL exactly)."""
    if dialect == "postgresql":
        return func.string_agg(cast(expr, String), literal_column("','"))
    return func.group_concat(expr, literal_column("','"))


# -- formatting helpers ----------------------------------------------------------------------


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)
