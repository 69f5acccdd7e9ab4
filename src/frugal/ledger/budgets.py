"""Budgets: money a scope of tags may spend per week, month or in total; their alerts; and
what they allow a run.

A budget's scope is a set of tags (`{"team": "nlp"}`; `{}` is everything): its spend in a
period is the dollars of the runs carrying all of them that started in the period, plus
the other costs (`frugal costs add`, imports) dated in it. Periods are calendar weeks
(Monday 00:00 UTC), calendar months, or all time.

- **Alerts**: each threshold (default 50/75/90/100 % of the amount) fires once per period,
  lowest first, however many processes see it crossed: the first to insert the
  (budget, period, threshold) row sends it; the others find it there.
- **Guardrail**: a run is refused before it starts when its estimate would cross the
  remainder of any budget in its scope (`--force` turns that into a warning).
- **Stop budgets** (`action="stop"`): at each heartbeat a run reserves what it will spend
  until the next one, `reserve()`: a heartbeat interval and the piece of work under way
  then, at its hourly price, or what is left when that is less. What is left is the
  amount, less the scope's spend on the books, less what the other running runs of the
  scope hold reserved. Reservations are made one at a time and recorded on the runs
  (`reserved_usd`), so the runs together can never be allowed more than the amount, however
  late their heartbeats come. A run whose steps use up its reservation before its next
  heartbeat is due asks again at once; its guard stops it before a step, checkpoint and
  export would cross what the budget has left for it. Of runs sharing the last dollars,
  the first to ask takes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import ColumnElement, String, cast, exists, func, literal_column, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from frugal.errors import FrugalError
from frugal.ledger.periods import BUDGET_PERIODS, period_start
from frugal.ledger.schema import Alert, Budget, CostEntry, RunRecord, Tag
from frugal.ledger.store import Ledger, aware, now

ACTIONS = ("warn", "stop")
DEFAULT_THRESHOLDS = (50.0, 75.0, 90.0, 100.0)
STALE_HEARTBEATS, STALE_MIN_S = 10, 600.0  # a running run silent this long has died


def tagged(kind: str, ref: Any, scope: dict[str, str]) -> list[ColumnElement[bool]]:
    """Conditions: the row (`kind`, `ref`) carries every tag of `scope`."""
    return [
        exists().where(Tag.kind == kind, Tag.ref == ref, Tag.key == k, Tag.value == str(v))
        for k, v in scope.items()
    ]


def spend(
    s: Session, scope: dict[str, str], since: datetime, until: datetime | None = None
) -> float:
    """Dollars spent in `scope` from `since` (to `until`): runs by their start, costs by date."""
    runs = select(func.coalesce(func.sum(RunRecord.cost_usd), 0.0)).where(
        RunRecord.started_at >= since, *tagged("run", RunRecord.id, scope)
    )
    costs = select(func.coalesce(func.sum(CostEntry.amount_usd), 0.0)).where(
        CostEntry.at >= since,
        CostEntry.run_id.is_(None),  # a cost matched to a run is in the run's dollars already
        *tagged("cost", cast(CostEntry.id, String), scope),
    )
    if until is not None:
        runs = runs.where(RunRecord.started_at < until)
        costs = costs.where(CostEntry.at < until)
    return float(s.scalar(runs) or 0.0) + float(s.scalar(costs) or 0.0)


def utc_day(col: Any, dialect: str) -> Any:
    """The UTC calendar day of a time column, as YYYY-MM-DD text."""
    if dialect == "postgresql":
        utc = func.timezone(literal_column("'UTC'"), col)
        return func.to_char(utc, literal_column("'YYYY-MM-DD'"))
    return func.date(col)  # SQLite keeps UTC times as ISO text


def daily_spend(
    s: Session, scope: dict[str, str], start: datetime | None, end: datetime | None
) -> dict[date, float]:
    """`spend` per UTC day in [start, end): runs on the day they started, unmatched costs
    on their date."""
    dialect = s.get_bind().dialect.name
    rd, cd = utc_day(RunRecord.started_at, dialect), utc_day(CostEntry.at, dialect)
    runs = select(rd, func.sum(RunRecord.cost_usd)).where(
        *tagged("run", RunRecord.id, scope),
        *([RunRecord.started_at >= start] if start is not None else []),
        *([RunRecord.started_at < end] if end is not None else []),
    )
    costs = select(cd, func.sum(CostEntry.amount_usd)).where(
        CostEntry.run_id.is_(None),
        *tagged("cost", cast(CostEntry.id, String), scope),
        *([CostEntry.at >= start] if start is not None else []),
        *([CostEntry.at < end] if end is not None else []),
    )
    out: dict[date, float] = {}
    for q in (runs.group_by(rd), costs.group_by(cd)):
        for day, usd in s.execute(q):
            d = date.fromisoformat(str(day)[:10])
            out[d] = out.get(d, 0.0) + float(usd or 0.0)
    return out


def in_scope(scope: dict[str, str], tags: dict[str, str]) -> bool:
    return all(tags.get(k) == v for k, v in scope.items())


# -- the budgets themselves ----------------------------------------------------------------


def parse_thresholds(text: str) -> tuple[float, ...]:
    try:
        values = sorted({float(x.strip().rstrip("%")) for x in text.split(",") if x.strip()})
    except ValueError:
        values = []
    if not values or any(not 0 < v <= 1000 for v in values):
        raise FrugalError(f"--thresholds {text!r}: give percents of the amount, e.g. 50,75,90,100")
    return tuple(values)


def set_budget(
    led: Ledger,
    name: str,
    amount_usd: float,
    period: str,
    scope: dict[str, str],
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    action: str = "warn",
) -> Budget:
    """Create or change the budget `name`."""
    if not name.strip():
        raise FrugalError("a budget needs a name, e.g. frugal budget set nlp-monthly ...")
    if not (math.isfinite(amount_usd) and amount_usd > 0):
        raise FrugalError(f"--amount {amount_usd}: a budget is a positive number of USD")
    if period not in BUDGET_PERIODS:
        raise FrugalError(f"--period {period!r}: use {', '.join(BUDGET_PERIODS)}")
    if action not in ACTIONS:
        raise FrugalError(f"--action {action!r}: use warn (alerts only) or stop")
    with led.session() as s:
        b = s.scalar(select(Budget).where(Budget.name == name))
        if b is None:
            b = Budget(name=name, created_at=now())
            s.add(b)
        b.amount_usd, b.period, b.scope = amount_usd, period, dict(scope)
        b.thresholds, b.action = sorted(thresholds), action
    return b


def budgets(led: Ledger) -> list[Budget]:
    with led.session() as s:
        return list(s.scalars(select(Budget).order_by(Budget.name)))


def remove_budget(led: Ledger, name: str) -> None:
    with led.session() as s:
        b = s.scalar(select(Budget).where(Budget.name == name))
        if b is None:
            known = ", ".join(x.name for x in s.scalars(select(Budget))) or "none"
            raise FrugalError(f"no budget named {name!r} (budgets: {known})")
        s.delete(b)


@dataclass(frozen=True)
class Status:
    budget: Budget
    period_start: datetime
    spent_usd: float

    @property
    def left_usd(self) -> float:
        return self.budget.amount_usd - self.spent_usd

    @property
    def used_pct(self) -> float:
        return 100.0 * self.spent_usd / self.budget.amount_usd

    def to_json(self) -> dict[str, Any]:
        b = self.budget
        return {
            "name": b.name,
            "scope": b.scope,
            "period": b.period,
            "action": b.action,
            "amount_usd": b.amount_usd,
            "thresholds_pct": b.thresholds,
            "period_start": self.period_start.isoformat(),
            "spent_usd": round(self.spent_usd, 4),
            "left_usd": round(self.left_usd, 4),
            "used_pct": round(self.used_pct, 2),
        }


def statuses(
    led: Ledger, tags: dict[str, str] | None = None, at: datetime | None = None
) -> list[Status]:
    """Each budget (those whose scope `tags` fall in, when given) with its spend so far."""
    at = at or now()
    out = []
    with led.session() as s:
        for b in s.scalars(select(Budget).order_by(Budget.name)):
            if tags is not None and not in_scope(b.scope, tags):
                continue
            start = period_start(b.period, at)
            out.append(Status(b, start, spend(s, b.scope, start)))
    return out


# -- alerts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlertEvent:
    budget: str
    scope: dict[str, str]
    period: str
    period_start: datetime
    threshold_pct: float
    spent_usd: float
    amount_usd: float
    action: str

    @property
    def message(self) -> str:
        scope = ", ".join(f"{k}={v}" for k, v in self.scope.items()) or "all spend"
        return (
            f"budget {self.budget} ({scope}): {self.threshold_pct:g}% reached, "
            f"${self.spent_usd:,.2f} of ${self.amount_usd:,.2f} this "
            f"{'period' if self.period == 'total' else self.period}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "scope": self.scope,
            "period": self.period,
            "threshold_pct": self.threshold_pct,
            "spent_usd": round(self.spent_usd, 4),
            "amount_usd": self.amount_usd,
            "action": self.action,
            "period_start": self.period_start.isoformat(),
            "message": self.message,
        }


def check_alerts(
    led: Ledger, tags: dict[str, str] | None = None, at: datetime | None = None
) -> list[AlertEvent]:
    """Fire the thresholds crossed and not yet fired (of the budgets whose scope `tags` fall
    in, or all): each once per period, lowest first. Returns the ones this call fired."""
    fired = []
    for st in statuses(led, tags, at):
        b = st.budget
        for pct in sorted(b.thresholds):
            if st.used_pct < pct:
                break
            if _claim(led, b.id, st.period_start, pct, st.spent_usd):
                fired.append(
                    AlertEvent(
                        b.name,
                        b.scope,
                        b.period,
                        st.period_start,
                        pct,
                        st.spent_usd,
                        b.amount_usd,
                        b.action,
                    )
                )
    return fired


def _claim(led: Ledger, budget_id: int, start: datetime, pct: float, spent: float) -> bool:
    """Insert the alert's row; False when another process already did."""
    try:
        with led.session() as s:
            s.add(
                Alert(
                    budget_id=budget_id,
                    period_start=start,
                    threshold=pct,
                    fired_at=now(),
                    spend_usd=spent,
                )
            )
        return True
    except IntegrityError:
        return False


