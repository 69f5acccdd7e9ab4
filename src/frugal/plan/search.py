"""The search: every offer x GPU count x method, each set-up's fastest fitting
configuration (`plan/fit.py`: checkpointing x optimizer x sharding x micro-batch).

Time and money follow, on-demand and on spot (with interruptions priced in). Constraints
filter, the objective ranks, the Pareto frontier of cost vs time is kept, and every plan
carries its reasons; rejected ones say why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

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
from frugal.plan.transfer import DOWNLOAD_GBPS, move_in, move_out, parse_location
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
    give_reasons(best, feasible, frontier, k)
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
                rejected.append(Rejected(
                    f"{offer.provider} {offer.instance}",
                    f"{n} GPUs cannot share an effective batch of {k.effective_batch} "
                    f"sequences equally: use a multiple of {n}", "batch",
                ))  # fmt: skip
            continue
        for method in k.methods:
            label = f"{offer.provider} {f'{nodes}x ' if nodes > 1 else ''}{offer.instance} {method}"
            if offer.gpu.vendor != "nvidia" and method == "qlora":
                refused = (f"QLoRA needs bitsandbytes' CUDA kernels; on {offer.gpu.name} "
                           "(AMD, ROCm) frugal's trainer runs full and LoRA")  # fmt: skip
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


def _priced(offer: Offer, nodes: int, cfg: Config, k: Constraints) -> list[Plan]:
    """The on-demand and spot plans of one configuration on one offer."""
    job, mem, speed, prof = cfg.job, cfg.memory, cfg.speed, cfg.profile
    terms = offer.terms
    solve_h = k.tokens / speed.tokens_per_s / 3600
    weights = prof.start_bytes("frozen_weights") + prof.start_bytes("trainable_weights")
    setup_h = (
        0.0
        if offer.provider == "local"
        else (terms.boot_min / 60 + weights / (DOWNLOAD_GBPS * 1e9) / 3600)
    )
    # a resumable checkpoint: trainable weights and optimizer state (full: the whole model)
    ckpt = prof.start_bytes("trainable_weights") + prof.start_bytes("optimizer_state")
    delta_h = (ckpt / (DISK_GBPS * 1e9) + 10) / 3600
    output_gb = ckpt / 1e9 if job.method == "full" else prof.trainable_params * 2 / 1e9
    disk_gb = (weights + 2 * ckpt) / 1e9 + 1 + k.data_gb  # weights, two checkpoints, data
    # the dataset onto the VM and the result back to where the data lives (transfer.py)
    where = parse_location(k.data)
    data_in, data_out = move_in(where, k.data_gb, offer), move_out(output_gb, offer, where)
    setup_h += data_in.hours
    egress = data_in.usd + data_out.usd
    if not k.data_gb:  # no dataset size: its way in is not priced, nor said
        data_in = NO_MOVE

    def plan(spot: bool, hours: float, compute: float) -> Plan:
        storage = disk_gb * terms.storage_usd_gb_month * hours / HOURS_PER_MONTH
        return Plan(
            offer,
            nodes,
            job,
            speed,
            mem.peak_reserved / GIB,
            mem.device_total / GIB,
            spot,
            hours,
            compute,
            setup_h,
            storage,
            egress,
            value_of_time_usd_h=k.value_of_time_usd_h,
            output_gb=output_gb,
            data_in=data_in,
            data_out=data_out,
            host_offload_gib=mem.host / GIB,
            why_on=cfg.why_on,
        )

    out = []
    od_h = setup_h + solve_h
    if k.spot != "only" or offer.provider == "local":
        out.append(plan(False, od_h, od_h * offer.ondemand_usd_h * nodes))
    if k.spot != "never" and offer.spot_usd_h is not None:
        mtbi, why = (k.mtbi_h, "--spot-mtbi-hours") if k.mtbi_h else spot_math.offer_mtbi(offer)
        mtbi /= nodes  # any machine lost stops the run
        run = spot_math.spot_run(solve_h, delta_h, setup_h, mtbi)
        hours = setup_h + run.hours
        if not run.hours < SPOT_MOST * solve_h:  # interrupted faster than it can restart
            return out
        fb = None
        if k.deadline_h is not None and hours > k.deadline_h:
            fb = spot_math.fallback(hours, od_h, k.deadline_h)
        if fb is not None and fb.spot_share < 1:
            on_spot, on_demand = fb.switch_at_h, fb.hours - fb.switch_at_h
            p = plan(
                True,
                fb.hours,
                (on_spot * offer.spot_usd_h + on_demand * offer.ondemand_usd_h) * nodes,
            )
            p.fallback = fb
        else:
            p = plan(True, hours, hours * offer.spot_usd_h * nodes)
        p.checkpoint_interval_min = run.interval_h * 60
        p.interruptions = run.interruptions
        p.mtbi_h, p.mtbi_from = mtbi, why
        out.append(p)
    return out
