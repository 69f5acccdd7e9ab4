"""The fit: for one GPU set-up (a GPU, how many, on how many machines, by which method), the
fastest configuration that fits, or why none does.

Every checkpointing x optimizer x sharding x micro-batch is judged by the estimator (a
memory profile per job, simulated once and cached on disk; everything else arithmetic on
it) and timed by the throughput model. A set-up that does not fit is tried again with the
step's memory techniques, one more at a time, the cheapest in time first: the loss in
chunks (--loss-chunks: the logits never whole, for one more LM-head matmul in backward),
the optimizer in backward (full fine-tuning on one GPU), the checkpointed layers' inputs
offloaded to host memory (--offload-activations: two host-link copies), and last, for
LoRA, AdamW's states in 8 bits where --optimizers lists it after another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from frugal.estimate.core import Memory, get_profile, largest_micro_batch
from frugal.estimate.overheads import Overheads, load_overheads
from frugal.estimate.profile import Profile
from frugal.estimate.throughput import Speed, SpeedConstants, load_speed_constants, step_time
from frugal.hardware.gpus import GIB, GPU, memory_budget
from frugal.models.specs import ModelSpec
from frugal.plan.constraints import Constraints, node_network
from frugal.plan.plans import Plan, Rejected
from frugal.step.job import TrainJob, in_backward_refusal
from frugal.step.tasks import task_of

AUTO_LOSS_CHUNKS = 16  # the chunks of the loss a plan turns on
LOGITS_SHARE = 0.2  # logits this share of the peak: the chunked loss may raise the micro-batch
EIGHT_BIT = "adamw-8bit"
# job fields, in the order the plan tries them
TECHNIQUES = ("loss_chunks", "optimizer_in_backward", "offload_activations", "optimizer")


@dataclass(frozen=True)
class SetUp:
    """One way to run the job: `n` GPUs, `per_node` to a machine, on `nodes` machines."""

    gpu: GPU
    n: int
    per_node: int
    nodes: int
    method: str
    node_gbps: float  # GB/s between two machines

    @property
    def why(self) -> str:
        return f"first asked for {self.n}x {self.gpu.name}"


@dataclass
class Config:
    """The fastest fitting configuration of one GPU set-up."""

    job: TrainJob
    memory: Memory
    speed: Speed
    profile: Profile
    why_on: dict[str, str] = field(default_factory=dict)  # technique -> why the plan chose it

    def turned_on(self, technique: str, why: str) -> Config:
        """This configuration, saying why the plan turned `technique` on."""
        why_on = {**self.why_on, technique: why}
        return Config(self.job, self.memory, self.speed, self.profile, why_on)


@dataclass
class _Tried:
    """What trying every configuration of a set-up found."""

    best: Config | None = None
    smallest_need: float = math.inf  # bytes a GPU needs at the least micro-batch
    floor: float = math.inf  # the least any memory technique could bring the step down to


class Fitter:
    """The fastest fitting configuration of each set-up of one search, each found once: the
    model's memory profiles, the calibration's constants and the answers are shared."""

    def __init__(
        self, spec: ModelSpec, k: Constraints, speed_constants: SpeedConstants | None = None
    ) -> None:
        self.spec, self.k, self.speed_constants = spec, k, speed_constants
        self.profiles: dict[tuple[Any, ...], Profile] = {}
        self.memo: dict[tuple[Any, ...], Config | Rejected] = {}
        self.constants: dict[tuple[str, str], tuple[SpeedConstants, Overheads]] = {}
        self.why = ""  # the set-up being judged, for --verbose

    def profile(self, job: TrainJob) -> Profile:
        """One memory profile per (method, precision, optimizer, checkpointing, accumulating
        or not): the expensive part, simulated once and cached on disk."""
        if job.precision == "fp16-mixed":  # same bytes and FLOPs as bf16: share its profile
            job = job.model_copy(update={"precision": "bf16-mixed"})
        key = tuple(sorted(job.profile_key().items()))
        if key not in self.profiles:
            self.profiles[key] = get_profile(self.spec, job, job.seq, self.why)
        return self.profiles[key]

    def calibrated(self, gpu: GPU, method: str) -> tuple[SpeedConstants, Overheads]:
        """The calibration's constants for this GPU and method (its groups), read once."""
        if (gpu.name, method) not in self.constants:
            self.constants[gpu.name, method] = (
                self.speed_constants or load_speed_constants(gpu.name, method),
                load_overheads(method),
            )
        return self.constants[gpu.name, method]

    def best(self, s: SetUp, base: TrainJob, because: str = "") -> Config | Rejected:
        """The fastest fitting (checkpointing, optimizer, sharding, micro-batch) for set-up
        `s`, or why none fits. Where nothing fits, the next memory technique is tried too;
        where the logits hold the micro-batch below the GPU's share, the chunked loss, kept
        if it fits a larger micro-batch that is faster."""
        key = (
            s.gpu.name,
            s.n,
            s.per_node,
            s.method,
            s.node_gbps if s.nodes > 1 else 0.0,
            base.loss_chunks,
            base.offload_activations,
            base.optimizer,
            base.optimizer_in_backward,
        )
        if key not in self.memo:
            self.memo[key] = self._best(s, base, because)
        return self.memo[key]

    def _best(self, s: SetUp, base: TrainJob, because: str) -> Config | Rejected:
        precision = _precision_for(s.gpu, base.precision)
        refusal = in_backward_refusal(s.n, 1, precision)  # the job's own rule
        if base.optimizer_in_backward and refusal:
            return Rejected("", refusal, "fit")
        if (
            s.gpu.peak_tflops(base.model_copy(update={"precision": precision}).compute_dtype)
            is None
        ):
            return Rejected("", f"{s.gpu.name} cannot run {base.precision}", "dtype")
        cap = memory_budget(s.gpu.usable_gib, self.k.margin)
        share = self.k.effective_batch // s.n  # search() only tries GPU counts that divide it
        self.why = s.why + (f" ({because})" if because else "")
        tried = self._try_all(s, base, precision, cap, share)
        more = _next_technique(self.spec, base, self.k, s.method)
        if more is not None and more.optimizer_in_backward and refusal:
            more = _next_technique(self.spec, more, self.k, s.method)  # one it cannot run
        found = self._with_technique(s, base, more, tried, cap, share)
        if found is not None:
            return found
        if tried.best is not None:
            return tried.best
        need, have = tried.smallest_need / GIB, cap / GIB
        least = share if base.optimizer_in_backward else 1
        why = (
            f"does not fit{_even_with(base)}: needs {need:.1f} GiB per GPU at micro-batch "
            f"{least}, {s.gpu.name} has {have:.1f} usable with the margin"
        )
        return Rejected("", why, "fit", need_gib=need, have_gib=have, need_batch=least)

    def _try_all(self, s: SetUp, base: TrainJob, precision: str, cap: float, share: int) -> _Tried:
        """Every checkpointing, optimizer and sharding of the set-up at its largest fitting
        micro-batch: the fastest, or how far from fitting the closest came."""
        out = _Tried()
        sc, ov = self.calibrated(s.gpu, s.method)
        unfit: set[tuple[str, str]] = set()  # (optimizer, sharding) that did not fit checkpointed
        for ckpt in (True,) if base.offload_activations else (True, False):
            for opt in self._optimizers(base, s.method):
                for sharding in _shardings(s, base, precision):
                    if not ckpt and (opt, sharding) in unfit:
                        continue  # without checkpointing a step never needs less: not simulated
                    job = _job(base, s, precision, opt, sharding, ckpt)
                    fit, at_one = largest_micro_batch(job, cap, self.profile, share, ov)
                    if fit is None:  # at_one: at the least micro-batch the job can run
                        unfit.add((opt, sharding))
                        out.smallest_need = min(out.smallest_need, at_one.device_total)
                        out.floor = min(out.floor, _floor(at_one))
                        continue
                    speed = step_time(
                        fit.profile,
                        fit.job,
                        s.gpu,
                        s.per_node,
                        0.0 if s.nodes == 1 else s.node_gbps,
                        sc,
                    )
                    if speed is not None and (
                        out.best is None or speed.tokens_per_s > out.best.speed.tokens_per_s
                    ):
                        out.best = Config(fit.job, fit.memory, speed, fit.profile)
        return out

    def launch_note(self, plan: Plan) -> str | None:
        """Why the plan's micro-batch where the host's dispatch sets the pace: its step is
        launch-bound (the host outlasts the GPU's work), or would be at micro-batch 1, which
        the larger micro-batch it takes avoids. None where the host never bounds it."""
        sp, j, prof = plan.speed, plan.job, plan.profile
        if sp.bound == "launch":
            step = j.batch * j.grad_accum * j.gpus
            what = (
                "the largest that fits"
                if j.grad_accum > 1
                else f"the GPU's whole share of the {step}-sequence step: fewer GPUs or a "
                "larger --effective-batch give each GPU more at a time"
            )
            return (
                f"launch-bound: the host's dispatch holds {sp.host_share:.0%} of the step at "
                f"micro-batch {j.batch} ({what}); the GPU waits for the host CPU, so a faster "
                "host buys more than a faster GPU"
            )
        if j.batch == 1 or prof is None:
            return None
        gpu = plan.offer.gpu
        one = j.model_copy(update={"batch": 1, "grad_accum": j.batch * j.grad_accum})
        node_gbps = node_network(plan.offer, self.k)[0] if plan.nodes > 1 else 0.0
        at_one = step_time(
            prof, one, gpu, plan.offer.gpus, node_gbps, self.calibrated(gpu, j.method)[0]
        )
        if at_one is None or at_one.bound != "launch":
            return None
        return (
            f"launch-bound at micro-batch 1: the host's dispatch would hold "
            f"{at_one.host_share:.0%} of the step; micro-batch {j.batch} fits and is "
            f"{sp.tokens_per_s / at_one.tokens_per_s:.1f}x faster per token"
        )

    def _optimizers(self, base: TrainJob, method: str) -> tuple[str, ...]:
        """Full fine-tuning tries every optimizer; LoRA the first, or the 8-bit one as a
        technique."""
        k = self.k
        lean = base.optimizer == EIGHT_BIT and EIGHT_BIT in k.optimizers[1:]
        if method == "full":
            return tuple(k.optimizers)
        return (base.optimizer,) if lean else tuple(k.optimizers[:1])

    def _with_technique(
        self,
        s: SetUp,
        base: TrainJob,
        more: TrainJob | None,
        tried: _Tried,
        cap: float,
        share: int,
    ) -> Config | Rejected | None:
        """The set-up with the next technique `more` on, where it is worth it: nothing fit
        without it (unless the weights alone do not fit: no technique helps), or the logits
        hold the micro-batch down and the chunked loss buys a larger, faster one. None:
        what was tried stands."""
        best = tried.best
        logits_bound = (
            best is not None
            and best.job.batch < share
            and more is not None
            and more.loss_chunks != base.loss_chunks
            and best.memory.breakdown["logits_and_loss"]
            >= LOGITS_SHARE * best.memory.peak_allocated
        )
        hopeless = best is None and tried.floor > cap
        if more is None or hopeless or not (best is None or logits_bound):
            return None
        added = next(t for t in TECHNIQUES if getattr(more, t) != getattr(base, t))
        flag = f"--{added.replace('_', '-')}"
        found = self.best(
            s,
            more,
            f"{flag}: nothing fit without it"
            if best is None
            else f"{flag}: the logits held the micro-batch to {best.job.batch}",
        )
        if best is not None and (
            isinstance(found, Rejected)
            or found.job.batch <= best.job.batch
            or found.speed.tokens_per_s <= best.speed.tokens_per_s
        ):
            return None  # the memory it frees buys no larger, faster micro-batch
        if isinstance(found, Rejected):
            return found
        why = (
            "without it this set-up does not fit"
            if best is None
            else f"without it micro-batch {best.job.batch}, {best.speed.tokens_per_s:,.0f} tokens/s"
        )
        return found.turned_on(added, why)


