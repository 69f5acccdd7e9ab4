"""The search: every offer x GPU count x method x checkpointing x optimizer x micro-batch.

For each combination the estimator says whether it fits (with a safety margin) and the
throughput model how fast it runs; time and money follow, on-demand and on spot (with
interruptions priced in). Constraints filter, the objective ranks, the Pareto frontier of
cost vs time is kept, and every plan carries its reasons; rejected ones say why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from frugal.errors import FrugalError
from frugal.estimate.core import get_profile, largest_micro_batch
from frugal.estimate.overheads import Overheads, load_overheads
from frugal.estimate.profile import Profile
from frugal.estimate.throughput import Speed, SpeedConstants, load_speed_constants, step_time
from frugal.hardware.gpus import GIB, GPU, memory_budget
from frugal.hardware.offers import HOURS_PER_MONTH, Offer
from frugal.models.specs import ModelSpec
from frugal.plan import spot as spot_math
from frugal.plan.constraints import Constraints, node_network
from frugal.plan.plans import NO_MOVE, Infeasible, Plan, Rejected, Result, pareto
from frugal.plan.reasons import closest_miss, give_reasons
from frugal.plan.transfer import DOWNLOAD_GBPS, move_in, move_out, parse_location
from frugal.step.job import TrainJob, in_backward_refusal

NODE_COUNTS = (1, 2, 4)  # multi-node runs: up to 4 machines of a multi-GPU instance
# a set-up that does not fit is tried again with the memory techniques of the step, one more
# at a time, the cheapest in time first: the loss in this
# many chunks (--loss-chunks; the logits never whole, for one more LM-head matmul in
# backward), then the checkpointed layers' inputs offloaded to host memory
# (--offload-activations; two host-link copies)
AUTO_LOSS_CHUNKS = 16
LOGITS_SHARE = 0.2  # logits this share of the peak: the chunked loss may raise the micro-batch
# and last, for LoRA, AdamW's states in 8 bits where --optimizers lists it after another
EIGHT_BIT = "adamw-8bit"
# job fields, in the order the plan tries them
TECHNIQUES = ("loss_chunks", "optimizer_in_backward", "offload_activations", "optimizer")
SPOT_MOST = 100  # a spot run expected to take 100x its work is never planned: it never ends
DISK_GBPS = 1.0  # checkpoint write and weight read from local NVMe, GB/s


class _Profiles:
    """One memory profile per (method, precision, optimizer, checkpointing, accumulating
    or not): the expensive part, simulated once and cached on disk; everything else is
    arithmetic on it."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.cache: dict[tuple[Any, ...], Profile] = {}
        self.why = ""  # the set-up being judged, for --verbose

    def get(self, job: TrainJob) -> Profile:
        if job.precision == "fp16-mixed":  # same bytes and FLOPs as bf16: share its profile
            job = job.model_copy(update={"precision": "bf16-mixed"})
        key = tuple(sorted(job.profile_key().items()))
        if key not in self.cache:
            self.cache[key] = get_profile(self.spec, job, job.seq, self.why)
        return self.cache[key]


def _precision_for(gpu: GPU, wanted: str) -> str:
    """GPUs without bf16 run fp16 with loss scaling (the plan's reasons say so)."""
    return "fp16-mixed" if wanted.startswith("bf16") and not gpu.bf16 else wanted


def search(
    spec: ModelSpec,
    base: TrainJob,
    offers: Iterable[Offer],
    k: Constraints,
    speed_constants: SpeedConstants | None = None,
) -> Result:
    profiles = _Profiles(spec)
    plans: list[Plan] = []
    rejected: list[Rejected] = []
    fit_memo: dict[tuple[Any, ...], tuple[TrainJob, Any, Speed, Profile] | str] = {}
    constants: dict[tuple[str, str], tuple[SpeedConstants, Overheads]] = {}
    offers = list(offers)
    if not offers:
        raise FrugalError("no offers to plan on: check --providers and --prices")

    for offer in offers:
        node_gb_s = node_network(offer, k)[0]
        node_options = NODE_COUNTS if node_gb_s > 0 and offer.gpus >= 8 else (1,)
        for nodes in node_options:
            n = nodes * offer.gpus
            if n > k.max_gpus:
                continue
            if k.effective_batch % n:  # each GPU takes an equal share of the step
                if nodes == 1:
                    rejected.append(
                        Rejected(
                            f"{offer.provider} {offer.instance}",
                            f"{n} GPUs cannot share an effective batch of "
                            f"{k.effective_batch} sequences equally: use a multiple of {n}",
                            "batch",
                        )
                    )
                continue
            for method in k.methods:
                label = (
                    f"{offer.provider} {f'{nodes}x ' if nodes > 1 else ''}{offer.instance} {method}"
                )
                if offer.gpu.vendor != "nvidia" and method == "qlora":
                    refused = (f"QLoRA needs bitsandbytes' CUDA kernels; on {offer.gpu.name} "
                           "(AMD, ROCm) frugal's trainer runs full and LoRA")  # fmt: skip
                    rejected.append(Rejected(label, refused, "method"))
                    continue
                # the calibration's constants for this GPU and method (its groups), read once
                if (offer.gpu.name, method) not in constants:
                    constants[offer.gpu.name, method] = (
                        speed_constants or load_speed_constants(offer.gpu.name, method),
                        load_overheads(method),
                    )
                sc, ov = constants[offer.gpu.name, method]
                found = _best_config(
                    spec,
                    base,
                    offer.gpu,
                    n,
                    offer.gpus,
                    nodes,
                    method,
                    k,
                    profiles,
                    sc,
                    fit_memo,
                    node_gb_s,
                    ov,
                )
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
                plans.extend(priced)
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


