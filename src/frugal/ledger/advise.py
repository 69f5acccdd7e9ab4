"""`frugal costs advise`: rules over the books, each naming the dollars at stake and the change to
make, largest first (docs/ledger.md, "Advice"):

- `gpu-oversized`: a cheaper GPU with less memory in today's catalog holds the run's
  measured peak reserved (+ the CUDA context, within the 5% margin). At stake: hours x
  today's price of the run's GPU - hours x (tokens/s on it / tokens/s on the cheaper one,
  both by the throughput model) x the cheaper one's price.
- `low-utilisation`: measured tokens/s below 60% of the throughput model's for that GPU and
  job. At stake: cost x (1 - measured / predicted).
- `spot`: an on-demand run of at most 24 h, checkpointed at least hourly, on an instance
  with a spot price today. At stake: hours x (price paid - 1.1 x spot price), the 10% for
  work redone after interruptions.
- `early-stopping`: the best evaluation came at most 80% of the way and at least two
  evaluations before the end, without `training.early_stopping_patience`. At stake:
  cost x steps after the best / steps.
- `cheaper-offer`: a recorded plan's GPU and count is listed at least 5% cheaper today.
  At stake: estimated hours x (the plan's price - today's).
- `failures`: failed and preempted runs hold at least 5% of the spend. At stake: their
  dollars.

Dry runs and runs still going are left out; a period counts runs by their start and plans
by their creation. Advice under $1 is not given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select

from frugal.estimate.overheads import load_overheads
from frugal.estimate.throughput import step_time
from frugal.hardware.gpus import GIB, GPU, lookup_gpu, memory_budget
from frugal.hardware.offers import Offer, bundled_offers
from frugal.ledger.periods import parse_period
from frugal.ledger.report import LOST
from frugal.ledger.samples import Profiles, run_job
from frugal.ledger.schema import PlanRecord, RunRecord
from frugal.ledger.store import Ledger, aware

MIN_USD = 1.0  # advice worth less than this is not given
LOW_UTILISATION = 0.6  # measured / predicted tokens/s below this is low
SPOT_MAX_H = 24.0  # runs longer than this see too many interruptions to move blindly
SPOT_MAX_CHECKPOINT_MIN = 60.0
SPOT_REWORK = 0.10  # share of a spot run redone after interruptions (and rebooted)
EARLY_AT = 0.8  # the best evaluation at most this far into the run
EARLY_PATIENCE = 2  # evaluations without improvement the advice suggests
CHEAPER_BY = 0.05  # today's price at least this much below the plan's
FAILED_SHARE = 0.05  # failed and preempted spend at least this share of all


@dataclass
class Advice:
    rule: str
    usd_at_stake: float
    change: str
    why: str
    runs: list[str] = field(default_factory=list)
    plans: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "usd_at_stake": round(self.usd_at_stake, 2),
            "change": self.change,
            "why": self.why,
            "runs": self.runs,
            "plans": self.plans,
        }


class _Speeds:
    """The throughput model's tokens/s for a recorded run's job on any catalog GPU."""

    def __init__(self) -> None:
        self.profiles = Profiles()

    def tokens_per_s(self, r: RunRecord, gpu: GPU) -> float | None:
        job = run_job(r)
        if job is None:
            return None
        got = self.profiles.get(r.model, job)
        if isinstance(got, str):
            return None
        s = step_time(got, job, gpu)
        return s.tokens_per_s if s else None


def _cheapest(offers: Iterable[Offer], gpu: GPU, count: int, spot: bool) -> Offer | None:
    same = [o for o in offers if o.gpu == gpu and o.gpus == count]
    if spot:
        same = [o for o in same if o.spot_usd_h is not None]
    return min(same, key=lambda o: o.hourly_usd(spot), default=None)


def _where(o: Offer, spot: bool) -> str:
    return f"{o.provider} {o.instance}{' spot' if spot else ''} (${o.hourly_usd(spot):.2f}/h)"


def gpu_oversized(runs: list[RunRecord], offers: list[Offer], speeds: _Speeds) -> list[Advice]:
    context = load_overheads().cuda_context_gib
    out = []
    for r in runs:
        peak = (r.actual or {}).get("peak_reserved_gib")
        gpu = lookup_gpu(r.gpu) if r.gpu else None
        if not peak or gpu is None or r.hours <= 0:
            continue
        need = (float(peak) + context) * GIB
        here = speeds.tokens_per_s(r, gpu)
        same = _cheapest(offers, gpu, r.gpus, r.spot)
        base = same.hourly_usd(r.spot) if same else r.price_per_hour_usd
        if here is None or base is None:
            continue
        best: tuple[float, Offer] | None = None
        for o in offers:
            if o.gpus != r.gpus or o.gpu.usable_gib >= gpu.usable_gib:
                continue
            if memory_budget(o.gpu.usable_gib) < need or o.provider == "local":
                continue
            there = speeds.tokens_per_s(r, o.gpu)
            if not there:
                continue
            cost = r.hours * here / there * o.hourly_usd(r.spot)
            if best is None or cost < best[0]:
                best = (cost, o)
        if best is None:
            continue
        saving = r.hours * base - best[0]
        if saving >= max(MIN_USD, 0.1 * r.hours * base):
            o = best[1]
            out.append(
                Advice(
                    "gpu-oversized",
                    saving,
                    f"run it on {o.gpus}x {o.gpu.name}: {_where(o, r.spot)}",
                    f"peaked at {float(peak):.1f} GiB of {gpu.usable_gib:.0f} on {r.gpus}x "
                    f"{gpu.name}; {o.gpu.name} holds it ({o.gpu.usable_gib:.0f} GiB) and would "
                    f"cost ${best[0]:,.2f} against ${r.hours * base:,.2f} at today's prices",
                    [r.id],
                )
            )
    return out


def low_utilisation(runs: list[RunRecord], speeds: _Speeds) -> list[Advice]:
    out = []
    for r in runs:
        measured = (r.actual or {}).get("tokens_per_s")
        gpu = lookup_gpu(r.gpu) if r.gpu else None
        if not measured or gpu is None or r.cost_usd <= 0:
            continue
        predicted = speeds.tokens_per_s(r, gpu) or (r.predicted or {}).get("tokens_per_s")
        if not predicted:
            continue
        ratio = float(measured) / float(predicted)
        usd = r.cost_usd * (1 - ratio)
        if ratio < LOW_UTILISATION and usd >= MIN_USD:
            out.append(
                Advice(
                    "low-utilisation",
                    usd,
                    "find the stall: data loading or tokenizing on the fly, too small a "
                    "micro-batch, CPU offload or a throttled GPU (frugal train --dry-run 20 "
                    "measures a few steps)",
                    f"{float(measured):,.0f} tokens/s, {ratio:.0%} of the {float(predicted):,.0f} "
                    f"the throughput model gives for {r.gpus}x {gpu.name}",
                    [r.id],
                )
            )
    return out


def _checkpoint_min(r: RunRecord) -> float | None:
    cfg = r.config or {}
    every = (cfg.get("training") or {}).get("save_every_min")
    return every or (cfg.get("plan") or {}).get("checkpoint_interval_min")


def spot(runs: list[RunRecord], offers: list[Offer]) -> list[Advice]:
    out = []
    for r in runs:
        if r.spot or r.provider == "local" or not 0 < r.hours <= SPOT_MAX_H:
            continue
        every = _checkpoint_min(r)  # None: frugal's default interval
        if every is not None and every > SPOT_MAX_CHECKPOINT_MIN:
            continue
        same = [
            o
            for o in offers
            if (o.provider, o.instance) == (r.provider, r.instance) and o.spot_usd_h is not None
        ]
        if not same:
            continue
        o = min(same, key=lambda o: (o.region != r.region, o.spot_usd_h))
        assert o.spot_usd_h is not None
        paid = r.price_per_hour_usd or o.ondemand_usd_h
        usd = r.hours * (paid - (1 + SPOT_REWORK) * o.spot_usd_h)
        if usd >= MIN_USD:
            out.append(
                Advice(
                    "spot",
                    usd,
                    f"run it on spot: {o.provider} {o.instance} {o.region} at "
                    f"${o.spot_usd_h:.2f}/h (frugal plan --spot; a preempted run resumes with "
                    "--resume auto)",
                    f"{r.hours:.1f} h on demand at ${paid:.2f}/h, checkpointed every "
                    f"{f'{every:g} min' if every else 'default interval'}",
                    [r.id],
                )
            )
    return out


def early_stopping(runs: list[RunRecord]) -> list[Advice]:
    out = []
    for r in runs:
        a, training = r.actual or {}, (r.config or {}).get("training") or {}
        best, steps = a.get("best_step"), a.get("steps") or r.step
        every = training.get("eval_every") or 0
        if training.get("early_stopping_patience") or best is None or not steps or not every:
            continue
        if best > EARLY_AT * steps or steps - best < 2 * every or r.cost_usd <= 0:
            continue
        usd = r.cost_usd * (steps - best) / steps
        stop = min(steps, best + EARLY_PATIENCE * every)
        if usd >= MIN_USD:
            out.append(
                Advice(
                    "early-stopping",
                    usd,
                    f"set training.early_stopping_patience: {EARLY_PATIENCE} (it would have "
                    f"stopped at step {stop} and kept the best weights)",
                    f"best evaluation at step {best} of {steps}: ${usd:,.2f} spent after it",
                    [r.id],
                )
            )
    return out


def cheaper_offers(
    plans: list[PlanRecord], runs: list[RunRecord], offers: list[Offer]
) -> list[Advice]:
    newest: dict[tuple[Any, ...], PlanRecord] = {}
    for p in sorted(plans, key=lambda p: aware(p.created_at)):
        newest[(p.model, p.method, p.provider, p.instance, p.gpu, p.gpus, p.spot)] = p
    out = []
    for p in newest.values():
        gpu = lookup_gpu(p.gpu)
        if gpu is None or p.provider == "local":
            continue
        o = _cheapest((o for o in offers if o.provider != "local"), gpu, p.gpus, p.spot)
        if o is None or o.hourly_usd(p.spot) > (1 - CHEAPER_BY) * p.price_per_hour_usd:
            continue
        usd = p.est_hours * (p.price_per_hour_usd - o.hourly_usd(p.spot))
        if usd >= MIN_USD:
            out.append(
                Advice(
                    "cheaper-offer",
                    usd,
                    f"launch it on {_where(o, p.spot)} (frugal plan again picks it up)",
                    f"plan {p.id}: {p.gpus}x {gpu.name} on {p.provider} {p.instance} at "
                    f"${p.price_per_hour_usd:.2f}/h for {p.est_hours:.1f} h",
                    [r.id for r in runs if r.plan_id == p.id],
                    [p.id],
                )
            )
    return out


def failures(runs: list[RunRecord]) -> list[Advice]:
    total = sum(r.cost_usd for r in runs)
    lost = [r for r in runs if r.outcome in LOST and r.cost_usd > 0]
    usd = sum(r.cost_usd for r in lost)
    if total <= 0 or usd < MIN_USD or usd < FAILED_SHARE * total:
        return []
    n = {k: sum(1 for r in lost if r.outcome == k) for k in LOST}
    return [
        Advice(
            "failures",
            usd,
            "resume preempted runs (frugal train CONFIG --resume auto keeps their checkpoints); "
            "read why failed ones stopped (their reason in the ledger) and try "
            "frugal train --dry-run 20 before the next launch",
            f"{usd / total:.0%} of ${total:,.2f}: {n['failed']} failed, {n['preempted']} preempted",
            [r.id for r in lost],
        )
    ]


def advise(
    runs: list[RunRecord], plans: list[PlanRecord], offers: list[Offer] | None = None
) -> list[Advice]:
    """Every rule over the ended, real runs and the plans given, largest stake first."""
    offers = list(bundled_offers()) if offers is None else offers
    ended = [r for r in runs if r.outcome is not None and not r.dry_run]
    speeds = _Speeds()
    items = [
        *gpu_oversized(ended, offers, speeds),
        *low_utilisation(ended, speeds),
        *spot(ended, offers),
        *early_stopping(ended),
        *cheaper_offers(plans, runs, offers),
        *failures(ended),
    ]
    return sorted(items, key=lambda a: -a.usd_at_stake)


@dataclass
class AdviceReport:
    period: str
    since: datetime | None
    runs: int
    spend_usd: float
    advice: list[Advice]

    def to_json(self) -> dict[str, Any]:
        return {
            "period": self.period,
            "since": self.since.isoformat() if self.since else None,
            "runs": self.runs,
            "spend_usd": round(self.spend_usd, 2),
            "advice": [a.to_json() for a in self.advice],
        }


def advise_ledger(led: Ledger, period: str = "all") -> AdviceReport:
    """The advice over the runs started and plans made in `period` (as reports name it)."""
    span = parse_period(period)
    start, end = span.start, span.end

    def within(t: datetime) -> bool:
        t = aware(t)
        return (start is None or t >= start) and (end is None or t < end)

    with led.session() as s:
        plans = [p for p in s.scalars(select(PlanRecord)) if within(p.created_at)]
    runs = [r for r in led.runs() if within(r.started_at)]
    real = [r for r in runs if not r.dry_run]
    return AdviceReport(
        period, start, len(real), sum(r.cost_usd for r in real), advise(runs, plans)
    )
