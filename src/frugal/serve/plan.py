"""`frugal serve plan`: the cheapest GPU type, tensor-parallel size and replica count that
carries a load within latency targets.

For every GPU type in the catalog, tensor-parallel size, weight format and engine, the
estimator finds the highest arrival rate one replica carries with its mean TTFT and ITL
within the targets (bisection: both grow with the rate); the load then needs
ceil(rate / that) replicas, packed onto instances of the offer (an 8-GPU instance holds
8 / TP replicas). Online work is priced on-demand or on a commitment where the catalog has
its terms (a commitment bills every hour of its term); offline work is priced at maximum
throughput, on spot where there is spot. Options rank by dollars per hour; each one that
cannot serve says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from frugal.errors import FrugalError
from frugal.hardware.gpus import GPU
from frugal.hardware.offers import Offer
from frugal.models.specs import ModelSpec
from frugal.serve.engines import find_engine
from frugal.serve.estimate import Deployment, ServeEstimate, estimate
from frugal.serve.prices import conservative_commitment
from frugal.serve.speed import Load
from frugal.serve.tco import HOURS_PER_MONTH
from frugal.serve.weights import find_format

TPS = (1, 2, 4, 8)
# a replica is never planned past this share of its capacity: near it the queue (TTFT) grows
# without bound, so a plan without latency targets still leaves headroom
MAX_UTILIZATION = 0.8
OFFLINE_BURST = 2000  # requests at once when pricing offline work at maximum throughput


@dataclass(frozen=True)
class ServeAsk:
    spec: ModelSpec
    rate: float  # requests/s the servers must carry at peak (after the response cache)
    input_len: int
    output_len: int
    ttft_s: float | None = None
    itl_s: float | None = None
    quants: tuple[str, ...] = ("bf16", "fp8", "awq")
    engines: tuple[str, ...] = ("vllm",)
    kv_dtype: str = "auto"
    prefix_hit: float = 0.0
    offline: bool = False  # batch work: no latency targets, throughput-priced, spot allowed
    commitments: tuple[int, ...] = (12,)  # commitment terms to price (months)
    mean_rate: float | None = None  # requests/s on average, what is billed per token

    @property
    def billed_rate(self) -> float:
        """The mean rate: what APIs bill and what dollars per token divide by."""
        return self.rate if self.mean_rate is None else self.mean_rate

    @property
    def output_tokens_per_s(self) -> float:
        return self.billed_rate * self.output_len


@dataclass(frozen=True)
class Capacity:
    """What one replica of a deployment carries within the targets."""

    d: Deployment
    rate: float  # requests/s per replica
    at: ServeEstimate  # the estimate at that rate
    bound: str  # what limits it: TTFT, ITL or the share of capacity a plan may use
    full: float = 0.0  # the server's capacity, requests/s (the queue's limit)


@dataclass(frozen=True)
class Option:
    cap: Capacity
    offer: Offer
    pricing: str  # on-demand | spot | commitment N months
    instance_usd_h: float
    replicas: int  # replicas the load needs
    instances: int
    ask: ServeAsk

    @property
    def replicas_per_instance(self) -> int:
        return self.offer.gpus // self.cap.d.tp

    @property
    def usd_h(self) -> float:
        return self.instances * self.instance_usd_h

    @property
    def usd_per_month(self) -> float:
        return self.usd_h * HOURS_PER_MONTH

    @property
    def utilization(self) -> float:
        """The peak load's share of what the running replicas could serve at most."""
        full = self.cap.full or self.cap.rate
        return self.ask.rate / (full * self.instances * self.replicas_per_instance)

    @property
    def usd_per_mtok(self) -> float:
        return self.usd_h / 3600 / self.ask.output_tokens_per_s * 1e6

    @property
    def usd_per_request(self) -> float:
        return self.usd_h / 3600 / self.ask.billed_rate

    def label(self) -> str:
        d = self.cap.d
        where = self.offer.instance + (f" x{self.instances}" if self.instances > 1 else "")
        return (
            f"{self.replicas} x {d.tp}x {d.gpu.name} {d.fmt.name} ({d.engine.label}) on "
            f"{self.offer.provider} {where} {self.pricing}"
        )

    def at_load(self) -> ServeEstimate:
        """One replica at its share of the peak load (what users see), not at capacity."""
        share = self.ask.rate / (self.instances * self.replicas_per_instance)
        if self.ask.offline or share >= self.cap.rate:
            return self.cap.at
        a = self.ask
        return estimate(self.cap.d, a.input_len, a.output_len, Load(rate=share), a.prefix_hit)

    def to_json(self) -> dict[str, Any]:
        e = self.at_load().to_json()
        return {
            "provider": self.offer.provider,
            "instance": self.offer.instance,
            "region": self.offer.region,
            "instances": self.instances,
            "pricing": self.pricing,
            "gpu": self.cap.d.gpu.name,
            "gpus_per_replica": self.cap.d.tp,
            "replicas": self.replicas,
            "replicas_running": self.instances * self.replicas_per_instance,
            "engine": self.cap.d.engine.name,
            "quant": self.cap.d.fmt.name,
            "quality": self.cap.d.fmt.quality,
            "replica_capacity_requests_per_s": round(self.cap.rate, 3),
            "bound_by": self.cap.bound,
            "utilization": round(self.utilization, 3),
            "ttft_ms": e["ttft_ms"],
            "itl_ms": e["itl_ms"],
            "e2e_latency_ms": e["e2e_latency_ms"],
            "max_concurrency_per_replica": e["max_concurrency"],
            "usd_h": round(self.usd_h, 4),
            "usd_per_month": round(self.usd_per_month, 2),
            "usd_per_million_output_tokens": round(self.usd_per_mtok, 4),
            "usd_per_request": round(self.usd_per_request, 8),
        }


