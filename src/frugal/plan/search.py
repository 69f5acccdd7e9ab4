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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import JsonDict

from frugal.config import TrainingConfig
from frugal.durations import Hours
from frugal.errors import FrugalError
from frugal.estimate.core import get_profile, largest_micro_batch
from frugal.estimate.overheads import Overheads, load_overheads
from frugal.estimate.profile import Profile
from frugal.estimate.throughput import Speed, SpeedConstants, load_speed_constants, step_time
from frugal.hardware.gpus import GIB, GPU, MARGIN, memory_budget
from frugal.hardware.offers import HOURS_PER_MONTH, Offer
from frugal.models.specs import ModelSpec
from frugal.plan import spot as spot_math
from frugal.plan.transfer import DOWNLOAD_GBPS, Move, move_in, move_out, parse_location
from frugal.step.job import Method, Optimizer, TrainJob, in_backward_refusal
from frugal.validation import RANGE_ERRORS, problem

NO_MOVE = Move(0.0, 0.0, "")
SpotMode = Literal["auto", "only", "never"]
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


def _cli(flag: str) -> JsonDict:
    return {"flag": flag}  # the `frugal plan` option of a field named otherwise


class Constraints(BaseModel):
    """What a plan must meet, validated here for every caller. `frugal plan`'s options are
    made from these fields (their defaults and descriptions are the help text)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    tokens: float = Field(gt=0, description="training tokens in total (dataset x epochs)")
    effective_batch: int = Field(
        TrainingConfig.model_fields["effective_batch"].default,
        ge=1,
        le=1_048_576,
        description=TrainingConfig.model_fields["effective_batch"].description,
    )
    budget_usd: float | None = Field(
        None, gt=0, description="most you will spend, USD", json_schema_extra=_cli("--budget")
    )
    deadline_h: Hours = Field(
        None,
        description="time until the run must be done: 24h, 90m, 2d, 1h30m (a number is hours)",
        json_schema_extra=_cli("--deadline"),
    )
    max_gpus: int = Field(64, ge=1, description="most GPUs in one run")
    spot: SpotMode = Field("auto", description="spot offers: auto (both), only, or never")
    methods: tuple[Method, ...] = Field(
        ("lora",),
        min_length=1,
        description="methods to compare, e.g. lora,qlora",
    )
    optimizers: tuple[Optimizer, ...] = Field(
        ("adamw", "adamw-8bit"), min_length=1, description="optimizers to try for full fine-tuning"
    )
    margin: float = Field(MARGIN, ge=0, lt=0.5, description="share of usable GPU memory kept free")
    mtbi_h: Hours = Field(
        None,
        description="mean time between spot interruptions, e.g. 12h or 3d (a number is hours; "
        "overrides the offers' buckets)",
        json_schema_extra=_cli("--spot-mtbi-hours"),
    )
    objective: Literal["cost", "time"] = Field(
        "cost", description="what to minimize: cost or time", json_schema_extra=_cli("--optimize")
    )
    value_of_time_usd_h: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="what an hour of waiting for the result is worth, USD: --optimize cost "
        "ranks by cost + this x hours (0: dollars alone)",
        json_schema_extra=_cli("--value-of-time"),
    )
    auto_loss_chunks: bool = Field(
        True,
        description="try the loss in chunks where a set-up does not fit, or where the logits "
        "hold its micro-batch down (off when --loss-chunks is given)",
    )
    auto_offload: bool = Field(
        True,
        description="then try offloading activations to host memory where it still does "
        "not fit (off when --[no-]offload-activations is given)",
    )
    auto_in_backward: bool = Field(
        True,
        description="for full fine-tuning on one GPU, try the optimizer in backward after "
        "the chunked loss (off when --[no-]optimizer-in-backward is given)",
    )
    data: str = Field(
        "local",
        description="where the dataset is and results go: local, hub or PROVIDER:REGION",
    )
    data_gb: float = Field(
        0.0, ge=0, le=1e6, description="the dataset's size, GB, up to a petabyte (0: not priced)"
    )
    network_gbps: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="bandwidth between nodes, Gbit/s a node (400 for one NDR InfiniBand or EFA "
        "link): multi-node plans use it, also on providers frugal knows no fast network "
        "between nodes for (by default, each provider's; none: one node only)",
    )

    @classmethod
    def build(cls, **values: Any) -> Constraints:
        """Validated constraints, or one line naming the option to fix."""
        try:
            return cls.model_validate(values)
        except ValidationError as e:
            loc, kind, msg = problem(e, cls)
            name = str((loc or ("",))[0])
            field = cls.model_fields.get(name)
            extra = field.json_schema_extra if field else None
            flag = extra["flag"] if isinstance(extra, dict) else "--" + name.replace("_", "-")
            if kind == "value_error" or kind in RANGE_ERRORS:  # names the value first
                raise FrugalError(f"{flag} {msg}") from None
            raise FrugalError(f"{flag}: {msg}") from None


@dataclass
class Plan:
    offer: Offer
    nodes: int
    job: TrainJob
    speed: Speed
    peak_reserved_gib: float
    device_total_gib: float
    spot: bool
    hours: float
    compute_usd: float
    setup_h: float
    storage_usd: float
    egress_usd: float
    checkpoint_interval_min: float | None = None
    interruptions: float = 0.0
    mtbi_h: float = 0.0  # on spot: mean hours between interruptions (of the whole run)
    mtbi_from: str = ""  # and where that figure comes from
    fallback: spot_math.Fallback | None = None
    reasons: list[str] = field(default_factory=list)
    value_of_time_usd_h: float = 0.0  # Constraints.value_of_time_usd_h, weighs the hours
    output_gb: float = 0.0  # what the run hands back: the adapter, or the whole model
    data_in: Move = NO_MOVE  # the dataset onto the machine (in egress_usd and setup_h)
    data_out: Move = NO_MOVE  # the result back to where the data lives (in egress_usd)
    host_offload_gib: float = 0.0  # pinned host memory per GPU (--offload-activations)
    why_on: dict[str, str] = field(default_factory=dict)  # techniques the plan turned on, why

    @property
    def cost_usd(self) -> float:
        return self.compute_usd + self.storage_usd + self.egress_usd

    @property
    def data_note(self) -> str:
        return (
            f"{self.data_in.reason}; {self.data_out.reason}"
            if self.data_in.reason
            else (self.data_out.reason)
        )

    @property
    def time_value_usd(self) -> float:
        """The wait priced: the value of time x the hours until the result (setup, and
        on spot the expected interruptions, included)."""
        return self.value_of_time_usd_h * self.hours

    @property
    def weighed_cost_usd(self) -> float:
        """What `--optimize cost` ranks by: dollars spent plus the wait priced."""
        return self.cost_usd + self.time_value_usd

    @property
    def gpus(self) -> int:
        return self.job.gpus

    @property
    def price_per_hour(self) -> float:
        o = self.offer
        p = o.spot_usd_h if self.spot and o.spot_usd_h is not None else o.ondemand_usd_h
        return p * self.nodes

    def label(self) -> str:
        nodes = f"{self.nodes}x " if self.nodes > 1 else ""
        spot = " spot" if self.spot else ""
        return f"{self.offer.provider} {nodes}{self.offer.instance}{spot} {self.job.method}"

    def to_json(self) -> dict[str, Any]:
        j = self.job
        return {
            "provider": self.offer.provider,
            "instance": self.offer.instance,
            "region": self.offer.region,
            "nodes": self.nodes,
            "gpu": self.offer.gpu.name,
            "gpus": j.gpus,
            "spot": self.spot,
            "spot_fallback": (
                {
                    "switch_to_ondemand_after_h": round(self.fallback.switch_at_h, 2),
                    "spot_share": round(self.fallback.spot_share, 3),
                }
                if self.fallback and self.fallback.spot_share < 1
                else None
            ),
            "method": j.method,
            "precision": j.precision,
            "sharding": j.sharding if j.gpus > 1 else None,
            "micro_batch": j.batch,
            "grad_accum": j.grad_accum,
            "grad_checkpointing": j.grad_checkpointing,
            "optimizer": j.optimizer,
            "optimizer_in_backward": j.optimizer_in_backward,
            "seq": j.seq,
            "loss_chunks": j.loss_chunks,
            "offload_activations": j.offload_activations,
            "host_offload_gib": round(self.host_offload_gib, 2),
            "est_hours": round(self.hours, 3),
            "est_cost_usd": round(self.cost_usd, 2),
            "cost_breakdown_usd": {
                "compute": round(self.compute_usd, 2),
                "storage": round(self.storage_usd, 2),
                "egress": round(self.egress_usd, 2),
            },
            "price_per_hour_usd": round(self.price_per_hour, 4),
            "setup_h": round(self.setup_h, 3),
            "peak_reserved_gib": round(self.peak_reserved_gib, 2),
            "device_total_gib": round(self.device_total_gib, 2),
            "usable_gib": round(self.offer.gpu.usable_gib, 2),
            "tokens_per_s": round(self.speed.tokens_per_s, 1),
            "step_time_s": round(self.speed.step_time_s, 4),
            "mfu": round(self.speed.efficiency, 3),
            "checkpoint_interval_min": (
                round(self.checkpoint_interval_min, 1)
                if self.checkpoint_interval_min is not None
                else None
            ),
            "expected_interruptions": round(self.interruptions, 2),
            "interrupted_every_h": round(self.mtbi_h, 2) if self.spot else None,
            "interruption_rate_from": self.mtbi_from or None,
            **(
                {
                    "time_value_usd": round(self.time_value_usd, 2),
                    "weighed_cost_usd": round(self.weighed_cost_usd, 2),
                }
                if self.value_of_time_usd_h
                else {}
            ),
            "reasons": self.reasons,
        }


@dataclass
class Rejected:
    label: str
    why: str
    kind: str  # fit | deadline | budget | dtype | batch
    cost_usd: float | None = None
    hours: float | None = None
    need_gib: float | None = None  # fit: per GPU at micro-batch need_batch, what the GPU offers
    have_gib: float | None = None
    need_batch: int = 1  # the least micro-batch the job can run (no accumulation: all of it)

    def to_json(self) -> dict[str, Any]:
        return {
            "option": self.label,
            "why": self.why,
            "kind": self.kind,
            "est_cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2),
            "est_hours": None if self.hours is None else round(self.hours, 3),
        }


class Infeasible(FrugalError):
    """No plan meets the constraints: the message names the closest miss; `plans` (over
    the deadline or budget) and `rejected` say what the search found."""

    def __init__(self, message: str, plans: list[Plan], rejected: list[Rejected]) -> None:
        super().__init__(message)
        self.plans, self.rejected = plans, rejected


@dataclass
class Result:
    recommendation: Plan
    frontier: list[Plan]
    plans: list[Plan]  # every feasible plan, best first
    rejected: list[Rejected]
    notes: list[str]


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
                priced = _price(offer, nodes, found, k)
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
        raise Infeasible(_closest_miss(plans, rejected, k), plans, rejected)
    key = (
        (lambda p: (p.weighed_cost_usd, p.hours))  # dollars alone when time is not valued
        if k.objective == "cost"
        else (lambda p: (p.hours, p.cost_usd))
    )
    feasible.sort(key=key)
    best = feasible[0]
    frontier = pareto(feasible)
    _explain(best, feasible, frontier, k)
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


def _price(offer: Offer, nodes: int, cfg: Config, k: Constraints) -> list[Plan]:
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


def pareto(plans: list[Plan]) -> list[Plan]:
    """Plans no other plan beats on both cost and time, cheapest first."""
    out: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.cost_usd, p.hours)):
        if not out or p.hours < out[-1].hours - 1e-9:
            out.append(p)
    return out


def node_network(offer: Offer, k: Constraints) -> tuple[float, str]:
    """GB/s between two nodes of `offer`, and whose figure it is: the user's --network-gbps,
    else the provider's terms (0: the provider rents no multi-node clusters frugal knows of,
    so its plans stay on one node)."""
    if k.network_gbps is not None:
        return k.network_gbps / 8, "--network-gbps"
    return offer.terms.node_network_gbps, f"{offer.provider}'s, providers.csv"


def _explain(best: Plan, feasible: list[Plan], frontier: list[Plan], k: Constraints) -> None:
    j = best.job
    r = best.reasons
    r.append(
        f"fits: {best.device_total_gib:.1f} of {best.offer.gpu.usable_gib:.1f} GiB per GPU "
        f"at micro-batch {j.batch} x {j.seq} tokens"
        + (" with gradient checkpointing" if j.grad_checkpointing else "")
        + (f", {j.sharding} over {j.gpus} GPUs" if j.gpus > 1 else "")
    )
    if best.nodes > 1:
        gb_s, whose = node_network(best.offer, k)
        share = best.speed.parts_s.get("comm_exposed", 0.0) / best.speed.step_time_s
        r.append(
            f"{best.nodes} nodes of {best.offer.gpus} GPUs, {gb_s * 8:,.0f} Gbit/s between "
            f"nodes ({whose}): the exchange not hidden behind compute is {share:.0%} of the "
            f"step; frugal train joins the nodes into one job (--emit skypilot, slurm or "
            "torchrun launches it)"
        )
    r.append(
        f"{best.speed.tokens_per_s:,.0f} tokens/s ({best.speed.bound}-bound, "
        f"{best.speed.efficiency:.0%} of peak): {best.hours:.1f} h including "
        f"{best.setup_h * 60:.0f} min setup"
    )

    def turned_on(technique: str) -> str:
        why = best.why_on.get(technique)
        return f"; the plan turned it on: {why}" if why else ""

    if j.loss_chunks:
        r.append(
            f"loss in {j.loss_chunks} chunks of tokens (--loss-chunks): the logits are never "
            "whole, for one more LM-head matmul in backward" + turned_on("loss_chunks")
        )
    if j.offload_activations:
        cost = best.speed.parts_s.get("offload", 0.0) / best.speed.step_time_s
        r.append(
            f"layer inputs offloaded to host memory (--offload-activations): "
            f"{best.host_offload_gib:.1f} GiB pinned per GPU, {cost:.1%} of the step in copies"
            + turned_on("offload_activations")
        )
    if j.optimizer_in_backward:
        r.append(
            "optimizer in backward (--optimizer-in-backward): each weight updated as its "
            "gradient completes, so the step never holds all the gradients (the trainable "
            "weights' size), at no cost in time; no clipping (max_grad_norm 0), no accumulation"
            + turned_on("optimizer_in_backward")
        )
    if best.why_on.get("optimizer"):
        r.append(
            f"AdamW's states in 8 bits (--optimizers {EIGHT_BIT}): a quarter of their bytes"
            + turned_on("optimizer")
        )
    if k.data != "local" or k.data_gb:
        r.append(f"data: {best.data_note}")
        why = data_reason(best, feasible)
        if why:
            r.append(why)
    if k.objective == "cost" and k.value_of_time_usd_h:
        r.extend(_time_valued(best, feasible, k.value_of_time_usd_h))
    elif k.objective == "cost":
        others = [p for p in feasible if p.label() != best.label()]
        if others:
            nxt = others[0]
            r.append(
                f"cheapest of {len(feasible)} feasible plans; next: {nxt.label()} at "
                f"${nxt.cost_usd:,.2f} ({_more(nxt.cost_usd, best.cost_usd)})"
            )
    else:
        r.append(f"fastest of {len(feasible)} feasible plans")
    if best.spot:
        same_od = [p for p in feasible if p.offer is best.offer and not p.spot]
        saving = (
            f"; saves ${same_od[0].cost_usd - best.cost_usd:,.2f} vs on-demand" if same_od else ""
        )
        r.append(
            f"spot: {best.interruptions:.2f} expected interruptions (one every "
            f"{best.mtbi_h:.1f} h: {best.mtbi_from}), checkpoint every "
            f"{best.checkpoint_interval_min:.0f} min (Young/Daly){saving}"
        )
        if best.fallback and best.fallback.spot_share < 1:
            r.append(
                f"deadline at risk on spot alone: switch to on-demand after "
                f"{best.fallback.switch_at_h:.1f} h "
                f"({best.fallback.spot_share:.0%} of the work on spot)"
            )
    if best.offer.gpu.bf16 is False and best.job.precision == "fp16-mixed":
        r.append(f"{best.offer.gpu.name} has no bf16: fp16-mixed with loss scaling")
    if best in frontier and len(frontier) > 1:
        fastest = min(frontier, key=lambda p: p.hours)
        r.append(
            f"fastest on the frontier: {fastest.label()} {fastest.hours:.1f} h for "
            f"${fastest.cost_usd:,.2f}"
        )


def data_reason(best: Plan, others: list[Plan]) -> str | None:
    """When the offer beside the data beats cheaper compute elsewhere: both sides' dollars."""
    dry = min(others, key=lambda p: (p.cost_usd - p.egress_usd, p.hours))
    if dry.offer == best.offer or dry.egress_usd <= best.egress_usd:
        return None
    saved = best.cost_usd - best.egress_usd - (dry.cost_usd - dry.egress_usd)
    return (
        f"runs where its data is cheaper to reach: {dry.label()} would save ${saved:,.2f} in "
        f"compute but moving it would cost ${dry.egress_usd:,.2f} against "
        f"${best.egress_usd:,.2f} ({dry.data_in.reason or dry.data_out.reason})"
    )


