"""The search: every offer x GPU count x method, each set-up's fastest fitting
configuration (`plan/fit.py`: checkpointing x optimizer x sharding x micro-batch).

Time and money follow, on-demand and on spot (with interruptions priced in). Constraints
filter, the objective ranks, the Pareto frontier of cost vs time is kept, and every plan
carries its reasons; rejected ones say why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import partial

from frugal.errors import FrugalError
from frugal.estimate.throughput import SpeedConstants
from frugal.hardware.gpus import GIB
from frugal.hardware.offers import HOURS_PER_MONTH, Offer
from frugal.models.specs import ModelSpec
from frugal.plan import spot as spot_math
from frugal.plan.constraints import Constraints, node_network
from frugal.plan.fit import Config, Fitter, SetUp
from frugal.plan.plans import NO_MOVE, Infeasible, Plan, Rejected, Result, pareto
from frugal.plan.reasons import closest_miss, give_reasons
from frugal.plan.transfer import DOWNLOAD_GBPS, Move, move_in, move_out, parse_location
from frugal.step.job import TrainJob

NODE_COUNTS = (1, 2, 4)  # multi-node runs: up to 4 machines of a multi-GPU instance
SPOT_MOST = 100  # a spot run expected to take 100x its work is never planned: it never ends
DISK_GBPS = 1.0  # checkpoint write and weight read from local NVMe, GB/s


def search(
    spec: ModelSpec,
    base: TrainJob,
    offers: Iterable[Offer],
    k: Constraints,
    speed_constants: SpeedConstants | None = None,
) -> Result:
    """Every plan of `base` on `offers` under `k`, ranked by the objective, with the
    cost-vs-time frontier, the reasons of the best and what was rejected; Infeasible (the
    closest miss) when none meets the constraints."""
    offers = list(offers)
    if not offers:
        raise FrugalError("no offers to plan on: check --providers and --prices")
    fitter = Fitter(spec, k, speed_constants)
    plans: list[Plan] = []
    rejected: list[Rejected] = []
    for offer in offers:
        plans += _plans_on(offer, base, k, fitter, rejected)
    feasible, over = _within(plans, k)
    if not feasible:
        raise Infeasible(closest_miss(plans, rejected, k), plans, rejected)
    key = (
        (lambda p: (p.weighed_cost_usd, p.hours))  # dollars alone when time is not valued
        if k.objective == "cost"
        else (lambda p: (p.hours, p.cost_usd))
    )
    feasible.sort(key=key)
    best = feasible[0]
    frontier = pareto(feasible)
    give_reasons(best, feasible, frontier, k, fitter.launch_note(best))
    over.sort(key=lambda r: r.cost_usd or 0.0)
    fit_rej = sorted(rejected, key=lambda r: r.label)
    return Result(best, frontier, feasible, _distinct(over)[:5] + _distinct(fit_rej)[:5], [])


def _plans_on(
    offer: Offer, base: TrainJob, k: Constraints, fitter: Fitter, rejected: list[Rejected]
) -> list[Plan]:
    """The plans of one offer, on one machine or several, by each method; what cannot run
    there goes to `rejected`, with why."""
    plans: list[Plan] = []
    node_gb_s = node_network(offer, k)[0]
    for nodes in NODE_COUNTS if node_gb_s > 0 and offer.gpus >= 8 else (1,):
        n = nodes * offer.gpus
        if n > k.max_gpus:
            continue
        if k.effective_batch % n:  # each GPU takes an equal share of the step
            if nodes == 1:
                rejected.append(
                    Rejected(
                        f"{offer.provider} {offer.instance}",
                        f"{n} GPUs cannot share an effective batch of {k.effective_batch} "
                        f"sequences equally: use a multiple of {n}",
                        "batch",
                    )
                )
            continue
        for method in k.methods:
            label = f"{offer.provider} {f'{nodes}x ' if nodes > 1 else ''}{offer.instance} {method}"
            if offer.gpu.vendor != "nvidia" and method == "qlora":
                refused = (
                    f"QLoRA needs bitsandbytes' CUDA kernels; on {offer.gpu.name} "
                    "(AMD, ROCm) frugal's trainer runs full and LoRA"
                )
                rejected.append(Rejected(label, refused, "method"))
                continue
            found = fitter.best(SetUp(offer.gpu, n, offer.gpus, nodes, method, node_gb_s), base)
            if isinstance(found, Rejected):
                rejected.append(replace(found, label=label))
                continue
            priced = _priced(offer, nodes, found, k)
            if not priced and offer.spot_usd_h is not None:  # --spot, and it never ends
                every = k.mtbi_h or spot_math.offer_mtbi(offer)[0]
                never = (
                    f"on spot it would not finish: interrupted every {every:.3g} h, "
                    "faster than it restarts (raise --spot-mtbi-hours, or drop --spot)"
                )
                rejected.append(Rejected(label, never, "spot"))
            plans += priced
    return plans


def _within(plans: list[Plan], k: Constraints) -> tuple[list[Plan], list[Rejected]]:
    """The plans that meet the deadline and the budget, and why the others do not."""
    feasible, over = [], []
    for p in plans:
        why = None
        if k.deadline_h is not None and p.hours > k.deadline_h:
            why, kind = f"takes {p.hours:.1f} h, deadline {k.deadline_h:g} h", "deadline"
        elif k.budget_usd is not None and p.cost_usd > k.budget_usd:
            why, kind = f"costs ${p.cost_usd:,.2f}, budget ${k.budget_usd:,.2f}", "budget"
        if why:
            over.append(Rejected(p.label(), why, kind, p.cost_usd, p.hours))
        else:
            feasible.append(p)
    return feasible, over


def _distinct(rejected: list[Rejected]) -> list[Rejected]:
    """One of each option and reason, in order: an instance sold in several regions is
    rejected once per region, for the same reason, and would fill the list with one line."""
    seen: set[tuple[str, str]] = set()
    out = []
    for r in rejected:
        if (r.label, r.why) not in seen:
            seen.add((r.label, r.why))
            out.append(r)
    return out


@dataclass
class _Bill:
    """One configuration on one offer: its hours of work and what they cost besides the
    GPUs (set-up, storage, data in and out)."""

    offer: Offer
    nodes: int
    cfg: Config
    k: Constraints
    solve_h: float  # the training itself
    setup_h: float  # boot, weights and dataset in
    delta_h: float  # one resumable checkpoint
    disk_gb: float
    output_gb: float
    egress_usd: float
    data_in: Move
    data_out: Move

    def plan(self, spot: bool, hours: float, compute_usd: float) -> Plan:
        o, c, mem = self.offer, self.cfg, self.cfg.memory
        storage = self.disk_gb * o.terms.storage_usd_gb_month * hours / HOURS_PER_MONTH
        return Plan(
            o,
            self.nodes,
            c.job,
            c.speed,
            mem.peak_reserved / GIB,
            mem.device_total / GIB,
            spot,
            hours,
            compute_usd,
            self.setup_h,
            storage,
            self.egress_usd,
            value_of_time_usd_h=self.k.value_of_time_usd_h,
            output_gb=self.output_gb,
            data_in=self.data_in,
            data_out=self.data_out,
            host_offload_gib=mem.host / GIB,
            why_on=c.why_on,
            profile=c.profile,
        )


def _bill(offer: Offer, nodes: int, cfg: Config, k: Constraints) -> _Bill:
    job, prof = cfg.job, cfg.profile
    weights = prof.start_bytes("frozen_weights") + prof.start_bytes("trainable_weights")
    setup_h = (
        0.0
        if offer.provider == "local"
        else (offer.terms.boot_min / 60 + weights / (DOWNLOAD_GBPS * 1e9) / 3600)
    )
    # a resumable checkpoint: trainable weights and optimizer state (full: the whole model)
    ckpt = prof.start_bytes("trainable_weights") + prof.start_bytes("optimizer_state")
    output_gb = ckpt / 1e9 if job.method == "full" else prof.trainable_params * 2 / 1e9
    # the dataset onto the VM and the result back to where the data lives (transfer.py)
    where = parse_location(k.data)
    data_in, data_out = move_in(where, k.data_gb, offer), move_out(output_gb, offer, where)
    return _Bill(
        offer,
        nodes,
        cfg,
        k,
        solve_h=k.tokens / cfg.speed.tokens_per_s / 3600,
        setup_h=setup_h + data_in.hours,
        delta_h=(ckpt / (DISK_GBPS * 1e9) + 10) / 3600,
        # weights, two checkpoints, data, and what the run writes besides (Constraints)
        disk_gb=(weights + 2 * ckpt) / 1e9 + 1 + k.data_gb + k.scratch_gb,
        output_gb=output_gb,
        egress_usd=data_in.usd + data_out.usd,
        data_in=data_in if k.data_gb else NO_MOVE,  # no dataset size: not priced, nor said
        data_out=data_out,
    )


def _priced(offer: Offer, nodes: int, cfg: Config, k: Constraints) -> list[Plan]:
    """The on-demand and spot plans of one configuration on one offer, each able to price
    itself at the fastest and the slowest speed expected (`Plan.hours_range`: set-up,
    interruptions and fallback included), which only the plans shown are asked to do."""
    b = _bill(offer, nodes, cfg, k)
    plans = _priced_at(b)
    for p in plans:
        p.reprice = partial(_repriced, b, p.spot)
    return plans


def _repriced(b: _Bill, spot: bool, factor: float) -> Plan | None:
    """The plan of `b` (on spot or not) with `factor` times its hours of work."""
    return next(
        (p for p in _priced_at(replace(b, solve_h=b.solve_h * factor)) if p.spot == spot), None
    )


def _priced_at(b: _Bill) -> list[Plan]:
    """The on-demand and spot plans of `b`'s hours of work."""
    offer, nodes, k = b.offer, b.nodes, b.k
    out = []
    od_h = b.setup_h + b.solve_h
    if k.spot != "only" or offer.provider == "local":
        out.append(b.plan(False, od_h, od_h * offer.ondemand_usd_h * nodes))
    if k.spot != "never" and offer.spot_usd_h is not None:
        on_spot = _on_spot(b, offer.spot_usd_h, od_h)
        out += [on_spot] if on_spot else []
    return out