@dataclass(frozen=True)
class Refused:
    what: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"option": self.what, "reason": self.reason}


@dataclass
class ServePlan:
    ask: ServeAsk
    options: list[Option]  # cheapest first
    refused: list[Refused]
    reasons: list[str] = field(default_factory=list)

    @property
    def best(self) -> Option:
        return self.options[0]


def replica_capacity(d: Deployment, ask: ServeAsk) -> Capacity:
    """The highest rate one replica carries within the targets (FrugalError: none)."""
    i, o = ask.input_len, ask.output_len
    if ask.offline:
        e = estimate(d, i, o, Load(burst=OFFLINE_BURST), ask.prefix_hit)
        return Capacity(d, e.speed.requests_per_s, e, "throughput", e.speed.requests_per_s)

    def at(r: float) -> ServeEstimate:
        return estimate(d, i, o, Load(rate=r), ask.prefix_hit)

    def ok(e: ServeEstimate) -> str:
        if e.ttft_s is None:
            return "capacity"
        if ask.ttft_s is not None and e.ttft_s > ask.ttft_s:
            return "TTFT"
        if ask.itl_s is not None and e.speed.itl_s > ask.itl_s:
            return "ITL"
        return ""

    low = at(1e-3)
    if ok(low):
        what = "TTFT" if ok(low) == "TTFT" else "ITL"
        got = (low.ttft_s if what == "TTFT" else low.speed.itl_s) or 0.0
        want = (ask.ttft_s if what == "TTFT" else ask.itl_s) or 0.0
        raise FrugalError(
            f"{what} is {got * 1e3:,.0f} ms with a single request, over the {want * 1e3:,.0f} ms "
            "target"
        )
    cap = low.speed.capacity_requests_per_s
    lo, hi, bound = 1e-3, cap * MAX_UTILIZATION, "capacity"
    if not ok(at(hi)):
        return Capacity(d, hi, at(hi), f"{MAX_UTILIZATION:.0%} of capacity", cap)
    while hi - lo > 2e-3 * hi:  # to 0.2% of the rate
        mid = (lo + hi) / 2
        why = ok(at(mid))
        if why:
            hi, bound = mid, why
        else:
            lo = mid
    return Capacity(d, lo, at(lo), bound, cap)


