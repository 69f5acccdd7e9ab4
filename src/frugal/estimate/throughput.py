"""How long one optimizer step takes on a given GPU: the step's own ops, timed one by one.

The profile carries the op table of the step `frugal train` runs (`profile.py`, traced by
the simulation): each op's class, FLOPs and bytes, at any micro-batch and length, and the
ops the host dispatches. `optime.py` times them on the GPU's roofline, each class at its
fitted share of the tensor peak or the bandwidth, against the host that launches them:

    micro     = max(gpu_fwd, host_fwd) + max(gpu_bwd, host_bwd)
    optimizer = max(gpu_opt / shards, host_opt)   (a sharded update: each GPU its share)
    comm      = DDP: ring all-reduce of the gradients, 2 (n-1)/n x grad bytes / link;
                FSDP/ZeRO-3: all-gather of the weights in forward and backward plus a
                reduce-scatter of the gradients, every micro-step;
                ZeRO-2: reduce-scatter of the gradients, all-gather of the weights, per step
    exposed   = max(0, comm - overlap x GPU time of the micro-steps)   (NCCL beside kernels)
    step      = accum x micro + optimizer + exposed + step_fixed

link is NVLink or PCIe per direction within a machine (gpus.csv), and the provider's
network between machines. What bounds the step: the host where its dispatch outlasts the
GPU's work (launch-bound), the exchange where it is over 30% of the step, else the GPU's
products (compute) or its bandwidth-bound ops (memory).

A range goes with every figure: the step on the fastest and the slowest hosts seen (a
launch-bound step's pace is its host CPU's), widened by the spread of the
cross-validated errors of GPU-bound steps (`spread_lo`, `spread_hi`: measured over
predicted tokens/s). The constants are fitted by `benchmarks/speed_fit.py` on frugal's own
GPU rows and third-party ones (docs/accuracy.md) and calibrated from the user's runs
(`frugal calibrate`, the `speed` section), which narrows the range to their own machines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import ClassVar

from frugal import calibration
from frugal.estimate.categories import OP_CLASSES
from frugal.estimate.optime import OpSpeedConstants
from frugal.estimate.profile import Profile
from frugal.hardware.gpus import GPU
from frugal.step.job import TrainJob

BANDWIDTH = [i for i, c in enumerate(OP_CLASSES) if c not in ("matmul", "attention", "offload")]
COMPUTE = [OP_CLASSES.index("matmul"), OP_CLASSES.index("attention")]


@dataclass(frozen=True)
class SpeedConstants(OpSpeedConstants):
    """The op model's constants (`OpSpeedConstants`), the communication's, and the spread
    of the errors that makes a figure a range."""

    link_eff_nvlink: float = 0.75  # NCCL bus bandwidth / link peak (no row moves it)
    link_eff_pcie: float = 0.12  # consumer cards without peer-to-peer: through host memory
    overlap: float = 0.14  # share of compute time that hides communication
    # measured / predicted tokens/s of GPU-bound steps, cross-validated: the 10th and 90th
    # percentiles (benchmarks/speed_fit.py --fit)
    spread_lo: float = 0.862
    spread_hi: float = 1.113

    def problems(self) -> list[str]:
        """What makes these constants unphysical, one line each (a calibration file's
        values are checked with this): shares of a peak within (0, 1] (attention's up to 2:
        torch counts the whole score matrix, a causal kernel computes half), times and
        counts positive, and each range around its point."""
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            top = 2.0 if f.name == "attention_eff" else 1.0
            if not math.isfinite(v) or v < 0:
                out.append(f"{f.name} {v} must be a number of at least 0")
            elif f.name.endswith("_eff") and not 0 < v <= top:
                out.append(f"{f.name} {v} is a share of a peak rate: above 0, at most {top:g}")
        for lo, hi, what in (
            ("host_fast", "host_slow", "hosts' dispatch cost"),
            ("spread_lo", "spread_hi", "model's spread"),
        ):
            a, b = getattr(self, lo), getattr(self, hi)
            if not 0 < a <= 1 <= b:
                out.append(
                    f"{lo} {a} and {hi} {b} bound the {what} around the point: "
                    f"0 < {lo} <= 1 <= {hi}"
                )
        return out

    # the roofline model's keys (frugal before the op model): a calibration file that
    # still sets them is read without them, and says so
    RETIRED: ClassVar[frozenset[str]] = frozenset(
        {
            "eff_max_datacenter",
            "eff_max_workstation",
            "eff_max_consumer",
            "t_half",
            "launch_s_per_layer",
            "dequant_eff",
            "elem_bytes",
            "host_link_eff",
        }
    )


def load_speed_constants(gpu: str | None = None, method: str | None = None) -> SpeedConstants:
    """The calibration file's constants (its groups for `gpu` and `method` when given)."""
    return calibration.load("speed", SpeedConstants, gpu, method)