def _best_config(
    spec: ModelSpec,
    base: TrainJob,
    gpu: GPU,
    n: int,
    per_node: int,
    nodes: int,
    method: str,
    k: Constraints,
    profiles: _Profiles,
    sc: SpeedConstants,
    memo: dict[tuple[Any, ...], Any],
    node_gbps: float,
    ov: Overheads,
    because: str = "",
) -> Config | Rejected:
    """The fastest fitting (checkpointing, optimizer, sharding, micro-batch) for one GPU
    set-up, or why none fits. Where nothing fits, the next memory technique
    (`_next_technique`) is tried too; where the logits hold the micro-batch below the GPU's
    share, the chunked loss, kept if it fits a larger micro-batch that is faster."""
    key = (
        gpu.name, n, per_node, method, node_gbps if nodes > 1 else 0.0,
        base.loss_chunks, base.offload_activations, base.optimizer, base.optimizer_in_backward,
    )  # fmt: skip
    if key in memo:
        return memo[key]
    precision = _precision_for(gpu, base.precision)
    refusal = in_backward_refusal(n, 1, precision)  # the job's own rule
    if base.optimizer_in_backward and refusal:
        memo[key] = Rejected("", refusal, "fit")
        return memo[key]
    if gpu.peak_tflops(base.model_copy(update={"precision": precision}).compute_dtype) is None:
        memo[key] = Rejected("", f"{gpu.name} cannot run {base.precision}", "dtype")
        return memo[key]
    cap = memory_budget(gpu.usable_gib, k.margin)
    share = k.effective_batch // n  # search() only tries GPU counts that divide it
    best: Config | None = None
    smallest_need = math.inf
    floor = math.inf  # the least any memory technique could bring the step down to
    # full fine-tuning tries every optimizer; LoRA the first, or the 8-bit one as a technique
    lean = base.optimizer == EIGHT_BIT and EIGHT_BIT in k.optimizers[1:]
    optimizers = (
        k.optimizers if method == "full" else (base.optimizer,) if lean else k.optimizers[:1]
    )
    # the shardings `frugal train` runs: FSDP needs bf16 or fp32 and full or LoRA weights
    fsdp_ok = (
        n > 1
        and method != "qlora"
        and precision != "fp16-mixed"
        and not (base.loss_chunks or base.offload_activations)
    )
    shardings = ("ddp", "fsdp") if fsdp_ok else ("ddp",)
    lora: dict[str, Any] = (
        {}
        if method == "full"
        else {
            "lora_r": base.lora_r,
            "lora_alpha": base.lora_alpha,
            "lora_targets": base.lora_targets,
            "lora_dropout": base.lora_dropout,
        }
    )
    unfit: set[tuple[str, str]] = set()  # (optimizer, sharding) that did not fit checkpointed
    profiles.why = f"first asked for {n}x {gpu.name}" + (f" ({because})" if because else "")
    for ckpt in (True,) if base.offload_activations else (True, False):
        for opt in optimizers:
            for sharding in shardings:
                if not ckpt and (opt, sharding) in unfit:
                    continue  # without checkpointing a step never needs less: not simulated
                job = TrainJob.model_validate(
                    {
                        "method": method,
                        "precision": precision,
                        "optimizer": opt,
                        "seq": base.seq,
                        "grad_checkpointing": ckpt,
                        "attention": base.attention,
                        "packing": base.packing,
                        "loss": base.loss,
                        "loss_chunks": base.loss_chunks,
                        "offload_activations": base.offload_activations,
                        "optimizer_in_backward": base.optimizer_in_backward,
                        "gpus": n,
                        "sharding": sharding,
                        **lora,
                    }
                )
                fit, at_one = largest_micro_batch(job, cap, profiles.get, share, ov)
                if fit is None:  # at_one: at the least micro-batch the job can run
                    unfit.add((opt, sharding))
                    smallest_need = min(smallest_need, at_one.device_total)
                    floor = min(floor, _floor(at_one))
                    continue
                speed = step_time(
                    fit.profile, fit.job, gpu, spec.hidden_size, per_node,
                    0.0 if nodes == 1 else node_gbps, sc,
                )  # fmt: skip
                if speed is None:
                    continue
                if best is None or speed.tokens_per_s > best.speed.tokens_per_s:
                    best = Config(fit.job, fit.memory, speed, fit.profile)
    more = _next_technique(spec, base, k, method)
    if more is not None and more.optimizer_in_backward and refusal:
        more = _next_technique(spec, more, k, method)  # one this set-up cannot run: skip it
    # a technique may make the set-up fit; the chunked loss, which costs little time, may also
    # raise a micro-batch the logits hold down (fewer micro-steps: fewer weight passes)
    logits_bound = (
        best is not None
        and best.job.batch < share
        and more is not None
        and more.loss_chunks != base.loss_chunks
        and best.memory.breakdown["logits_and_loss"] >= LOGITS_SHARE * best.memory.peak_allocated
    )
    hopeless = best is None and floor > cap  # the weights alone do not fit: no technique helps
    if more is not None and not hopeless and (best is None or logits_bound):
        added = next(t for t in TECHNIQUES if getattr(more, t) != getattr(base, t))
        found = _best_config(
            spec, more, gpu, n, per_node, nodes, method, k, profiles, sc, memo, node_gbps, ov,
            f"--{added.replace('_', '-')}: nothing fit without it" if best is None
            else f"--{added.replace('_', '-')}: the logits held the micro-batch to "
            f"{best.job.batch}",
        )  # fmt: skip
        if best is None or (  # kept where the memory it frees buys a larger, faster micro-batch
            not isinstance(found, Rejected)
            and found.job.batch > best.job.batch
            and found.speed.tokens_per_s > best.speed.tokens_per_s
        ):
            if not isinstance(found, Rejected):
                found = found.turned_on(
                    added,
                    "without it this set-up does not fit"
                    if best is None
                    else f"without it micro-batch {best.job.batch}, "
                    f"{best.speed.tokens_per_s:,.0f} tokens/s",
                )
            memo[key] = found
            return found
    if best is None:
        need, have = smallest_need / GIB, cap / GIB
        least = share if base.optimizer_in_backward else 1
        why = (
            f"does not fit{_even_with(base)}: needs {need:.1f} GiB per GPU at micro-batch "
            f"{least}, {gpu.name} has {have:.1f} usable with the margin"
        )
        memo[key] = Rejected("", why, "fit", need_gib=need, have_gib=have, need_batch=least)
    else:
        memo[key] = best
    return memo[key]


