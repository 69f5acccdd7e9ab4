"""`estimate()`: per-GPU peak memory and FLOPs of one training step, and what fits a GPU."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frugal.estimate import cache
from frugal.estimate.categories import CATEGORIES, DEVICE, HOST, SEGMENTS
from frugal.estimate.notes import checks, profile_notes
from frugal.estimate.overheads import MIB, Overheads, load_overheads
from frugal.estimate.profile import LayerFit, Profile, at_rank, grid
from frugal.estimate.throughput import step_time
from frugal.hardware.gpus import GIB, GPU, memory_budget
from frugal.models.specs import ModelSpec
from frugal.step.job import TrainJob
from frugal.step.tasks import task_of

# what the allocator's reserve grows with: the logits and the loss's tensors, the largest
# blocks a step frees and makes again at other sizes (fitted on an H200, docs/accuracy.md)
RESERVE_GROWS_WITH = ("logits_and_loss",)
MAX_BATCH = 1 << 16


@dataclass
class Memory:
    """Per-GPU memory of one step at its peak, in bytes."""

    breakdown: dict[str, float]
    peak_allocated: float
    peak_reserved: float
    device_total: float
    peak_at: str
    paged: float = 0.0  # optimizer state in CUDA unified memory (paged optimizers)
    host: float = 0.0  # offloaded activations in pinned host memory, at their peak


@dataclass
class Estimate:
    model: str
    job: TrainJob
    memory: Memory
    total_params: int
    trainable_params: int
    flops_per_step: dict[str, float]
    tokens_per_step: int
    lora_targets: list[str]
    attention: str  # the kernel the step runs (eager where transformers has no SDPA path)
    active_params: int  # parameters a token meets (a MoE model's routed experts: k of E)
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    budget_gib: float | None = None  # usable memory less the margin: what the step may use
    fits: bool | None = None
    headroom_gib: float | None = None
    max_batch: int | None = None
    max_seq: int | None = None
    step_time_s: float | None = None  # on the named GPU (estimate/throughput.py)
    tokens_per_s: float | None = None
    tokens_per_s_range: tuple[float, float] | None = None  # slowest and fastest expected
    bound: str | None = None  # what holds the step: compute, memory, communication, launch
    host_share: float | None = None  # the host's dispatch over the step's time
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        m = self.memory
        out: dict[str, Any] = {
            "model": self.model,
            "job": self.job.model_dump(),
            "peak_allocated_gib": round(m.peak_allocated / GIB, 3),
            "peak_reserved_gib": round(m.peak_reserved / GIB, 3),
            "device_total_gib": round(m.device_total / GIB, 3),
            "breakdown_gib": {k: round(v / GIB, 3) for k, v in m.breakdown.items()},
            "peak_at": m.peak_at,
            "paged_optimizer_gib": round(m.paged / GIB, 3),
            "host_offload_gib": round(m.host / GIB, 3),
            "total_params": self.total_params,
            "active_params": self.active_params,
            "trainable_params": self.trainable_params,
            "flops_per_step": {k: float(f"{v:.6g}") for k, v in self.flops_per_step.items()},
            "tokens_per_step": self.tokens_per_step,
            "lora_targets": self.lora_targets,
            "attention": self.attention,
            "warnings": self.warnings,
            "notes": self.notes,
        }
        if self.gpu_memory_gib is not None:
            out.update(
                gpu=self.gpu,
                gpu_memory_gib=round(self.gpu_memory_gib, 2),
                budget_gib=round(self.budget_gib or 0.0, 2),
                fits=self.fits,
                headroom_gib=round(self.headroom_gib or 0.0, 3),
                max_batch=self.max_batch,
                max_seq=self.max_seq,
            )
        if self.step_time_s is not None:
            out.update(
                step_time_s=round(self.step_time_s, 4),
                tokens_per_s=round(self.tokens_per_s or 0.0, 1),
                tokens_per_s_range=[round(v, 1) for v in self.tokens_per_s_range or (0, 0)],
                bound=self.bound,
                host_share=round(self.host_share or 0.0, 3),
            )
        return out


# -- profiles ------------------------------------------------------------------------


def base_length(spec: ModelSpec, seq: int, loss_chunks: int = 0) -> int:
    """The shortest of the three simulated lengths (s0, 2·s0, 3·s0) for a step of `seq`
    tokens: 64, or for a sliding-window model one that stays on the same side of the window
    as `seq` (within it, masks and scores grow as s²; beyond it, the band keeps them).

    With the loss in `loss_chunks` chunks, s0 is a multiple of the chunk count: each chunk
    then holds s0 / chunks, 2·s0 / chunks, 3·s0 / chunks tokens, linear in the length as at
    the real one. Shorter, a chunk holds one token or none at every simulated length (128
    chunks of 64 tokens), and the fit extrapolated 7.9 GiB of gradients for 4.9M weights."""
    w = spec.sliding_window
    s0 = 64 if not w else w + 64 if seq > w else max(4, min(64, w // 3))
    return -(-s0 // loss_chunks) * loss_chunks if loss_chunks else s0


def get_profile(spec: ModelSpec, job: TrainJob, seq: int, why: str = "") -> Profile:
    """The memory and FLOPs profile of `job`, from the cache or simulated (`why`: what
    asks for it, said by `--verbose` if it is simulated).

    A job that accumulates gradients simulates two micro-steps, which also yields the
    profile without accumulation; both are cached.
    """
    s0 = base_length(spec, seq, job.loss_chunks)

    def key(accum: int) -> str:
        return profile_key(spec, job.model_copy(update={"grad_accum": accum}), seq)

    prof = cache.load(key(job.grad_accum))
    if prof is not None:
        return prof
    with cache.making(key(job.grad_accum)):
        return (
            cache.load(key(job.grad_accum))
            or _from_other_ranks(spec, job, s0, key(job.grad_accum))
            or _simulate_profile(spec, job, seq, s0, key, why or f"the {job.method} step")
        )


def profile_key(spec: ModelSpec, job: TrainJob, seq: int) -> str:
    """The key of `job`'s profile for a step of `seq` tokens (the fitting regime: its
    simulated lengths)."""
    s0 = base_length(spec, seq, job.loss_chunks)
    return cache.profile_key(spec.config, job.profile_key(), str(s0))


def keys_of(spec: ModelSpec, job: TrainJob, seq: int) -> list[str]:
    """The keys `get_profile` saves `job`'s profiles under: with one micro-step, and for a
    job that accumulates, with two."""
    accums = (1, 2) if job.grad_accum > 1 else (1,)
    return [profile_key(spec, job.model_copy(update={"grad_accum": a}), seq) for a in accums]


@dataclass(frozen=True)
class Simulated:
    """One profile this process had to simulate: neither cached, shipped, nor made from
    other ranks (`--verbose` lists them; `make profiles` ships them)."""

    model: str
    job: TrainJob  # the job as simulated (its accumulation: one micro-step or two)
    seq: int  # the step's length, which picks the simulated lengths
    base_length: int
    depths: tuple[int, int]
    ops: int  # ops the tracker recorded over every run
    seconds: float
    keys: tuple[str, ...]  # the profiles saved: with one micro-step, and with two
    why: str  # what asked for it

    def line(self) -> str:
        j = self.job
        parts: list[str] = [j.method, j.precision, j.optimizer]
        if j.method != "full":
            parts.append(f"r={j.lora_r}")
        parts.append("checkpointing" if j.grad_checkpointing else "no checkpointing")
        if j.loss_chunks:
            parts.append(f"loss in {j.loss_chunks} chunks")
        if j.offload_activations:
            parts.append("offloaded activations")
        if j.optimizer_in_backward:
            parts.append("optimizer in backward")
        parts.append("accumulating" if j.grad_accum > 1 else "one micro-step")
        lengths = ", ".join(str(s) for _, s in grid(self.base_length))
        return (
            f"simulated {self.model} {' · '.join(parts)}: depths {self.depths[0]} and "
            f"{self.depths[1]} at lengths {lengths}, {self.ops:,} ops in {self.seconds:.1f} s "
            f"({self.seconds / max(self.ops, 1) * 1e3:.2f} ms an op): {self.why}; none "
            "cached or shipped"
        )


SIMULATED: list[Simulated] = []
"""Every profile this process simulated, in order."""


LORA_RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
"""Ranks whose cached profiles another rank of the same job is interpolated from."""


def _from_other_ranks(spec: ModelSpec, job: TrainJob, s0: int, key: str) -> Profile | None:
    """A LoRA or QLoRA profile from two cached ranks of the same job (`profile.at_rank`,
    exact), cached under `key`; None where fewer than two are cached."""
    if job.method == "full":  # no adapters, no rank
        return None
    found: list[tuple[int, Profile]] = []
    for r in sorted(LORA_RANKS, key=lambda r: abs(r - job.lora_r)):
        if r == job.lora_r:
            continue
        other = job.model_copy(update={"lora_r": r}).profile_key()
        prof = cache.load(cache.profile_key(spec.config, other, str(s0)))
        if prof is not None:
            found.append((r, prof))
        if len(found) == 2:
            (ra, a), (rb, b) = found
            made = at_rank(a, ra, b, rb, job.lora_r)
            if made is not None:
                cache.save(key, made)
            return made
    return None


def _simulate_profile(
    spec: ModelSpec, job: TrainJob, seq: int, s0: int, key: Callable[[int], str], why: str
) -> Profile:
    """Simulate `job` at two depths and three lengths from `s0`; fit and cache its profile
    (and, for an accumulating job, the one without accumulation)."""
    from frugal.estimate.simulate import shallow_depths, simulate

    depths = shallow_depths(spec.config, job.offload_activations)
    least = task_of(job.task).min_depth(job, spec.num_layers)  # a teacher's layers: one or more
    if depths[0] < least:
        depths = (least, least + 1) if least < spec.num_layers else (least - 1, least)
    shapes = grid(s0)
    start = time.perf_counter()
    runs = [(n, simulate(spec.config, job, n, shapes)) for n in depths]
    ops = sum(len(t.op_ids) - 1 for _, traces in runs for t in traces)
    seconds = time.perf_counter() - start
    first = runs[0][1][0]
    made = {}
    for micro in range(1, min(job.grad_accum, 2) + 1):
        lo, hi = (LayerFit.from_traces(n, shapes, t, micro) for n, t in runs)
        made[micro] = Profile(spec.num_layers, (lo, hi), first.lora_targets, first.attention)
        cache.save(key(micro), made[micro])
    keys = tuple(key(micro) for micro in made)
    SIMULATED.append(Simulated(spec.id, job, seq, s0, depths, ops, seconds, keys, why))
    return made[min(job.grad_accum, 2)]


# -- memory --------------------------------------------------------------------------


def _shard(seg: np.ndarray, job: TrainJob, prof: Profile) -> np.ndarray:
    """Per-GPU bytes of each segment's peak under data parallelism or sharding.

    DDP keeps a full replica and a flat bucket copy of all gradients (PyTorch DDP with
    gradient_as_bucket_view=False, the default). ZeRO-2 splits gradients and optimizer
    state; FSDP full-shard and ZeRO-3 also split weights, and hold the unsharded weights
    of two layers at a time (the running one and the prefetched one) plus the unsharded
    gradients of one layer before reduce-scatter. Under full fine-tuning the weight casts
    (temporaries) shard with the weights.
    """
    n = job.gpus
    if n == 1:
        return seg
    c = {name: i for i, name in enumerate(CATEGORIES)}
    out = seg.copy()
    if job.sharding == "ddp":
        out[:, c["gradients"]] += seg[0, c["trainable_weights"]]
        return out
    out[:, c["gradients"]] /= n
    out[:, c["optimizer_state"]] /= n
    if job.sharding in ("fsdp", "zero3"):
        layer_w = prof.per_layer_bytes("frozen_weights") + prof.per_layer_bytes("trainable_weights")
        layer_g = prof.per_layer_bytes("trainable_weights")  # grads share the dtype
        out[:, c["frozen_weights"]] = out[:, c["frozen_weights"]] / n + 2 * layer_w * (1 - 1 / n)
        out[:, c["trainable_weights"]] /= n
        out[:, c["gradients"]] += layer_g
        if job.method == "full":
            # full fine-tuning's temporaries are casts of the (fp32) weights: autocast's
            # cache of bf16 copies and the optimizer's; FSDP casts its shard only
            out[:, c["temporaries"]] /= n
    return out


def memory_at(
    prof: Profile, job: TrainJob, batch: int, seq: int, ov: Overheads | None = None
) -> Memory:
    ov = ov or load_overheads(job.method)
    seg = _shard(prof.segment_peaks(batch, seq), job, prof)
    opt_i = CATEGORIES.index("optimizer_state")
    paged = 0.0
    if job.optimizer == "paged-adamw-8bit":
        paged = float(seg[0, opt_i])  # lives in unified memory, outside the allocator
        seg[:, opt_i] = 0.0
    host = float(seg[:, HOST].max())
    totals = seg[:, DEVICE].sum(axis=1)
    k = int(np.argmax(totals))
    cats = {CATEGORIES[i]: float(seg[k, i]) for i in DEVICE}
    sim_peak = float(totals[k])
    workspace = ov.cublas_workspace_mib * MIB + ov.kernel_slack * sim_peak
    allocated = sim_peak + workspace
    transient = sum(cats[t] for t in RESERVE_GROWS_WITH)
    reserve = ov.reserve_transient_frac * transient + ov.reserve_fixed_mib * MIB
    reserved = allocated + reserve
    context = ov.cuda_context_gib * GIB
    breakdown = {
        **cats,
        "cuda_context_and_workspace": workspace + context,
        "allocator_reserve": reserve,
    }
    total = reserved + context + paged
    return Memory(breakdown, allocated, reserved, total, SEGMENTS[k], paged, host)


# -- the public entry point ----------------------------------------------------------


def estimate(
    spec: ModelSpec,
    job: TrainJob,
    gpu: GPU | None = None,
    gpu_memory_gib: float | None = None,
) -> Estimate:
    """Per-GPU peak memory, FLOPs and (with a GPU) fit of one training step of `job`."""
    warnings, notes = checks(spec, job, gpu)
    ov = load_overheads(job.method)
    prof = get_profile(spec, job, job.seq, "the estimate")
    notes += profile_notes(spec, job, prof)
    mem = memory_at(prof, job, job.batch, job.seq, ov)
    micro = prof.flops(job.batch, job.seq)
    scale = job.grad_accum * job.gpus
    flops = {k: v * scale for k, v in micro.items()}
    flops["total"] = sum(flops.values())
    est = Estimate(
        model=spec.id,
        job=job,
        memory=mem,
        total_params=prof.total_params,
        trainable_params=prof.trainable_params,
        flops_per_step=flops,
        tokens_per_step=job.tokens_per_step,
        lora_targets=prof.lora_targets,
        attention=prof.attention,
        active_params=prof.active_params,
        warnings=warnings,
        notes=notes,
    )
    usable = gpu_memory_gib if gpu_memory_gib is not None else (gpu.usable_gib if gpu else None)
    if usable is not None:
        cap = memory_budget(usable)
        est.gpu = gpu.name if gpu else f"{usable:g} GiB"
        est.gpu_memory_gib = usable
        est.budget_gib = cap / GIB
        est.fits = mem.device_total <= cap
        est.headroom_gib = (cap - mem.device_total) / GIB
        est.max_batch = max_batch(spec, job, cap, ov)
        est.max_seq = max_seq(spec, job, cap, ov)
    if gpu is not None:
        speed = step_time(prof, job, gpu)
        if speed is None:
            est.warnings.append(f"{gpu.name} has no {job.compute_dtype} support: no step time")
        else:
            est.step_time_s, est.tokens_per_s = speed.step_time_s, speed.tokens_per_s
            est.tokens_per_s_range, est.bound = speed.tokens_per_s_range, speed.bound
            est.host_share = speed.host_share
    return est


def _largest(ok: Any, lo: int, hi: int) -> int:
    """Largest n in [lo, hi] with ok(n), for monotone ok; lo - 1 if none."""
    if not ok(lo):
        return lo - 1
    n = lo
    while n * 2 <= hi and ok(n * 2):
        n *= 2
    a, b = n, min(n * 2, hi + 1)  # ok(a), not ok(b) (or b beyond hi)
    while b - a > 1:
        mid = (a + b) // 2
        a, b = (mid, b) if ok(mid) else (a, mid)
    return a


# -- what fits a GPU: one micro-batch rule (the margin is hardware.gpus.MARGIN) -------


@dataclass
class Fit:
    """A micro-batch that fits, with its job (batch and accumulation set) and memory."""

    job: TrainJob
    memory: Memory
    profile: Profile


def largest_micro_batch(
    job: TrainJob,
    budget: float,
    profile_of: Any,
    share: int | None = None,
    ov: Overheads | None = None,
) -> tuple[Fit | None, Memory]:
    """The one micro-batch rule: the largest micro-batch whose step's `device_total` fits
    `budget` bytes.

    With `share` (the sequences each GPU takes per optimizer step), the micro-batch divides
    it and accumulation makes up the rest, so the effective batch stays exactly what was
    asked (what `frugal train` needs); every divisor is tried, since the last one, without
    accumulation, needs no gradients kept through the next forward. Without a share, any
    micro-batch up to MAX_BATCH at the job's accumulation; the optimizer in backward, which
    cannot accumulate, only the whole share. `profile_of(job)` gives the profile of a trial
    job. Returns the fit, or None, and the memory at the smallest micro-batch tried."""
    ov = ov or load_overheads(job.method)

    def at(b: int) -> Fit:
        update: dict[str, int] = {"batch": b}
        if share is not None:
            update["grad_accum"] = share // b
        trial = job.model_copy(update=update)
        prof = profile_of(trial)
        return Fit(trial, memory_at(prof, trial, b, job.seq, ov), prof)

    first = at(share if share is not None and job.optimizer_in_backward else 1)
    if first.memory.device_total > budget:
        return None, first.memory
    if share is None:
        b = _largest(lambda n: at(n).memory.device_total <= budget, 1, MAX_BATCH)
        return at(b), first.memory
    best = first
    for b in range(first.job.batch + 1, share + 1):
        if share % b == 0:
            f = at(b)
            if f.memory.device_total <= budget:
                best = f
    return best, first.memory


def max_batch(spec: ModelSpec, job: TrainJob, cap: float, ov: Overheads) -> int:
    fit, _ = largest_micro_batch(
        job, cap, lambda j: get_profile(spec, j, j.seq, "the largest micro-batch"), ov=ov
    )
    return fit.job.batch if fit else 0


def max_seq(spec: ModelSpec, job: TrainJob, cap: float, ov: Overheads) -> int:
    """Longest sequence that fits at the job's micro-batch, up to the model's positions."""
    limit = spec.max_positions or 1 << 20
    profiles: dict[int, Profile] = {}

    def ok(s: int) -> bool:
        key = base_length(spec, s, job.loss_chunks)
        if key not in profiles:
            profiles[key] = get_profile(spec, job, s, "the longest sequence that fits")
        return memory_at(profiles[key], job, job.batch, s, ov).device_total <= cap

    return _largest(ok, 1, limit)
