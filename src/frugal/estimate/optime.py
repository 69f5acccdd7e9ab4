"""A step's time from its traced ops: each op on the GPU's roofline, the host that launches
them, and whichever of the two is longer.

The simulation enters every op of the step in an op table (`tracker.StepTracker`): its
class, FLOPs and the bytes it reads and writes, and the metadata-only ops dispatched
before it. On a GPU of dense tensor rate `peak` and memory bandwidth `bw`:

    gpu(op)   = max(FLOPs / (peak x eff_c x F / (F + F_half)),    (small GEMMs fill fewer
                    bytes / (bw x beff_c),                         tiles: NeuSight's point)
                    kernel_floor)                                  (a launch's own latency)
    host(op)  = host_op_s + views x host_view_s                   (eager PyTorch's dispatch
                                                                   of the op and its views)

(an allocation launches no kernel: no GPU time, the host's only)
with one efficiency per op class (`categories.OP_CLASSES`). Eager PyTorch enqueues kernels
asynchronously, so within each part of a micro-step (forward, backward) the GPU and the
host overlap and the part takes the longer of the two; the loop's syncs between the parts
(the loss read, clipping's norm, the optimizer) do not overlap:

    micro     = max(gpu_fwd, host_fwd) + max(gpu_bwd, host_bwd)
    step      = accum x micro + max(gpu_opt, host_opt) + exposed comm + step_fixed

Decoder layers are identical, so the time of a model of L layers is the line through two
simulated depths (the profile's depth rule, `profile.py`; `Depths`): T(L) = T(lo) +
(L - lo) / (hi - lo) x (T(hi) - T(lo)), per part and for GPU and host apart.

The host's cost per op is the host CPU's and differs between machines of one GPU type:
the constants hold a typical host and the fastest and slowest hosts seen (`host_fast`,
`host_slow`), so a launch-bound step's time is a range. The constants are fitted to measured rows by
`benchmarks/speed_fit.py`, which cross-validates them and prints the table in
docs/accuracy.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from frugal.estimate.categories import OP_CLASS, OP_CLASSES, PARTS, step_parts
from frugal.hardware.gpus import GPU


@dataclass(frozen=True)
class OpSpeedConstants:
    """Per op class: the share of the GPU's tensor peak (matmul, attention) or bandwidth it
    reaches; the host's dispatch costs. Fitted by `python benchmarks/speed_fit.py --fit` on
    frugal's three H200 loans and 34 third-party rows (2026-12-05; docs/accuracy.md).
    Attention's FLOPs are torch's count, the whole s x s score matrix: a causal kernel does
    about half of them, so its share of the peak reads about twice what it reaches."""

    matmul_eff: float = 0.893  # of the dense tensor peak, for large products
    matmul_half_flop: float = 9.53e8  # FLOPs at which a product reaches half of that
    attention_eff: float = 0.954  # fused attention, of the dense tensor peak
    elementwise_bw_eff: float = 0.781  # of the memory bandwidth
    reduction_bw_eff: float = 0.200
    copy_bw_eff: float = 0.917
    dequant_bw_eff: float = 0.137  # 4-bit dequantization (bitsandbytes' kernels)
    offload_link_eff: float = 0.984  # of the host link (pinned copies)
    optimizer_bw_eff: float = 0.377  # foreach or fused updates
    kernel_floor_s: float = 10.3e-6  # the least a kernel takes, launch latency included
    host_op_s: float = 26.4e-6  # a typical host: eager dispatch of one op (autograd, PEFT)
    host_view_s: float = 0.96e-6  # ... of one view or detach
    # the fastest and the slowest hosts seen, as factors on the typical host's dispatch cost
    host_fast: float = 0.630
    host_slow: float = 1.74
    step_fixed_s: float = 0.0204  # per optimizer step: logging, the scheduler, the loop

    def bw_eff(self) -> np.ndarray:
        """Bandwidth efficiency per op class (matmul and attention: elementwise's)."""
        by = {
            "elementwise": self.elementwise_bw_eff,
            "reduction": self.reduction_bw_eff,
            "copy": self.copy_bw_eff,
            "dequant": self.dequant_bw_eff,
            "optimizer": self.optimizer_bw_eff,
            "offload": 1.0,  # priced on the host link instead (see `gpu_seconds`)
        }
        return np.array([by.get(c, self.elementwise_bw_eff) for c in OP_CLASSES])


@dataclass(frozen=True)
class TracedOps:
    """The op table of one simulated run (`tracker.StepTracker`), one entry per op (the
    first: before tracking): its class (an OP_CLASSES index), FLOPs, bytes read and
    written, and the metadata-only ops (views) dispatched before it."""

    kind: np.ndarray
    flops: np.ndarray
    nbytes: np.ndarray
    views: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)

    def cost(self, idx: np.ndarray) -> np.ndarray:
        """The FLOPs and bytes of the ops `idx`: (ops, 2)."""
        return np.column_stack([self.flops[idx], self.nbytes[idx]])


