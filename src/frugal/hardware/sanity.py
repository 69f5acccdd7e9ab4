"""Prices that are probably wrong: checked before a plan trusts them.

Catalogs scraped from provider APIs carry listing errors (an H100 at $0, a B200 at $0.01,
spot above on-demand). An offer is suspicious when

* its on-demand or spot price is zero (a listing error, not a free GPU);
* its spot price is above its on-demand price (no one should pay it);
* its price per GPU-hour is more than FAR times away from the median of the same GPU's
  prices (on-demand against on-demand, spot against spot), the median taken over providers
  (each provider's own median counts once, so one listing in thirty regions is not thirty
  votes) and judged where at least MIN_PEERS providers sell that GPU.

Suspicious offers are left out of plans unless asked for (`--include-suspicious`);
`frugal offers --suspicious` lists them with the reason.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from frugal.hardware.offers import Offer

FAR = 3.0
MIN_PEERS = 3


def _medians(offers: list[Offer], spot: bool) -> dict[str, tuple[float, int]]:
    """Per GPU: the median over providers of each provider's median price per GPU-hour (a
    provider listing one price in 30 regions counts once), and how many providers."""
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for o in offers:
        price = o.spot_usd_h if spot else o.ondemand_usd_h
        if price:  # zero or missing says nothing of the market
            per[o.gpu.name][o.provider].append(price / o.gpus)
    return {
        g: (statistics.median(statistics.median(v) for v in by.values()), len(by))
        for g, by in per.items()
        if len(by) >= MIN_PEERS
    }


def _far(price: float, median: float, peers: int, gpu: str, kind: str) -> str:
    ratio = price / median
    times = f"{ratio:.1f}x above" if ratio > 1 else f"{1 / ratio:.1f}x below"
    return (
        f"{kind} ${price:.3f}/GPU-hour, {times} the median of {peers} providers' {gpu} "
        f"{kind} prices (${median:.3f})"
    )


def suspicious(offers: Iterable[Offer]) -> dict[tuple[str, str, str], str]:
    """Why each suspicious offer is (by offer key); the others are not in it."""
    rows = list(offers)
    od_median, spot_median = _medians(rows, spot=False), _medians(rows, spot=True)
    out: dict[tuple[str, str, str], str] = {}
    for o in rows:
        why = ""
        if o.ondemand_usd_h <= 0:
            why = "on-demand priced at $0: a listing error, not a free GPU"
        elif o.spot_usd_h is not None and o.spot_usd_h <= 0:
            why = "spot priced at $0: a listing error, not a free GPU"
        elif o.spot_usd_h is not None and o.spot_usd_h > o.ondemand_usd_h:
            why = f"spot ${o.spot_usd_h:.3f} is above on-demand ${o.ondemand_usd_h:.3f}"
        else:
            for kind, price, medians in (
                ("on-demand", o.ondemand_usd_h, od_median),
                ("spot", o.spot_usd_h, spot_median),
            ):
                median, peers = medians.get(o.gpu.name, (0.0, 0))
                if price is None or not median:
                    continue
                per_gpu = price / o.gpus
                if not 1 / FAR <= per_gpu / median <= FAR:
                    why = _far(per_gpu, median, peers, o.gpu.name, kind)
                    break
        if why:
            out[o.key] = why
    return out