def _more(a: float, b: float) -> str:
    """a against b as a percentage ("+12%"), or in dollars when b is free."""
    return f"{a / b - 1:+.0%}" if b > 0 else f"+${a - b:,.2f}"


def _time_valued(best: Plan, feasible: list[Plan], usd_h: float) -> list[str]:
    """Why the plan wins once each hour of waiting costs `usd_h`: its weighed cost, the
    next best, and (when it is not the cheapest in dollars) what the cheapest would have
    cost in time."""
    rate = f"${usd_h:,.2f}".removesuffix(".00")
    out = [
        f"lowest weighed cost of {len(feasible)} feasible plans with time at {rate}/h: "
        f"${best.cost_usd:,.2f} + {best.hours:.2f} h x {rate} = ${best.weighed_cost_usd:,.2f}"
    ]
    others = [p for p in feasible if p.label() != best.label()]
    if others:
        nxt = others[0]
        out[0] += (
            f"; next: {nxt.label()} at ${nxt.weighed_cost_usd:,.2f} "
            f"({_more(nxt.weighed_cost_usd, best.weighed_cost_usd)})"
        )
    cheap = min(feasible, key=lambda p: (p.cost_usd, p.hours))
    if cheap.cost_usd < best.cost_usd - 0.005:  # then it takes longer: it weighs more
        saved_h = cheap.hours - best.hours
        out.append(
            f"time value changed the choice: the cheapest in dollars, {cheap.label()}, costs "
            f"${cheap.cost_usd:,.2f} but takes {cheap.hours:.1f} h "
            f"(${cheap.weighed_cost_usd:,.2f} weighed); this plan spends "
            f"${best.cost_usd - cheap.cost_usd:,.2f} more to finish {saved_h:.1f} h sooner, "
            f"worth ${saved_h * usd_h:,.2f} at {rate}/h"
        )
    return out