def _capacities(ask: ServeAsk, gpus: list[GPU]) -> tuple[list[Capacity], list[Refused]]:
    caps, refused = [], []
    for g in gpus:
        for tp in TPS:
            for engine in ask.engines:
                for q in ask.quants:
                    d = Deployment(
                        ask.spec, g, tp, find_engine(engine), find_format(q), ask.kv_dtype
                    )
                    name = f"{tp}x {g.name} {q} ({d.engine.label})"
                    try:
                        caps.append(replica_capacity(d, ask))
                    except FrugalError as e:
                        refused.append(Refused(name, str(e).split(": use")[0]))
    return caps, refused


def _prices(o: Offer, ask: ServeAsk) -> list[tuple[str, float]]:
    if ask.offline:
        out = [("on-demand", o.ondemand_usd_h)]
        if o.spot_usd_h is not None:
            out.append(("spot", o.spot_usd_h))
        return out
    out = [("on-demand", o.ondemand_usd_h)]
    for months in ask.commitments:
        c = conservative_commitment(o.provider, months)
        if c is not None:
            out.append((f"commitment {months} months", c.usd_h(o.ondemand_usd_h)))
    return out


def plan(ask: ServeAsk, offers: list[Offer]) -> ServePlan:
    """Every way to carry the load, cheapest first, and every deployment that cannot."""
    if ask.rate <= 0:
        raise FrugalError("the load must be positive: --rate R or --requests-per-day N")
    gpus = list({o.gpu.name: o.gpu for o in offers}.values())
    if not gpus:
        raise FrugalError("no offers to plan with: check --providers")
    caps, refused = _capacities(ask, gpus)
    options = []
    for c in caps:
        replicas = math.ceil(ask.rate / c.rate)
        for o in offers:
            if o.gpu != c.d.gpu or o.gpus < c.d.tp:
                continue
            instances = math.ceil(replicas / (o.gpus // c.d.tp))
            for pricing, usd_h in _prices(o, ask):
                options.append(Option(c, o, pricing, usd_h, replicas, instances, ask))
    if not options:
        near = "; ".join(f"{r.what}: {r.reason}" for r in refused[:3])
        raise FrugalError(
            f"no GPU count in the catalog can carry {ask.rate:g} requests/s of "
            f"{ask.input_len:,} in / {ask.output_len:,} out within the targets ({near}): "
            "relax --ttft-ms / --itl-ms, shorten the requests or try --quant awq"
        )
    options.sort(key=lambda x: (x.usd_h, -x.cap.rate))
    p = ServePlan(ask, options, refused)
    p.reasons = explain(p)
    return p


def explain(p: ServePlan) -> list[str]:
    """Why the cheapest option, in sentences with their numbers."""
    b, ask = p.best, p.ask
    d = b.cap.d
    out = []
    targets = [f"TTFT <= {ask.ttft_s * 1e3:,.0f} ms" for _ in [0] if ask.ttft_s] + [
        f"ITL <= {ask.itl_s * 1e3:,.0f} ms" for _ in [0] if ask.itl_s
    ]
    within = f" within {' and '.join(targets)}" if targets else ""
    if ask.offline:
        out.append(
            f"offline work priced at maximum throughput: one replica finishes "
            f"{b.cap.rate:,.2f} requests/s"
        )
    else:
        out.append(
            f"one replica of {d.tp}x {d.gpu.name} in {d.fmt.name} carries "
            f"{b.cap.rate:,.2f} requests/s{within} (bound by {b.cap.bound}); "
            f"{ask.rate:g} requests/s need {b.replicas} replica(s), "
            f"{b.utilization:.0%} utilized"
        )
    out.append(
        f"cheapest of {len(p.options)} priced options: ${b.usd_h:,.2f}/h "
        f"(${b.usd_per_month:,.0f}/month, ${b.usd_per_mtok:,.3f} per million output tokens)"
    )
    other = next((o for o in p.options if o.cap.d.gpu != d.gpu), None)
    if other is not None:
        out.append(
            f"next GPU type: {other.cap.d.gpu.name} at ${other.usd_h:,.2f}/h "
            f"(+${(other.usd_h - b.usd_h) * HOURS_PER_MONTH:,.0f}/month)"
        )
    if b.pricing.startswith("commitment"):
        out.append(
            f"{b.pricing}: bills every hour of the term; on-demand costs more for a load "
            "that runs all month"
        )
    return out