@dataclass
class Speed:
    step_time_s: float
    tokens_per_s: float
    efficiency: float  # achieved model FLOPs / peak
    bound: str  # what limits the step: compute, memory, communication, launch (the host)
    parts_s: dict[str, float] = field(default_factory=dict)
    host_share: float = 0.0  # the host's dispatch over the step's time (launch-bound: > GPU's)
    tokens_per_s_range: tuple[float, float] = (0.0, 0.0)  # slowest and fastest expected

    @property
    def hours_factor(self) -> tuple[float, float]:
        """The range of the time a number of tokens takes, as factors on the point:
        (fastest, slowest)."""
        lo, hi = self.tokens_per_s_range
        return self.tokens_per_s / hi, self.tokens_per_s / lo


def step_time(
    prof: Profile,
    job: TrainJob,
    gpu: GPU,
    gpus_per_node: int | None = None,
    node_gbps: float = 0.0,
    c: SpeedConstants | None = None,
) -> Speed | None:
    """Seconds per optimizer step of `job` on `job.gpus` GPUs; None if the GPU lacks the dtype."""
    c = c or load_speed_constants(gpu.name, job.method)
    peak_tf = gpu.peak_tflops(job.compute_dtype)
    if not peak_tf:
        return None
    peak = peak_tf * 1e12
    ops = prof.step_ops(job.batch, job.seq)
    shards = job.gpus if job.sharding != "ddp" else 1
    comm = _comm_s(prof, job, gpu, gpus_per_node or job.gpus, node_gbps, c)
    accum = job.grad_accum

    g, h = ops.by_class(prof.n_layers, gpu, peak, c)  # the GPU's work, the typical host's
    g[2] /= shards
    (g0, g1, g2), (h0, h1, h2) = g.sum(axis=1).tolist(), h.tolist()  # floats, not numpy's
    exposed = max(0.0, comm - c.overlap * accum * (g0 + g1))

    def on(host: float) -> float:
        """The step's seconds on a host `host` times as slow as the typical one."""
        micro = max(g0, h0 * host) + max(g1, h1 * host)
        return accum * micro + max(g2, h2 * host) + exposed + c.step_fixed_s

    step = on(1.0)
    per_class = accum * (g[0] + g[1]) + g[2]
    gpu_s, host_s = float(per_class.sum()), accum * (h0 + h1) + h2
    tokens = job.tokens_per_step
    if exposed > 0.3 * step:
        bound = "communication"
    elif host_s > gpu_s:
        bound = "launch"
    elif per_class[BANDWIDTH].sum() > per_class[COMPUTE].sum():
        bound = "memory"
    else:
        bound = "compute"
    slow, fast = on(c.host_slow), on(c.host_fast)
    f_micro = sum(prof.flops(job.batch, job.seq).values())
    parts = {name: float(per_class[i]) for i, name in enumerate(OP_CLASSES) if per_class[i]}
    return Speed(
        step_time_s=step,
        tokens_per_s=tokens / step,
        efficiency=f_micro * accum / (peak * step),
        bound=bound,
        parts_s=parts | {"host": host_s, "comm_exposed": exposed, "fixed": c.step_fixed_s},
        host_share=host_s / step,
        tokens_per_s_range=(tokens / slow * c.spread_lo, tokens / fast * c.spread_hi),
    )


def _comm_s(
    prof: Profile, job: TrainJob, gpu: GPU, per_node: int, node_gbps: float, c: SpeedConstants
) -> float:
    grad_bytes = prof.start_bytes("trainable_weights")  # gradients: the trainable's dtype
    weights = prof.start_bytes("frozen_weights") + grad_bytes
    return comm_seconds(grad_bytes, weights, job, gpu, per_node, node_gbps, c)


def comm_seconds(
    grad_bytes: float,
    weights: float,
    job: TrainJob,
    gpu: GPU,
    per_node: int,
    node_gbps: float,
    c: SpeedConstants,
) -> float:
    """Seconds of one step's collective communication (before overlap with compute): the
    gradients' all-reduce (DDP), their reduce-scatter and the weights' all-gather (ZeRO-2),
    or every micro-step's weights gathered twice (FSDP, ZeRO-3); ring algorithms, over the
    slower of the GPUs' link and the nodes' network."""
    n = job.gpus
    if n <= 1:
        return 0.0
    intra = gpu.link_gbps * 1e9 * (c.link_eff_nvlink if gpu.link == "nvlink" else c.link_eff_pcie)
    link = intra if n <= per_node or node_gbps <= 0 else min(intra, node_gbps * 1e9)
    ring = (n - 1) / n
    if job.sharding == "ddp":
        return 2 * ring * grad_bytes / link
    if job.sharding == "zero2":
        return ring * (grad_bytes + weights) / link
    return job.grad_accum * ring * (2 * weights + grad_bytes) / link
