"""Spot-price timing: a job with slack before its deadline can wait for a cheap window.

* History. A price history records changes: the price in effect at time t is the last point
  at or before t. Two formats are read. The JSON that `aws ec2 describe-spot-price-history`
  prints: `{"SpotPriceHistory": [{"AvailabilityZone", "InstanceType", "ProductDescription",
  "SpotPrice" (a string of $/hour), "Timestamp" (ISO 8601 UTC: "2014-01-06T07:10:55.000Z" in
  AWS's example, "...+00:00" from CLI v2)}, ...]}` (AWS code library, "Use
  DescribeSpotPriceHistory with a CLI", docs.aws.amazon.com/code-library/latest/ug/
  ec2_example_ec2_DescribeSpotPriceHistory_section.html; the EC2 API reference adds that the
  answer includes the last change before the start time, the price in effect then). Only
  Linux/UNIX rows are kept ("Linux/UNIX" and "Linux/UNIX (Amazon VPC)"): SUSE, Red Hat and
  Windows prices include a licence. The region is the zone without its trailing letter.
  Or a CSV `time,provider,instance,region,spot_usd_h` (ISO 8601; naive times are UTC).
  Prices are per instance-hour, as in the offer catalog.
* Zones. AWS prices each availability zone; each zone keeps its own series, and for every
  step of a run (an hour by default) the cheapest zone of the region over that step is taken,
  as a launcher free to pick any zone of the region would. A run pinned to one zone can pay
  more.
* Model: a daily profile. The expected price at a future time is the median, over the days of
  history, of the mean price in effect over the same step at the same time of day (UTC). The
  expected cost of a start s is the sum of those over [s, s + run_h], piecewise constant by
  step, so runs longer than a day wrap around the profile. Starts 0, step, 2 step, ... up to
  the slack are tried; the cheapest wins and ties go to the earliest. The risk, p90, is the
  90th percentile over the days of what the same window of the day actually cost (linear
  interpolation between order statistics).
* Limits. One profile for all days: weekday/weekend patterns, holidays and a trend (prices
  drifting up or down over the history) are not modelled, so a history of the last one or
  two weeks serves best. Prices only; interruptions are not in it (pass the expected wall
  time on spot, spot.spot_run, as run_h). The last price is taken to hold after the last
  point until `now`, for at most a day (an old file is not stretched further). A history of a
  day or less cannot give a profile (an error says so); for a run longer than the whole
  history, p90 is the sum of its steps' own p90s, a pessimistic bound.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from frugal.errors import FrugalError
from frugal.hardware.csvdata import data_rows, header
from frugal.hardware.offers import providers
from frugal.times import parse_time, utc

CSV_COLUMNS = ("time", "provider", "instance", "region", "spot_usd_h")
LINUX = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
AWS_FIELDS = ("AvailabilityZone", "InstanceType", "ProductDescription", "SpotPrice", "Timestamp")
FORMATS = "AWS describe-spot-price-history JSON or a CSV of " + ",".join(CSV_COLUMNS)


@dataclass(frozen=True)
class PricePoint:
    """A spot price ($ per instance-hour) that took effect at `time` (UTC)."""

    time: datetime
    provider: str
    instance: str
    region: str
    usd_h: float
    zone: str = ""  # the AWS availability zone; "" for a CSV row (one series per region)


@dataclass(frozen=True)
class Window:
    """When to start a run, what it is expected to cost then and now, and the risk."""

    start_h: float  # hours from now the run should start
    run_h: float
    expected_usd: float  # expected cost of the run starting at start_h
    now_usd: float  # expected cost of the run starting now
    saving_usd: float  # now_usd - expected_usd
    p90_usd: float  # 90th percentile over the days of what that window of the day cost
    slack_left_h: float  # deadline slack left after waiting
    days: int  # days of history behind the estimate (the fewest behind any of its steps)
    reason: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _time(raw: str, at: str, what: str) -> datetime:
    try:
        return parse_time(raw)
    except ValueError as e:
        raise FrugalError(f"{at}: {what} {e}") from None


def _usd_cell(raw: object) -> float | None:
    try:
        value = float(str(raw).strip().lstrip("$"))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _read_aws(data: object, path: str) -> list[PricePoint]:
    rows = data.get("SpotPriceHistory") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise FrugalError(f"{path}: no 'SpotPriceHistory' list; give {FORMATS}")
    out, others = [], set()
    for i, r in enumerate(rows):
        at = f"{path}: SpotPriceHistory[{i}]"
        missing = [f for f in AWS_FIELDS if not isinstance(r, dict) or f not in r]
        if missing:
            raise FrugalError(f"{at}: missing {', '.join(missing)}; each entry needs all of them")
        if r["ProductDescription"] not in LINUX:
            others.add(str(r["ProductDescription"]))
            continue
        t = _time(str(r["Timestamp"]), at, "Timestamp")
        price = _usd_cell(r["SpotPrice"])
        if price is None:
            raise FrugalError(f"{at}: SpotPrice {r['SpotPrice']!r} must be a number >= 0 ($/h)")
        zone = str(r["AvailabilityZone"]).strip()
        if not zone or not r["InstanceType"]:
            raise FrugalError(f"{at}: AvailabilityZone and InstanceType must not be empty")
        region = zone[:-1] if zone[-1].isalpha() else zone
        out.append(PricePoint(t, "aws", str(r["InstanceType"]), region, price, zone))
    if not out:
        found = f" (found only: {', '.join(sorted(others))})" if others else ""
        raise FrugalError(
            f"{path}: no Linux/UNIX spot prices{found}; fetch them with "
            "--product-descriptions Linux/UNIX"
        )
    return out


def _read_csv(text: str, path: str) -> list[PricePoint]:
    kept = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.strip() and ln[0] != "#"]
    if not kept:
        raise FrugalError(f"{path}:1: no header and no prices; give {FORMATS}")
    head_line = kept[0]
    missing = [c for c in CSV_COLUMNS if c not in header(text, path)]
    if missing:
        raise FrugalError(
            f"{path}:{head_line}: missing column(s) {', '.join(missing)}; give {FORMATS}"
        )
    known, out = providers(), []
    for lineno, row in data_rows(text, path):
        at, r = f"{path}:{lineno}", {c: (row.get(c) or "").strip() for c in CSV_COLUMNS}
        t = _time(r["time"], at, "column 'time':")
        provider = r["provider"].lower()
        if provider not in known:
            raise FrugalError(
                f"{at}: column 'provider': unknown {r['provider']!r}; known: {', '.join(known)}"
            )
        if not r["instance"]:
            raise FrugalError(f"{at}: column 'instance': empty; name the instance type")
        price = _usd_cell(r["spot_usd_h"])
        if price is None:
            raise FrugalError(
                f"{at}: column 'spot_usd_h': {r['spot_usd_h']!r}: a price must be a "
                "number >= 0 ($/hour for the whole instance)"
            )
        out.append(PricePoint(t, provider, r["instance"], r["region"], price))
    if not out:
        raise FrugalError(f"{path}:{head_line}: no prices after the header; add rows of {FORMATS}")
    return out


def read_price_history(path: str) -> list[PricePoint]:
    """The spot price history in `path` (AWS JSON or CSV, see the module), sorted by time."""
    p = Path(path)
    if not p.is_file():
        raise FrugalError(f"price history {path} not found: give {FORMATS}")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise FrugalError(f"cannot read price history {path}: {e}") from None
    if not text.strip():
        raise FrugalError(f"{path}:1: empty price history; give {FORMATS}")
    if text.lstrip()[0] in "{[":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise FrugalError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
        points = _read_aws(data, path)
    else:
        points = _read_csv(text, path)
    return sorted(points, key=lambda q: q.time)


class _Offer:
    """One offer's history: a step series per zone, in hours since the epoch."""

    def __init__(self, points: Sequence[PricePoint], now_h: float) -> None:
        self.zones: dict[str, tuple[list[float], list[float]]] = {}
        for q in sorted(points, key=lambda q: q.time):
            times, prices = self.zones.setdefault(q.zone, ([], []))
            times.append(q.time.timestamp() / 3600)
            prices.append(q.usd_h)
        self.first = min(ts[0] for ts, _ in self.zones.values())
        last = max(ts[-1] for ts, _ in self.zones.values())
        self.end = max(last, min(now_h, last + 24))

    def at(self, t: float) -> float | None:
        """The cheapest zone's price in effect at t (its last point at or before t)."""
        now = [p[bisect.bisect_right(ts, t) - 1] for ts, p in self.zones.values() if ts[0] <= t]
        return min(now, default=None)

    def mean(self, t0: float, t1: float) -> float | None:
        """Mean $/h over [t0, t1) in the cheapest zone priced since t0; None if none is."""
        best = None
        for times, prices in self.zones.values():
            i = bisect.bisect_right(times, t0) - 1
            if i < 0:
                continue
            usd, t = 0.0, t0
            while t < t1:
                seg = min(t1, times[i + 1]) if i + 1 < len(times) else t1
                usd, t, i = usd + prices[i] * (seg - t), seg, i + 1
            best = usd / (t1 - t0) if best is None else min(best, usd / (t1 - t0))
        return best

    def samples(self, t0: float, steps: Sequence[tuple[float, float]]) -> list[float]:
        """What `steps` (offset from t0, hours) cost ($) at t0's time of day on each day."""
        hours = steps[-1][0] + steps[-1][1]
        out = []
        for day in range(math.floor(self.first / 24), math.floor(self.end / 24) + 1):
            a = day * 24 + t0 % 24
            if a >= self.first and a + hours <= self.end:
                means = [self.mean(a + off, a + off + h) for off, h in steps]
                if None not in means:
                    out.append(sum((m or 0.0) * h for m, (_, h) in zip(means, steps, strict=True)))
        return out


