"""Periods of the books: a budget's period (week, month, total) and where one starts and
ends, and the periods a report or showback is asked for (`--period this-month`, `7d`,
`2026-05`, `FROM..TO`, `--week 2026-W19`), all in UTC. One module for both, so a budget's
month and a report's month are the same month."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

from frugal.durations import parse_duration
from frugal.errors import FrugalError
from frugal.ledger.store import aware, now
from frugal.times import EARLIEST, OutsideYears, check_time, parse_time

BudgetPeriod = Literal["week", "month", "total"]
BUDGET_PERIODS: tuple[BudgetPeriod, ...] = ("week", "month", "total")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the start of a "total" budget's one period


def period_start(period: str, at: datetime) -> datetime:
    at = aware(at).astimezone(UTC)
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return EPOCH


def period_end(period: str, start: datetime) -> datetime | None:
    if period == "week":
        return start + timedelta(days=7)
    if period == "month":
        return (start + timedelta(days=32)).replace(day=1)
    return None


def parse_instant(text: str, where: str) -> datetime:
    """An ISO 8601 date or time as an aware UTC datetime (a time without a zone is UTC),
    within the years the books hold (frugal.times)."""
    try:
        return parse_time(text)
    except ValueError as e:
        raise FrugalError(f"{where} {e}") from None


def _is_date(text: str) -> bool:
    return re.fullmatch(r"\d{4}-\d{2}-\d{2}", text.strip()) is not None


@dataclass(frozen=True)
class Period:
    name: str
    start: datetime | None  # inclusive; None: from the beginning
    end: datetime | None  # exclusive; None: up to now and on

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "start": _iso(self.start), "end": _iso(self.end)}


PERIOD_FORMS = (
    "this-month, last-month, this-week, last-week, all, YYYY-MM, a span back from now "
    "such as 7d or 30d, or FROM..TO dates such as 2026-05-01..2026-05-31"
)


def parse_period(text: str, at: datetime | None = None) -> Period:
    """The period `text` names, as of `at` (default now). A span such as `7d` counts back
    from `at`; a TO date is inclusive (a TO time exclusive); either side may be left open."""
    t = text.strip().lower()
    at = aware(at or now()).astimezone(UTC)
    bad = FrugalError(f"--period {text!r}: use {PERIOD_FORMS}")
    if t == "all":
        return Period(t, None, None)
    if t in ("this-month", "last-month", "this-week", "last-week"):
        unit = t.split("-")[1]
        start = period_start(unit, at)
        if t.startswith("last"):
            start = period_start(unit, start - timedelta(days=1))
        return Period(t, start, period_end(unit, start))
    if re.fullmatch(r"\d{4}-\d{2}", t):
        try:
            start = datetime(int(t[:4]), int(t[5:]), 1, tzinfo=UTC)
        except ValueError:
            raise bad from None
        try:
            check_time(start, repr(text))
        except ValueError as e:
            raise FrugalError(f"--period {e}") from None
        return Period(t, start, period_end("month", start))
    if ".." in t:
        lo, hi = (x.strip() for x in t.split("..", 1))
        if not lo and not hi:
            raise bad
        lo_t = parse_instant(lo, "--period") if lo else None
        hi_t = parse_instant(hi, "--period") if hi else None
        if hi_t is not None and _is_date(hi):
            hi_t += timedelta(days=1)  # a date TO includes its day
        if lo_t is not None and hi_t is not None and hi_t <= lo_t:
            raise FrugalError(f"--period {text!r}: TO comes before FROM; swap them")
        return Period(t, lo_t, hi_t)
    if t and t[-1].isalpha():
        try:
            hours = parse_duration(t, "h")
        except ValueError:
            raise bad from None
        if hours > (at - EARLIEST).total_seconds() / 3600:
            raise FrugalError(f"--period {text!r} reaches back before 2000: use all instead")
        return Period(t, at - timedelta(hours=hours), at)
    raise bad


def parse_week(text: str, at: datetime | None = None) -> datetime:
    """Monday 00:00 UTC of the week `text` names: last (the last whole week), this, an ISO
    week (2026-W19) or a date in it."""
    t = text.strip().lower()
    at = aware(at or now()).astimezone(UTC)
    if t in ("last", "this"):
        start = period_start("week", at)
        return start - timedelta(days=7) if t == "last" else start
    m = re.fullmatch(r"(\d{4})-w(\d{1,2})", t)
    try:
        if m:
            d = date.fromisocalendar(int(m[1]), int(m[2]), 1)
            start = datetime(d.year, d.month, d.day, tzinfo=UTC)
            check_time(start, repr(text))
            return start
        if _is_date(t):
            return period_start("week", parse_instant(t, "--week"))
    except OutsideYears as e:
        raise FrugalError(f"--week {e}") from None
    except ValueError:
        pass
    raise FrugalError(f"--week {text!r}: use last, this, an ISO week such as 2026-W19, or a date")


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()
