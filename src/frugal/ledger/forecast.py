"""What the books say of spend to come and of odd days: this month's spend at its end, and
the days whose spend is anomalous (`frugal costs report`, the dashboard).

**Projection**: this calendar month's spend so far + the daily rate of the last 7 days
(fewer when the books are younger, at least one) x the days left in the month.

**Anomalies**: a day's spend is anomalous when it exceeds the median of the 14 days
before it by more than 3.5 x max(1.4826 x MAD, 10% of the median) and by at least $10
(MAD: the median absolute deviation of those 14 days; days without spend count as $0;
a day needs 7 days of books before it). 1.4826 x MAD estimates the standard deviation
of normal data, and 3.5 is Iglewicz and Hoaglin's cut on the modified z-score: the
median and MAD ignore earlier spikes, which a mean and a standard deviation would absorb.
The floors keep flat or sparse spend (MAD = 0) from flagging every small rise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from frugal.ledger.budgets import daily_spend, spend
from frugal.ledger.periods import period_end, period_start
from frugal.ledger.schema import CostEntry, RunRecord
from frugal.ledger.store import aware

PROJECTION_DAYS = 7
ANOMALY_WINDOW_DAYS = 14
ANOMALY_MIN_HISTORY_DAYS = 7
ANOMALY_K = 3.5  # Iglewicz-Hoaglin modified z-score cut
MAD_TO_SIGMA = 1.4826  # 1 / the normal's 0.75 quantile
ANOMALY_FLOOR_FRAC = 0.10  # the scale is at least this share of the median
ANOMALY_MIN_EXCESS_USD = 10.0


@dataclass
class Projection:
    month: str
    spent_usd: float
    rate_days: float
    rate_usd_per_day: float
    days_left: float
    projected_usd: float

    @property
    def how(self) -> str:
        return (
            f"${self.spent_usd:,.2f} so far in {self.month} + ${self.rate_usd_per_day:,.2f} a day "
            f"(the last {self.rate_days:g} days' mean) x {self.days_left:.1f} days left"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "month": self.month,
            "spent_usd": _r(self.spent_usd),
            "usd_per_day": _r(self.rate_usd_per_day),
            "rate_days": self.rate_days,
            "days_left": round(self.days_left, 3),
            "projected_usd": _r(self.projected_usd),
            "how": self.how,
        }


@dataclass
class Anomaly:
    day: date
    spend_usd: float
    baseline_usd: float  # the median of the days before
    threshold_usd: float

    def to_json(self) -> dict[str, Any]:
        return {
            "day": self.day.isoformat(),
            "spend_usd": _r(self.spend_usd),
            "baseline_usd": _r(self.baseline_usd),
            "threshold_usd": _r(self.threshold_usd),
        }


ANOMALY_RULE = (
    f"spend above the median of the {ANOMALY_WINDOW_DAYS} days before by more than "
    f"{ANOMALY_K:g} x max({MAD_TO_SIGMA} x MAD, {ANOMALY_FLOOR_FRAC:.0%} of the median) "
    f"and ${ANOMALY_MIN_EXCESS_USD:g}"
)


def first_spend(s: Session) -> datetime | None:
    """When the first dollar on the books was spent (a run's start or a cost's date)."""
    firsts = [
        s.scalar(select(func.min(RunRecord.started_at))),
        s.scalar(select(func.min(CostEntry.at))),
    ]
    found = [aware(t).astimezone(UTC) for t in firsts if t is not None]
    return min(found) if found else None


def projection(s: Session, at: datetime) -> Projection:
    """This month's spend at month end, if the last days' daily rate goes on."""
    m0 = period_start("month", at)
    m1 = period_end("month", m0)
    assert m1 is not None
    spent = spend(s, {}, m0, m1)
    first = first_spend(s)
    days = float(PROJECTION_DAYS)
    if first is not None and at - first < timedelta(days=PROJECTION_DAYS):
        days = float(max(1, (at - first).days + 1))  # young books: the days they cover
    rate = spend(s, {}, at - timedelta(days=days), at) / days
    left = (m1 - at).total_seconds() / 86400
    return Projection(m0.strftime("%Y-%m"), spent, days, rate, left, spent + rate * left)


def detect_anomalies(
    daily: dict[date, float], first: date, last: date, history_from: date
) -> list[Anomaly]:
    """Days in [first, last] whose spend is above the trailing baseline (module docstring);
    the books begin on `history_from` (earlier days are not zeros, they are unknown)."""
    out = []
    d = first
    while d <= last:
        window = [d - timedelta(days=k) for k in range(1, ANOMALY_WINDOW_DAYS + 1)]
        hist = [daily.get(x, 0.0) for x in window if x >= history_from]
        if len(hist) >= ANOMALY_MIN_HISTORY_DAYS:
            med = statistics.median(hist)
            mad = statistics.median(abs(x - med) for x in hist)
            scale = max(MAD_TO_SIGMA * mad, ANOMALY_FLOOR_FRAC * med)
            threshold = med + max(ANOMALY_K * scale, ANOMALY_MIN_EXCESS_USD)
            usd = daily.get(d, 0.0)
            if usd > threshold:
                out.append(Anomaly(d, usd, med, threshold))
        d += timedelta(days=1)
    return out


def anomalies(
    s: Session, start: datetime | None, end: datetime | None, at: datetime
) -> list[Anomaly]:
    """The anomalous days of [start, end), up to today."""
    first_at = first_spend(s)
    if first_at is None:
        return []
    history_from = first_at.date()
    first = max(start.date(), history_from) if start is not None else history_from
    stop = min(end, at) if end is not None else at
    last = (stop - timedelta(microseconds=1)).date()  # the last day with any of [start, stop)
    if last < first:
        return []
    since: datetime | None = datetime.combine(
        first - timedelta(days=ANOMALY_WINDOW_DAYS), datetime.min.time(), UTC
    )
    until: datetime | None = datetime.combine(last + timedelta(days=1), datetime.min.time(), UTC)
    # bounds that cut nothing are left out: a scan beats an index walk over most of the rows
    since = since if since is not None and since > first_at else None
    until = until if until is not None and until <= at else None
    return detect_anomalies(daily_spend(s, {}, since, until), first, last, history_from)


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)