@dataclass(frozen=True)
class OpTable:
    """The ops of one simulated step, merged where identical: each unique op's part of the
    step (a PARTS index), class (an OP_CLASSES index), FLOPs, bytes, and how many times it
    runs; and the host's dispatches per part (`host_ops`, `host_views`)."""

    part: np.ndarray
    kind: np.ndarray
    flops: np.ndarray
    nbytes: np.ndarray
    count: np.ndarray
    host_ops: np.ndarray  # (parts,)
    host_views: np.ndarray  # (parts,)

    @classmethod
    def from_trace(cls, ops: TracedOps, segments: np.ndarray, micro: np.ndarray) -> OpTable:
        """The first micro-step's forward and backward and the optimizer's segment of a
        trace's op table (`Trace.ops`, `Trace.segments`, `Trace.micro`): what every
        micro-step and every update repeat."""
        part, keep = step_parts(segments, micro)
        rows = np.column_stack([part[keep], ops.kind[keep], ops.flops[keep], ops.nbytes[keep]])
        uniq, counts = np.unique(rows, axis=0, return_counts=True)
        host_ops = np.bincount(part[keep], minlength=len(PARTS)).astype(np.float64)
        views = np.bincount(part[keep], weights=ops.views[keep], minlength=len(PARTS))
        u = uniq.T  # each unique op's part, class, FLOPs and bytes
        return cls(u[0], u[1], u[2], u[3], counts.astype(np.float64), host_ops, views)

    def gpu_seconds(self, gpu: GPU, peak_flops: float, c: OpSpeedConstants) -> np.ndarray:
        """Seconds the GPU spends on each part (PARTS) of the step."""
        return self.gpu_by_class(gpu, peak_flops, c).sum(axis=1)

    def gpu_by_class(self, gpu: GPU, peak_flops: float, c: OpSpeedConstants) -> np.ndarray:
        """Seconds the GPU spends on each class of op (OP_CLASSES) in each part: (parts,
        classes)."""
        k = self.kind.astype(np.int64)
        link = gpu.host_link_gbps * 1e9
        t = op_seconds(k, self.flops, self.nbytes, peak_flops, gpu.bandwidth_gbps * 1e9, link, c)
        slot = self.part.astype(np.int64) * len(OP_CLASSES) + k
        n = len(PARTS) * len(OP_CLASSES)
        return np.bincount(slot, weights=t * self.count, minlength=n).reshape(len(PARTS), -1)

    def host_seconds(self, c: OpSpeedConstants, host: float = 1.0) -> np.ndarray:
        """Seconds the host spends dispatching each part, on a host `host` times as slow as
        the typical one."""
        return host * (self.host_ops * c.host_op_s + self.host_views * c.host_view_s)


