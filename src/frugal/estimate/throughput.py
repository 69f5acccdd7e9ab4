"""How long one optimizer step takes on a given GPU: a roofline with measured efficiencies.

Per GPU and micro-step (the estimator gives the FLOPs, the profile the bytes):

    compute   = FLOPs / (peak x eff),   eff = eff_max[tier] x t / (t + t_half)
                (t = tokens per micro-step: small micro-steps leave tensor cores idle)
    memory    = weight bytes read per pass x passes / bandwidth   (the floor at tiny batches)
    elementw  = tokens x layers x hidden x elem_bytes x passes / bandwidth
                (norms, activations, rotary, residual and LoRA adds: bandwidth-bound, which
                is why fast-FLOPs GPUs such as the H100 reach a lower share of their peak)
    dequant   = 4-bit weights x passes x (0.5 B read + 2 B write) / (bandwidth x dequant_eff)
    overhead  = layers x launch_s_per_layer          (Python and kernel launches, eager mode)
    offload   = 2 x offloaded bytes / (host link x host_link_eff)
                (--offload-activations: each checkpointed layer input to pinned host memory
                in forward and back in backward, on the compute stream, so not hidden)
    micro     = max(compute, memory) + elementw + dequant + overhead + offload

and per optimizer step (grad_accum micro-steps):

    optimizer = trainable params x bytes touched by the update / bandwidth
    comm      = DDP: ring all-reduce of the gradients, 2 (n-1)/n x grad bytes / link;
                FSDP/ZeRO-3: all-gather of the weights in forward and backward plus a
                reduce-scatter of the gradients, every micro-step;
                ZeRO-2: reduce-scatter of the gradients, all-gather of the weights, per step
    exposed   = max(0, comm - overlap x compute)     (NCCL runs beside the kernels)
    step      = accum x micro + optimizer + exposed comm + step_fixed

peak is the GPU's dense tensor rate for the compute dtype (gpus.csv); link is NVLink or
PCIe per direction within a machine (gpus.csv), and the provider's network between
machines. The efficiencies are fitted to the third-party measurements in
docs/plan.md (benchmarks/plan_throughput.py) and can be calibrated (`speed` section).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from frugal import calibration
from frugal.estimate.profile import Profile
from frugal.hardware.gpus import GPU
from frugal.step.job import TrainJob


@dataclass(frozen=True)
class SpeedConstants:
    """Fitted by `python benchmarks/plan_throughput.py --fit` on the 40 measured rows."""

    eff_max_datacenter: float = 0.63  # matmul share of peak at large micro-steps
    eff_max_workstation: float = 0.55  # no measured row: prior between the two
    eff_max_consumer: float = 0.71  # of the fp32-accumulate rate gpus.csv lists
    t_half: float = 37.5  # tokens per micro-step at which efficiency is half its maximum
    launch_s_per_layer: float = 0.0029  # fwd + bwd + recompute of one layer, eager HF+PEFT
    dequant_eff: float = 0.29  # of memory bandwidth reached by 4-bit dequantization
    link_eff_nvlink: float = 0.75  # NCCL bus bandwidth / link peak (no row moves it)
    link_eff_pcie: float = 0.12  # consumer cards without peer-to-peer: through host memory
    overlap: float = 0.14  # share of compute time that hides communication
    elem_bytes: float = 84.0  # bytes moved per hidden unit, token and layer (fwd + bwd)
    step_fixed_s: float = 0.28  # per optimizer step: zero_grad, clipping, scheduler, logging
    # pinned copies reach about 80% of the PCIe rate (128b/130b encoding, packet headers);
    # a prior, not yet measured by frugal (GPU_CHECKS)
    host_link_eff: float = 0.8


def load_speed_constants(gpu: str | None = None, method: str | None = None) -> SpeedConstants:
    """The calibration file's constants (its groups for `gpu` and `method` when given)."""
    return calibration.load("speed", SpeedConstants, gpu, method)


@dataclass
class Speed:
    step_time_s: float
    tokens_per_s: float
    efficiency: float  # achieved model FLOPs / peak
    bound: str  # what limits the step: compute, memory, communication
    parts_s: dict[str, float] = field(default_factory=dict)


