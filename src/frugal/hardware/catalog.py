"""The catalog as a command asks for it: the bundled or updated snapshot, your own offers
files and GPUs, discounts, a choice of providers or GPU (`select_offers`); and which prices
an answer used and how old they are (`price_basis`), which every plan and quote says."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from frugal.errors import FrugalError
from frugal.hardware.gpus import find_gpu
from frugal.hardware.offers import (
    HOST_WATTS,
    KWH_USD,
    Offer,
    base,
    find_provider,
    offer_settings,
)
from frugal.hardware.price_files import read_price_file
from frugal.hardware.snapshot import Snapshot
from frugal.times import parse_time


@dataclass(frozen=True)
class PriceBasis:
    """Which prices an answer used and how old they are: every plan says it."""

    snapshot: Snapshot
    files: tuple[str, ...]  # your own offers files, on top of the snapshot
    oldest: datetime  # the oldest price among the offers considered
    max_age_days: float
    left_out: int  # offers with a price error, left out

    def age_days(self, now: datetime | None = None) -> float:
        return max(0.0, ((now or datetime.now(UTC)) - self.oldest).total_seconds() / 86400)

    def stale(self, now: datetime | None = None) -> bool:
        return self.age_days(now) > self.max_age_days

    def line(self, now: datetime | None = None) -> str:
        s = self.snapshot
        text = f"prices: {s.describe()} ({s.source}), {_age(self.age_days(now))} old"
        if self.files:
            text += f", with your offers from {', '.join(self.files)}"
        if self.left_out:
            text += (
                f"; {self.left_out} offers with price errors left out (frugal offers --suspicious)"
            )
        return text

    def warning(self, now: datetime | None = None) -> str | None:
        if not self.stale(now):
            return None
        return (
            f"the prices are {_age(self.age_days(now))} old (past {self.max_age_days:g} days): "
            "refresh them with `frugal offers update`"
        )

    def to_json(self, now: datetime | None = None) -> dict[str, object]:
        return {
            "snapshot": self.snapshot.label,
            "retrieved": self.snapshot.retrieved.isoformat().replace("+00:00", "Z"),
            "source": self.snapshot.source,
            "path": self.snapshot.path,
            "files": list(self.files),
            "oldest_price": self.oldest.isoformat().replace("+00:00", "Z"),
            "age_days": round(self.age_days(now), 2),
            "max_age_days": self.max_age_days,
            "stale": self.stale(now),
            "suspicious_left_out": self.left_out,
        }


def _age(days: float) -> str:
    return f"{days:.1f} days"  # one unit always: 0.2 days, 9.8 days


def price_basis(offers: Iterable[Offer], files: Iterable[str] = ()) -> PriceBasis:
    """The basis of an answer priced from `offers` (what select_offers gave)."""
    b = base()
    own, max_age = offer_settings()
    times = []
    for o in offers:
        if o.provider == "local" or not o.retrieved:
            continue
        try:
            times.append(parse_time(o.retrieved))
        except ValueError:
            continue
    keys = {o.key for o in b.offers}
    return PriceBasis(
        snapshot=b.snapshot,
        files=tuple(dict.fromkeys([*own, *files])),
        oldest=min(times, default=b.snapshot.retrieved),
        max_age_days=max_age,
        left_out=sum(1 for k in b.errors if k in keys),
    )


def local_offer(spec: str, kwh_usd: float) -> Offer:
    """`RTX 4090`, `2x RTX 4090` or `RTX 4090x2`: your own GPUs, priced as electricity."""
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(.+?)\s*", spec) or re.fullmatch(
        r"\s*(.+?)\s*x\s*(\d+)\s*", spec
    )
    if m and m.group(1).isdigit():
        count, name = int(m.group(1)), m.group(2)
    elif m:
        count, name = int(m.group(2)), m.group(1)
    else:
        count, name = 1, spec.strip()
    if count < 1:
        raise FrugalError(f"--local {spec!r}: the GPU count must be at least 1")
    gpu = find_gpu(name)
    watts = gpu.tdp_w * count + HOST_WATTS
    return Offer(
        provider="local",
        instance=f"your {count}x {gpu.name}",
        gpu=gpu,
        gpus=count,
        ondemand_usd_h=round(watts / 1000 * kwh_usd, 4),
        spot_usd_h=None,
        region="here",
        interruption="",
        source=f"{watts:.0f} W x ${kwh_usd}/kWh (board power x GPUs + {HOST_WATTS:.0f} W host)",
    )


def parse_discounts(items: Iterable[str]) -> dict[str, float]:
    """`aws=15` -> {"aws": 0.85}: percent off every price of that provider."""
    out = {}
    for item in items:
        name, sep, pct = item.partition("=")
        try:
            value = float(pct.rstrip("%"))
        except ValueError:
            value = -1.0
        if not sep or not 0 <= value < 100:
            raise FrugalError(f"--discount {item!r}: write PROVIDER=PERCENT, e.g. aws=15")
        out[find_provider(name)] = 1 - value / 100
    return out


def catalog(
    price_files: Iterable[str] = (),
    discounts: dict[str, float] | None = None,
    local: Iterable[str] = (),
    kwh_usd: float = KWH_USD,
    bundled: bool = True,
    include_suspicious: bool = False,
) -> list[Offer]:
    """All offers: the snapshot (those with a price error left out unless asked for: the
    flag's old name, `include_suspicious`), then your own
    offers files (settings, then each price file), then local GPUs; discounts applied.

    A row of yours with the same provider, instance and region as a catalog one replaces it.
    """
    merged: dict[tuple[str, str, str], Offer] = {}
    b = base()
    for o in b.offers if bundled else ():
        if include_suspicious or o.key not in b.errors:
            merged[o.key] = o
    own, _ = offer_settings()
    for f in dict.fromkeys([*own, *price_files]):
        for o in read_price_file(f):
            merged[o.key] = o
    out = list(merged.values())
    out += [local_offer(s, kwh_usd) for s in local]
    for name, factor in (discounts or {}).items():
        out = [
            replace(
                o,
                ondemand_usd_h=o.ondemand_usd_h * factor,
                spot_usd_h=o.spot_usd_h * factor if o.spot_usd_h is not None else None,
            )
            if o.provider == name
            else o
            for o in out
        ]
    return out


def select_offers(
    prices: Iterable[str] = (),
    discount: Iterable[str] = (),
    local: Iterable[str] = (),
    kwh_usd: float = KWH_USD,
    providers_csv: str | None = None,
    gpu: str | None = None,
    include_suspicious: bool = False,
) -> list[Offer]:
    """The catalog as the CLI options select it (shared by `offers` and `plan`)."""
    if kwh_usd < 0:
        raise FrugalError("--kwh-usd must be >= 0 (your electricity price, $/kWh)")
    out = catalog(
        prices, parse_discounts(discount), local, kwh_usd, include_suspicious=include_suspicious
    )
    if providers_csv:
        keep = {find_provider(p) for p in providers_csv.split(",") if p.strip()}
        if "local" in keep and not any(o.provider == "local" for o in out):
            raise FrugalError("--providers local needs --local GPU (e.g. --local 'RTX 4090')")
        out = [o for o in out if o.provider in keep]
    if gpu:
        g = find_gpu(gpu)
        out = [o for o in out if o.gpu == g]
    return out


def finding(offer: Offer) -> str | None:
    """Why `offer`'s price stands far from its peers' (`sanity.findings`, judged over the
    whole snapshot, so the providers a command selects do not move it); None when it does
    not, or when it is not the snapshot's row (your own, or discounted)."""
    b = base()
    why = b.findings.get(offer.key)
    if why is None:
        return None
    row = next((o for o in b.offers if o.key == offer.key), None)
    same = row is not None and (row.ondemand_usd_h, row.spot_usd_h) == (
        offer.ondemand_usd_h,
        offer.spot_usd_h,
    )
    return why if same else None
