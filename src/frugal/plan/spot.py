"""Spot instances: how often they are taken away, when to checkpoint, what it costs.

* Interruption rate. Measured where measurements exist: the public GPU spot traces behind
  "Can't Be Late" (Wu et al., NSDI 2024; data/spot_traces.csv) give p3.2xlarge 0.44
  preemptions per hour held (the median of 7 zones) and p3.16xlarge 1.09. Elsewhere from
  the offer's interruption bucket: AWS's Spot Instance Advisor publishes one per instance
  type and region (<5%,
  5-10%, ... >20%, "the rate at which Spot reclaimed capacity over the trailing month");
  providers that publish none get a default (providers.csv). Read as a monthly probability
  per instance, the >20% bucket would mean one interruption in 2,000 hours, while the
  traced p3 instances, all >20% in the Advisor, were interrupted every 2.3 hours held. So
  frugal scales each bucket's midpoint (>20%: 30%) to the measured rate:
  lambda(bucket) = p_mid / 0.30 x 0.44 per hour (>20%: every 2.3 h; <5%: every 27 h).
  The plan says which of these it used; `--spot-mtbi-hours` overrides both.
* Checkpoint interval. Young (1974): tau = sqrt(2 delta M). Daly (2006, FGCS 22(3)) to
  higher order: tau = sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta
  for delta < 2M, else tau = M (delta = time to write a checkpoint).
* Expected wall time with interruptions (Daly 2006, eq. 20): a job of T_s solve hours,
  checkpointed every tau, restarting in R after each interruption, takes
  T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau. Lost work, restarts and checkpoint
  writes are all in T_w, so cost = T_w x price prices them in.
* Deadline fallback ("Can't Be Late", Wu et al., NSDI 2024): run on spot while the work
  left still fits the deadline on on-demand, then switch. With spot progressing at T_s/T_w
  of real time, the switch comes at t = (D - T_od) / (1 - T_od / T_w); spot does t / T_w of
  the work and on-demand the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from importlib import resources

from frugal.errors import FrugalError
from frugal.hardware.csvdata import data_rows
from frugal.hardware.offers import Offer

DEFAULT_CHECKPOINT_MIN = 30.0  # checkpoint interval of a run whose config has no plan
BUCKET_P = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.30}
TOP = ">20%"


@dataclass(frozen=True)
class Measured:
    """Interruptions observed on one instance type (data/spot_traces.csv)."""

    instance: str
    rate_per_h: float
    held_hours: float
    preemptions: int
    kind: str  # held | availability (a proxy)
    source: str


@cache
def measured() -> dict[tuple[str, str], Measured]:
    text = (resources.files("frugal.hardware") / "data" / "spot_traces.csv").read_text()
    out = {}
    for _, r in data_rows(text, "spot_traces.csv"):
        out[r["provider"], r["instance"]] = Measured(
            r["instance"],
            float(r["rate_per_h"]),
            float(r["held_hours"]),
            int(r["preemptions"]),
            r["kind"],
            r["source"],
        )
    return out


def calibration() -> Measured:
    """The measured rate the buckets are scaled to: held p3.2xlarge instances (>20%)."""
    return measured()[("aws", "p3.2xlarge")]


def mtbi_hours(bucket: str) -> float:
    """Mean hours between interruptions for an interruption-frequency bucket: its midpoint,
    scaled so that >20% is the measured rate of held GPU spot instances (see above)."""
    try:
        p = BUCKET_P[bucket]
    except KeyError:
        raise FrugalError(
            f"unknown interruption bucket {bucket!r}; use one of {', '.join(BUCKET_P)}"
        ) from None
    return 1 / (calibration().rate_per_h * p / BUCKET_P[TOP])


def offer_mtbi(offer: Offer) -> tuple[float, str]:
    """Mean hours between interruptions of a spot offer, and where the figure comes from."""
    m = measured().get((offer.provider, offer.instance))
    if m is not None:
        what = "held" if m.kind == "held" else "availability proxy"
        return 1 / m.rate_per_h, (
            f"measured: {m.preemptions} interruptions in {m.held_hours:,.0f} h of "
            f"{m.instance} ({what}; NSDI'24 spot traces)"
        )
    bucket = offer.interruption
    if offer.advised:
        whose = f"AWS Spot Advisor's {bucket} for {offer.instance} in {offer.region}"
    elif offer.provider == "aws":
        whose = f"no Spot Advisor figure for {offer.instance} in {offer.region}: {bucket} assumed"
    else:
        whose = f"{offer.provider} publishes no rate: {bucket} assumed"
    return mtbi_hours(bucket), f"{whose}, scaled to the measured GPU spot rate"


def young_interval(delta: float, mtbi: float) -> float:
    """Young's checkpoint interval, in the unit of the arguments."""
    return math.sqrt(2 * delta * mtbi)


def daly_interval(delta: float, mtbi: float) -> float:
    """Daly's higher-order optimum checkpoint interval, in the unit of the arguments."""
    if delta >= 2 * mtbi:
        return mtbi
    x = delta / (2 * mtbi)
    return math.sqrt(2 * delta * mtbi) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def expected_wall(solve: float, tau: float, delta: float, restart: float, mtbi: float) -> float:
    """Daly's expected wall time of `solve` hours of work (all arguments in hours); infinite
    where interruptions come so often that a restart and one interval almost never fit
    between two of them."""
    if solve <= 0:
        return 0.0
    if (restart + tau + delta) / mtbi > 700:  # exp() past float's range: it never finishes
        return math.inf
    return mtbi * math.exp(restart / mtbi) * math.expm1((tau + delta) / mtbi) * solve / tau


@dataclass
class SpotRun:
    hours: float  # expected wall time on spot, interruptions included
    interval_h: float  # checkpoint interval
    interruptions: float  # expected number
    mtbi_h: float


def spot_run(solve_h: float, delta_h: float, restart_h: float, mtbi_h: float) -> SpotRun:
    tau = min(daly_interval(delta_h, mtbi_h), max(solve_h, 1e-6))
    wall = expected_wall(solve_h, tau, delta_h, restart_h, mtbi_h)
    return SpotRun(wall, tau, wall / mtbi_h, mtbi_h)


@dataclass
class Fallback:
    switch_at_h: float  # wall time on spot before switching to on-demand
    spot_share: float  # share of the work done on spot
    hours: float  # total wall time (= the deadline when the switch happens)


def fallback(spot_wall_h: float, ondemand_h: float, deadline_h: float) -> Fallback | None:
    """Spot first, then on-demand when the rest only just fits; None if on-demand misses too."""
    if ondemand_h > deadline_h:
        return None
    if spot_wall_h <= deadline_h:
        return Fallback(spot_wall_h, 1.0, spot_wall_h)
    t = (deadline_h - ondemand_h) / (1 - ondemand_h / spot_wall_h)
    share = t / spot_wall_h
    return Fallback(t, share, t + (1 - share) * ondemand_h)