def _closest_miss(plans: list[Plan], rejected: list[Rejected], k: Constraints) -> str:
    """What came nearest to a plan, and by how much (frugal.plan.relax says what to change)."""
    if not plans:
        fits = [r for r in rejected if r.kind == "fit" and r.need_gib and r.have_gib]
        never = next((r for r in rejected if r.kind == "spot"), None)
        if never is not None:
            return f"nothing finishes: {never.label} fits but {never.why}"
        if not fits:
            reasons = sorted({r.why for r in rejected}) or ["no offers"]
            return f"nothing can run: {reasons[0]}"
        near = min(fits, key=lambda r: (r.need_gib or 0) - (r.have_gib or 0))
        return (
            f"nothing fits: the closest, {near.label}, needs {near.need_gib:.1f} GiB per GPU "
            f"at micro-batch {near.need_batch} and has {near.have_gib:.1f} usable with the margin"
        )
    fastest = min(plans, key=lambda p: p.hours)
    if k.deadline_h is not None and fastest.hours > k.deadline_h:
        return (
            f"no plan meets the {k.deadline_h:.3g} h deadline: the fastest ({fastest.label()}) "
            f"takes {fastest.hours:.1f} h"
        )
    in_time = [p for p in plans if k.deadline_h is None or p.hours <= k.deadline_h]
    c = min(in_time or plans, key=lambda p: p.cost_usd)
    return (
        f"no plan fits the ${k.budget_usd or 0:,.2f} budget: the cheapest"
        f"{' in time' if k.deadline_h else ''} ({c.label()}) costs ${c.cost_usd:,.2f}"
    )