def op_seconds(
    kind: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
    peak_flops: np.ndarray | float,
    bw: np.ndarray | float,
    host_link: np.ndarray | float,
    c: OpSpeedConstants,
) -> np.ndarray:
    """GPU seconds of each op (of class `kind`): the longer of its FLOPs at its class's share
    of the tensor peak and its bytes at its class's share of the bandwidth (offloads: of the
    host link), and at least a kernel's floor. Arrays throughout, so that many steps on
    many GPUs are timed at once (the fit does)."""
    eff = np.where(kind == OP_CLASS["attention"], c.attention_eff, c.matmul_eff)
    eff = eff * np.divide(
        flops, flops + c.matmul_half_flop, out=np.ones_like(flops), where=flops > 0
    )
    compute = np.divide(flops, peak_flops * eff, out=np.zeros_like(flops), where=flops > 0)
    rate = np.where(
        kind == OP_CLASS["offload"], host_link * c.offload_link_eff, bw * c.bw_eff()[kind]
    )
    t = np.maximum(np.maximum(compute, nbytes / rate), c.kernel_floor_s)
    return np.where(kind == OP_CLASS["alloc"], 0.0, t)  # no kernel: the host's time only


T = TypeVar("T", float, np.ndarray)


def along(lo: T, hi: T, w: Any) -> T:
    """A figure of a step on the depth line: `w` of the way from its value at the lower
    simulated depth (`lo`) to its value at the upper (`hi`), `Depths.weight`. The one place
    the line is drawn: memory, FLOPs, parameters and time all follow it (arrays: a `w` for
    each row, as the speed fit times many steps at once)."""
    return lo + w * (hi - lo)


@dataclass(frozen=True)
class Depths:
    """The two depths a step is simulated at (decoder layers); any figure of the step at
    another depth is on the line through its values at these two (the profile's depth
    rule, `profile.py`): T(L) = T(lo) + (L - lo) / (hi - lo) x (T(hi) - T(lo))."""

    lo: int
    hi: int

    def weight(self, layers: int) -> float:
        """How far along the line `layers` decoder layers are: 0 at `lo`, 1 at `hi`."""
        return (layers - self.lo) / (self.hi - self.lo)

    def at(self, layers: int, lo: T, hi: T) -> T:
        """The figure at `layers` layers from its values at the two depths."""
        return along(lo, hi, self.weight(layers))


@dataclass(frozen=True)
class StepOps:
    """The op tables of two depths of one step, whose line gives any depth."""

    lo: OpTable
    hi: OpTable
    depths: Depths

    def parts(
        self, layers: int, gpu: GPU, peak_flops: float, c: OpSpeedConstants, host: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """GPU and host seconds of each part at `layers` decoder layers."""
        g, h = self.by_class(layers, gpu, peak_flops, c, host)
        return g.sum(axis=1), h

    def by_class(
        self, layers: int, gpu: GPU, peak_flops: float, c: OpSpeedConstants, host: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """GPU seconds of each class of op in each part (parts, classes), and the host's
        seconds of each part, at `layers` decoder layers."""
        g_lo, g_hi = (t.gpu_by_class(gpu, peak_flops, c) for t in (self.lo, self.hi))
        h_lo, h_hi = self.lo.host_seconds(c, host), self.hi.host_seconds(c, host)
        at = self.depths.at
        return np.maximum(at(layers, g_lo, g_hi), 0.0), at(layers, h_lo, h_hi)


@dataclass(frozen=True)
class OpStepTime:
    """One optimizer step's seconds, and what bounds it."""

    seconds: float
    gpu_s: float  # the GPU's busy time in the step
    host_s: float  # the host's dispatch time in the step
    bound: str  # "gpu" or "host" (launch-bound): the larger share of the micro-steps


def step_seconds(
    ops: StepOps,
    layers: int,
    gpu: GPU,
    peak_flops: float,
    accum: int,
    c: OpSpeedConstants,
    host: float = 1.0,
    comm_exposed_s: float = 0.0,
) -> OpStepTime:
    """Seconds of one optimizer step of `accum` micro-steps (see the module's formula)."""
    g, h = ops.parts(layers, gpu, peak_flops, c, host)
    micro = max(g[0], h[0]) + max(g[1], h[1])
    seconds = accum * micro + max(g[2], h[2]) + comm_exposed_s + c.step_fixed_s
    gpu_s = accum * (g[0] + g[1]) + g[2]
    host_s = accum * (h[0] + h[1]) + h[2]
    return OpStepTime(seconds, gpu_s, host_s, "host" if host_s > gpu_s else "gpu")
