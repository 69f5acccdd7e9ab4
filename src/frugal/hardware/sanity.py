"""Prices checked before a plan trusts them: errors left out, findings shown.

Catalogs scraped from provider APIs carry listing errors (an H100 at $0, spot above
on-demand, an 8-GPU instance listed with one GPU). An offer's price is an **error**, and the
offer is left out of plans, when

* its on-demand or spot price is zero (a listing error, not a free GPU);
* its spot price is above its on-demand price (no one should pay it);
* its GPU count contradicts its instance's name (`gpu_8x_h100` with 1 GPU: every price per
  GPU-hour of it would be wrong by that factor).

A price far from its peers is not an error: marketplaces (Vast, Prime Intellect) do sell an
A100 at a third of the clouds' rate, and the cheapest real offer is what a plan is for. An
offer whose price per GPU-hour is more than FAR times away from the median of the same GPU's
prices (on-demand against on-demand, spot against spot; the median taken over providers,
each provider's own median counting once, where at least MIN_PEERS providers sell that GPU)
is a **finding**: kept, listed by `frugal offers --suspicious`, and said in a plan that
chooses it.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

Key = tuple[str, str, str]


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class Offer(Protocol):
    """What these checks read of an offer (`offers.Offer` is one)."""

    @property
    def provider(self) -> str: ...
    @property
    def instance(self) -> str: ...
    @property
    def gpu(self) -> _Named: ...
    @property
    def gpus(self) -> int: ...
    @property
    def ondemand_usd_h(self) -> float: ...
    @property
    def spot_usd_h(self) -> float | None: ...
    @property
    def key(self) -> Key: ...


FAR = 3.0
MIN_PEERS = 3
# how providers write the GPU count into an instance's name: gpu_8x_h100 (Lambda), 4x-B200
# (Vast), 1x_A100-80GB (RunPod), 8xA100_80GB (Prime Intellect), _8gpu- (Nebius), H100:2
# (Modal) and ::2 (Fluidstack), H100x8 (Paperspace); AWS, GCP, Azure and OCI do not
COUNT_IN_NAME = tuple(
    re.compile(p)
    for p in (
        r"(?<![0-9A-Za-z])(\d+)x(?=[_\-A-Z])",
        r"_(\d+)gpu-",
        r":(\d+)$",
        r"(?<=[A-Za-z0-9])x(\d+)$",
    )
)


def _named_count(instance: str) -> int | None:
    for p in COUNT_IN_NAME:
        if m := p.search(instance):
            return int(m.group(1))
    return None


def error(o: Offer) -> str:
    """Why the offer's listing is wrong ("" when it is not)."""
    if o.ondemand_usd_h <= 0:
        return "on-demand priced at $0: a listing error, not a free GPU"
    if o.spot_usd_h is not None and o.spot_usd_h <= 0:
        return "spot priced at $0: a listing error, not a free GPU"
    if o.spot_usd_h is not None and o.spot_usd_h > o.ondemand_usd_h:
        return f"spot ${o.spot_usd_h:.3f} is above on-demand ${o.ondemand_usd_h:.3f}"
    named = _named_count(o.instance)
    if named is not None and named != o.gpus:
        return f"listed with {o.gpus} GPUs, but the instance's name says {named}"
    return ""


def errors(offers: Iterable[Offer]) -> dict[Key, str]:
    """Why each offer with a listing error is wrong (by offer key)."""
    return {o.key: why for o in offers if (why := error(o))}


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


def findings(offers: Iterable[Offer]) -> dict[Key, str]:
    """Why each offer's price stands far from its peers' (by offer key), judged against the
    offers without errors; an offer with an error is not among them."""
    rows = [o for o in offers if not error(o)]
    od_median, spot_median = _medians(rows, spot=False), _medians(rows, spot=True)
    out: dict[Key, str] = {}
    for o in rows:
        for kind, price, medians in (
            ("on-demand", o.ondemand_usd_h, od_median),
            ("spot", o.spot_usd_h, spot_median),
        ):
            median, peers = medians.get(o.gpu.name, (0.0, 0))
            if price is None or not median:
                continue
            per_gpu = price / o.gpus
            if not 1 / FAR <= per_gpu / median <= FAR:
                out[o.key] = _far(per_gpu, median, peers, o.gpu.name, kind)
                break
    return out