def alerts(led: Ledger) -> list[tuple[str, Alert]]:
    with led.session() as s:
        rows = s.execute(
            select(Budget.name, Alert).join(Alert, Alert.budget_id == Budget.id).order_by(Alert.id)
        )
        return [(name, a) for name, a in rows]


# -- what budgets allow a run -------------------------------------------------------------------


def guardrail(led: Ledger, tags: dict[str, str], estimate_usd: float | None) -> list[str]:
    """Why a run estimated at `estimate_usd` (None: not estimated) should not start: it
    would cross a budget in its scope, or a stop budget there is spent (empty: fine)."""
    why = []
    for st in statuses(led, tags):
        b = st.budget
        if estimate_usd is not None and estimate_usd > st.left_usd:
            why.append(
                f"budget {b.name} has ${max(st.left_usd, 0):,.2f} left this {b.period} "
                f"and the plan's estimate is ${estimate_usd:,.2f}"
            )
        elif b.action == "stop" and st.left_usd <= 0:
            why.append(
                f"stop budget {b.name} is spent this {b.period} "
                f"(${st.spent_usd:,.2f} of ${b.amount_usd:,.2f})"
            )
    return why


@dataclass(frozen=True)
class Allowance:
    """What a stop budget lets a run spend from now until it asks again."""

    usd: float  # reserved for the run: no other run of the scope can be given it
    left_usd: float  # what the budget had for the run: the most it could have reserved
    budget: str