def _offer(
    history: Sequence[PricePoint], provider: str, instance: str, region: str, now: datetime
) -> _Offer | None:
    key = (provider.lower(), instance.lower(), region.lower())
    mine = [q for q in history if (q.provider.lower(), q.instance.lower(), q.region.lower()) == key]
    return _Offer(mine, now.timestamp() / 3600) if mine else None


def price_at(
    history: Sequence[PricePoint], provider: str, instance: str, region: str, t: datetime
) -> float | None:
    """$/h in effect at t (naive = UTC): the last point at or before t, in the cheapest zone.

    None before the offer's first point or when the history has nothing for it.
    """
    offer = _offer(history, provider, instance, region, utc(t))
    return offer.at(utc(t).timestamp() / 3600) if offer else None


def _p90(values: Sequence[float]) -> float:
    s = sorted(values)
    x = 0.9 * (len(s) - 1)
    lo = math.floor(x)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (x - lo)


def best_start(
    history: Sequence[PricePoint],
    provider: str,
    instance: str,
    region: str,
    run_h: float,
    slack_h: float,
    now: datetime,
    step_h: float = 1.0,
) -> Window | None:
    """The start within the slack that minimizes the expected cost (see the module's model).

    None when the history has nothing for that offer. A start never passes the slack, so the
    run still ends by the deadline; a job with less slack than a step starts at once.
    """
    if not (0 < run_h < math.inf and 0 < step_h < math.inf and math.isfinite(slack_h)):
        raise FrugalError(
            f"timing needs finite run_h > 0, step_h > 0 and slack_h (got {run_h}, {step_h}, "
            f"{slack_h})"
        )
    now = utc(now)
    offer = _offer(history, provider, instance, region, now)
    if offer is None:
        return None
    where = f"{provider} {instance} {region}"
    steps = _Steps(offer, where, now.timestamp() / 3600, run_h, step_h)
    starts = max(0, math.floor(slack_h / step_h + 1e-9))  # start <= slack: the deadline holds
    costs = [steps.expected_usd(i) for i in range(starts + 1)]
    best = 0
    for i, c in enumerate(costs):
        if c < costs[best] - 1e-9 * max(1.0, costs[best]):
            best = i
    start = best * step_h
    p90, days = steps.spread(best)
    expected, now_usd = costs[best], costs[0]
    w = Window(
        start_h=start,
        run_h=run_h,
        expected_usd=expected,
        now_usd=now_usd,
        saving_usd=now_usd - expected,
        p90_usd=p90,
        slack_left_h=max(slack_h, 0.0) - start,
        days=days,
        reason="",
    )
    at = (now + timedelta(hours=start)).strftime("%H:%M UTC")
    return replace(w, reason=_reason(w, f"{where}: start", at, slack_h, step_h))