def _precision_for(gpu: GPU, wanted: str) -> str:
    """GPUs without bf16 run fp16 with loss scaling (the plan's reasons say so)."""
    return "fp16-mixed" if wanted.startswith("bf16") and not gpu.bf16 else wanted


def _shardings(s: SetUp, base: TrainJob, precision: str) -> tuple[str, ...]:
    """The shardings `frugal train` runs: FSDP needs bf16 or fp32, full or LoRA weights and a
    task that runs sharded."""
    fsdp_ok = (
        s.n > 1
        and task_of(base.task).shards
        and s.method != "qlora"
        and precision != "fp16-mixed"
        and not (base.loss_chunks or base.offload_activations)
    )
    return ("ddp", "fsdp") if fsdp_ok else ("ddp",)


def _job(
    base: TrainJob, s: SetUp, precision: str, optimizer: str, sharding: str, ckpt: bool
) -> TrainJob:
    """The step `base` asks for, as set-up `s` runs it."""
    lora = (
        {}
        if s.method == "full"
        else {
            "lora_r": base.lora_r,
            "lora_alpha": base.lora_alpha,
            "lora_targets": base.lora_targets,
            "lora_dropout": base.lora_dropout,
        }
    )
    return TrainJob.model_validate(
        {
            **base.task_settings(),
            "method": s.method,
            "precision": precision,
            "optimizer": optimizer,
            "seq": base.seq,
            "grad_checkpointing": ckpt,
            "attention": base.attention,
            "packing": base.packing,
            "loss": base.loss,
            "loss_chunks": base.loss_chunks,
            "offload_activations": base.offload_activations,
            "optimizer_in_backward": base.optimizer_in_backward,
            "gpus": s.n,
            "sharding": sharding,
            **lora,
        }
    )


def _floor(m: Memory) -> float:
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