def reserve(
    led: Ledger,
    run_id: str,
    tags: dict[str, str],
    spent_usd: float,
    want_usd: float,
    interval_s: float,
    at: datetime | None = None,
) -> Allowance | None:
    """Reserve for the run up to `want_usd` more of every stop budget in its scope (None:
    there is none), and record the dollars it may reach, `spent_usd` and that, on its
    record. A budget's remainder is its amount, less the scope's spend on the books, less
    what each other running run of the scope has reserved beyond its recorded dollars (a
    run that has reserved nothing yet: its hourly price for the time since its last
    heartbeat and an `interval_s`; a run silent for long has died and holds nothing).
    One process reserves at a time (the ledger's exclusive session), so however late the
    runs' heartbeats come, what they may spend together never exceeds the amount."""
    at = at or now()
    least: Allowance | None = None
    with led.exclusive() as s:
        me = s.get(RunRecord, run_id)
        if me is None:
            return None
        for b in s.scalars(select(Budget).where(Budget.action == "stop")):
            if not in_scope(b.scope, tags):
                continue
            start = period_start(b.period, me.started_at)  # where the run's dollars count
            left = b.amount_usd - spend(s, b.scope, start) - max(0.0, spent_usd - me.cost_usd)
            left -= _held(s, b, start, run_id, interval_s, at)
            if least is None or left < least.left_usd:
                least = Allowance(max(0.0, min(want_usd, left)), left, b.name)
        me.reserved_usd = None if least is None else spent_usd + least.usd
    return least


def _held(
    s: Session, b: Budget, start: datetime, asker: str, interval_s: float, at: datetime
) -> float:
    """What the other running runs of `b`'s scope hold beyond their recorded dollars."""
    running = s.scalars(
        select(RunRecord).where(
            RunRecord.ended_at.is_(None),
            RunRecord.started_at >= start,
            RunRecord.id != asker,
            *tagged("run", RunRecord.id, b.scope),
        )
    )
    held = 0.0
    for r in running:
        since = max(0.0, (at - aware(r.heartbeat_at)).total_seconds())
        if since > max(STALE_HEARTBEATS * interval_s, STALE_MIN_S):
            continue  # no heartbeat for long: a run that died without an end
        if r.reserved_usd is not None:
            held += max(0.0, r.reserved_usd - r.cost_usd)
        else:  # on the books, not yet reserved: what it may have spent since it was seen
            held += (r.price_per_hour_usd or 0.0) / 3600 * (since + interval_s)
    return held