def _reason(w: Window, start: str, at: str, slack_h: float, step_h: float) -> str:
    if w.start_h == 0:
        why = (
            f"slack of {max(slack_h, 0):.1f} h is less than a {step_h:g} h step"
            if math.floor(slack_h / step_h + 1e-9) <= 0
            else f"no start within the {slack_h:.1f} h of slack is cheaper"
        )
        return (
            f"{start} now ({at}): {why}; expected ${w.expected_usd:.2f} for {w.run_h:.1f} h, "
            f"p90 ${w.p90_usd:.2f} over {w.days} days of history"
        )
    return (
        f"{start} in {w.start_h:g} h ({at}): expected ${w.expected_usd:.2f} for {w.run_h:.1f} h "
        f"vs ${w.now_usd:.2f} starting now, saving ${w.saving_usd:.2f} "
        f"({w.saving_usd / w.now_usd:.0%}); p90 ${w.p90_usd:.2f} over {w.days} days of "
        f"history; {slack_h - w.start_h:.1f} h of slack left"
    )


class _Steps:
    """A run of `run_h` hours cut into steps of `step_h`, each priced on the days of history
    at its hour of the day (cached: the starts tried share their steps)."""

    def __init__(self, offer: _Offer, where: str, now_h: float, run_h: float, step_h: float):
        self.offer, self.where, self.now_h, self.step_h = offer, where, now_h, step_h
        n = math.ceil(run_h / step_h - 1e-9)
        self.pieces = [(k * step_h, min(step_h, run_h - k * step_h)) for k in range(n)]
        self._cache: dict[tuple[int, float], list[float]] = {}

    def piece(self, j: int, hours: float) -> list[float]:
        """What `hours` from the j-th step on cost on each day of the history."""
        if (j, hours) not in self._cache:
            got = self.offer.samples(self.now_h + j * self.step_h, [(0.0, hours)])
            if not got:
                span = self.offer.end - self.offer.first
                raise FrugalError(
                    f"price history of {self.where} covers {span:.1f} h; "
                    "timing needs more than a day of it: fetch a longer history"
                )
            self._cache[(j, hours)] = got
        return self._cache[(j, hours)]

    def expected_usd(self, i: int) -> float:
        """The run started at step i: the sum of its steps' median costs."""
        return sum(statistics.median(self.piece(i + k, h)) for k, (_, h) in enumerate(self.pieces))

    def spread(self, i: int) -> tuple[float, int]:
        """The p90 cost of the run started at step i, and the days of history behind it."""
        days = min(len(self.piece(i + k, h)) for k, (_, h) in enumerate(self.pieces))
        whole = self.offer.samples(self.now_h + i * self.step_h, self.pieces)  # day by day
        if whole:
            return _p90(whole), days
        # a run longer than the history has no whole window in it: bound it by its steps' p90s
        return sum(_p90(self.piece(i + k, h)) for k, (_, h) in enumerate(self.pieces)), days