def step_time(
    prof: Profile,
    job: TrainJob,
    gpu: GPU,
    hidden: int,
    gpus_per_node: int | None = None,
    node_gbps: float = 0.0,
    c: SpeedConstants | None = None,
) -> Speed | None:
    """Seconds per optimizer step of `job` on `job.gpus` GPUs; None if the GPU lacks the dtype."""
    c = c or load_speed_constants(gpu.name, job.method)
    peak_tf = gpu.peak_tflops(job.compute_dtype)
    if not peak_tf:
        return None
    peak, bw = peak_tf * 1e12, gpu.bandwidth_gbps * 1e9
    f_micro = sum(prof.flops(job.batch, job.seq).values())
    m = _micro_batch(prof, job, gpu, hidden, c, f_micro, peak)
    trainable = prof.start_bytes("trainable_weights")
    opt_bytes = prof.start_bytes("optimizer_state")
    optimizer = 2 * (opt_bytes + 3 * trainable) / bw / (job.gpus if job.sharding != "ddp" else 1)
    comm = _comm_s(prof, job, gpu, gpus_per_node or job.gpus, node_gbps, c)
    exposed = max(0.0, comm - c.overlap * (job.grad_accum * m.compute))
    step = job.grad_accum * m.seconds + optimizer + exposed + c.step_fixed_s
    parts = {k: job.grad_accum * v for k, v in asdict(m).items()}
    bound = "compute"
    if exposed > 0.3 * step:
        bound = "communication"
    elif m.memory_floor > m.compute or m.dequant + m.elementwise > m.compute:
        bound = "memory"
    return Speed(
        step_time_s=step,
        tokens_per_s=job.tokens_per_step / step,
        efficiency=f_micro * job.grad_accum / (peak * step),
        bound=bound,
        parts_s=parts | {"optimizer": optimizer, "comm_exposed": exposed},
    )


@dataclass
class _MicroBatch:
    """Seconds of one micro-batch's forward and backward, by what they are spent on."""

    compute: float  # the FLOPs at the efficiency a micro-batch of this size reaches
    memory_floor: float  # reading the weights once per pass
    elementwise: float  # norms, activations, residuals: memory-bound per token
    dequant: float  # QLoRA: unpacking the 4-bit weights each pass
    overhead: float  # kernel launches
    offload: float  # activations to the host and back

    @property
    def seconds(self) -> float:
        floor = max(self.compute, self.memory_floor)
        return floor + self.elementwise + self.dequant + self.overhead + self.offload


def _micro_batch(
    prof: Profile, job: TrainJob, gpu: GPU, hidden: int, c: SpeedConstants, flops: float,
    peak: float,
) -> _MicroBatch:  # fmt: skip
    """One micro-batch's time: its `flops` on a GPU of `peak` FLOP/s."""
    bw = gpu.bandwidth_gbps * 1e9
    tokens = job.batch * job.seq
    passes = 3 if job.grad_checkpointing else 2
    eff_max = {
        "consumer": c.eff_max_consumer,
        "workstation": c.eff_max_workstation,
    }.get(gpu.tier, c.eff_max_datacenter)
    eff = eff_max * tokens / (tokens + c.t_half)
    frozen = prof.start_bytes("frozen_weights")
    weights = frozen + prof.start_bytes("trainable_weights")
    dequant = 0.0
    if job.method == "qlora":
        # packed 4-bit bytes are 1/4 of bf16: each pass reads them and writes a bf16 copy
        q_params = frozen * 2  # ~2 values per packed byte; embeddings are a small share
        dequant = q_params * passes * 2.5 / (bw * c.dequant_eff)
    host_link = gpu.host_link_gbps * 1e9 * c.host_link_eff
    return _MicroBatch(
        compute=flops / (peak * eff),
        memory_floor=weights * passes / bw,
        elementwise=tokens * prof.n_layers * hidden * c.elem_bytes * passes / 3 / bw,
        dequant=dequant,
        overhead=prof.n_layers * c.launch_s_per_layer * passes / 3,
        offload=2 * prof.host_bytes(job.batch, job.seq) / host_link,
    )


def _comm_s(
    prof: Profile, job: TrainJob, gpu: GPU, per_node: int, node_gbps: float, c: SpeedConstants
) -> float:
    grad_bytes = prof.start_bytes("trainable_weights")  # gradients: the trainable's dtype
    weights = prof.start_bytes("frozen_weights") + grad_bytes
    return comm_seconds(grad_bytes, weights, job, gpu, per_node, node_gbps, c)


def comm_seconds(
    grad_bytes: float, weights: float, job: TrainJob, gpu: GPU, per_node: int,
    node_gbps: float, c: SpeedConstants,
) -> float:  # fmt: skip
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
