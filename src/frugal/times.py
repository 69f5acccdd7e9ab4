"""Times as people and billing files write them: ISO 8601, read as UTC. One parser for
every place a time is given (`costs add --at`, `--period`, `--now`, billing rows, price
histories, restored records), and one range of times the books can hold."""

from __future__ import annotations

from datetime import UTC, datetime

# the books hold times from the year 2000 to 2199: a cost or a run outside that range is a
# typo (0001-01-01, 9999-12), and would break every period sum and report made after it
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
FORMS = "write ISO 8601, e.g. 2026-05-01 or 2026-05-01T13:00:00Z"


class OutsideYears(ValueError):
    """A well-formed time outside the years the books hold."""


def utc(t: datetime) -> datetime:
    """`t` in UTC; a time without a zone is taken to be UTC already."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def parse_time(text: str) -> datetime:
    """An ISO 8601 date or time from 2000 to 2199, as an aware UTC datetime; ValueError
    naming the accepted forms otherwise."""
    try:
        t = utc(datetime.fromisoformat(str(text).strip()))
    except (ValueError, OverflowError):
        raise ValueError(f"{text!r} is not a date or time: {FORMS}") from None
    check_time(t, repr(str(text)))
    return t


def check_time(t: datetime, shown: str) -> None:
    """ValueError unless `t` is within the years the books hold."""
    if not EARLIEST <= utc(t) < LATEST:
        raise OutsideYears(f"{shown} is outside the years 2000 to 2199: check the date")