def _on_spot(b: _Bill, spot_usd_h: float, od_h: float) -> Plan | None:
    """The plan on spot, with its interruptions priced in and, where the deadline needs it,
    a switch to on-demand; None where it is interrupted faster than it can restart."""
    offer, nodes, k = b.offer, b.nodes, b.k
    mtbi, why = (k.mtbi_h, "--spot-mtbi-hours") if k.mtbi_h else spot_math.offer_mtbi(offer)
    mtbi /= nodes  # any machine lost stops the run
    run = spot_math.spot_run(b.solve_h, b.delta_h, b.setup_h, mtbi)
    hours = b.setup_h + run.hours
    if not run.hours < SPOT_MOST * b.solve_h:
        return None
    fb = None
    if k.deadline_h is not None and hours > k.deadline_h:
        fb = spot_math.fallback(hours, od_h, k.deadline_h)
    if fb is not None and fb.spot_share < 1:
        on_spot, on_demand = fb.switch_at_h, fb.hours - fb.switch_at_h
        usd = (on_spot * spot_usd_h + on_demand * offer.ondemand_usd_h) * nodes
        p = b.plan(True, fb.hours, usd)
        p.fallback = fb
    else:
        p = b.plan(True, hours, hours * spot_usd_h * nodes)
    p.checkpoint_interval_min = run.interval_h * 60
    p.interruptions = run.interruptions
    p.mtbi_h, p.mtbi_from = mtbi, why
    return p