@dataclass
class Config:
    """The fastest fitting configuration of one GPU set-up."""

    job: TrainJob
    memory: Any
    speed: Speed
    profile: Profile
    why_on: dict[str, str] = field(default_factory=dict)  # technique -> why the plan chose it

    def turned_on(self, technique: str, why: str) -> Config:
        """This configuration, saying why the plan turned `technique` on."""
        why_on = {**self.why_on, technique: why}
        return Config(self.job, self.memory, self.speed, self.profile, why_on)


def _floor(m: Any) -> float:
    """A lower bound on the step's device memory with every technique on: no activations, no
    logits, no reserve for them, no gradients, a quarter of the optimizer state."""
    b = m.breakdown
    gone = b["activations"] + b["logits_and_loss"] + b["allocator_reserve"] + b["gradients"]
    return float(m.device_total - gone - 0.75 * b["optimizer_state"])


def _even_with(job: TrainJob) -> str:
    on = [f"the loss in {job.loss_chunks} chunks"] if job.loss_chunks else []
    on += ["offloaded activations"] if job.offload_activations else []
    on += ["the optimizer in backward"] if job.optimizer_in_backward else []
    return f" even with {' and '.join(on)}" if on else ""


def _next_technique(spec: ModelSpec, job: TrainJob, k: Constraints, method: str) -> TrainJob | None:
    """`job` with the next memory technique the plan may turn on, or None: cheapest in time
    first, the chunked loss (one more LM-head matmul), the optimizer in backward (no time,
    but no clipping; full fine-tuning, one GPU), offloading (host-link copies), AdamW in 8
    bits (LoRA; full fine-tuning tries every listed optimizer anyway)."""
    chunkable = not spec.soft_caps_logits  # the chunked loss cannot cap the logits
    if k.auto_loss_chunks and chunkable and not job.loss_chunks and job.seq >= AUTO_LOSS_CHUNKS:
        return job.model_copy(update={"loss_chunks": AUTO_LOSS_CHUNKS})
    if method == "full" and k.auto_in_backward and not job.optimizer_in_backward:
        return job.model_copy(update={"optimizer_in_backward": True})  # LoRA's gradients: small
    if k.auto_offload and not job.offload_activations:
        return job.model_copy(update={"offload_activations": True, "grad_checkpointing": True})
    if method != "full" and job.optimizer != EIGHT_BIT and EIGHT_BIT in k.optimizers[1:]:
        return job.model_copy(update={"optimizer": EIGHT_BIT})  # full tries it anyway
    return None


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
