"""The GPU catalog: usable memory, bf16 support, tensor throughput, bandwidth, interconnect.

One catalog serves `frugal gpus`, `estimate --gpu`, `plan` and the offers (data/gpus.csv,
each row with its source).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from frugal.errors import FrugalError
from frugal.hardware.csvdata import data_rows
from frugal.names import closest, norm

GIB = 2**30
MARGIN = 0.05
"""Share of a GPU's usable memory that no estimate, plan or automatic micro-batch fills.

A step's `device_total` already counts the CUDA context and the allocator's modelled
reserve; the margin is for what a step-level model cannot see: fragmentation that grows
over a long run, memory other processes hold, and the estimator's own error
(docs/accuracy.md: core rows within 4% median, none more than 7.1% under). One value, used
by `estimate --gpu`, `plan` and `frugal train`'s automatic micro-batch (docs/estimate.md)."""


def memory_budget(usable_gib: float, margin: float = MARGIN) -> float:
    """Bytes a training step may need on a GPU with `usable_gib` usable: all but the margin."""
    return usable_gib * GIB * (1 - margin)


@dataclass(frozen=True)
class GPU:
    name: str
    aliases: tuple[str, ...]
    memory_gb: float
    usable_gib: float
    bf16: bool
    bf16_tflops: float | None
    fp16_tflops: float | None
    bandwidth_gbps: float
    source: str
    tier: str = "datacenter"  # datacenter | workstation | consumer
    link: str = "pcie"  # how GPUs in one machine talk: nvlink | pcie
    link_gbps: float = 32.0  # GB/s per direction per GPU
    tdp_w: float = 300.0
    fp8_tflops: float | None = None  # dense FP8 tensor rate; None: no FP8 tensor cores
    host_link_gbps: float = 32.0  # PCIe to the host, GB/s per direction

    @property
    def vendor(self) -> str:
        """nvidia or amd (AMD Instinct: MI...): what the trainer's kernels can run on."""
        return "amd" if self.name.startswith("MI") else "nvidia"

    def peak_tflops(self, compute_dtype: str) -> float | None:
        """Dense tensor TFLOPS for the compute dtype; None when the GPU cannot run it."""
        if compute_dtype == "bf16":
            return self.bf16_tflops if self.bf16 else None
        if compute_dtype == "fp16":
            return self.fp16_tflops
        if compute_dtype == "fp8":
            return self.fp8_tflops
        # fp32 matmuls run on TF32 tensor cores where there are any: about half the bf16 rate
        return (self.bf16_tflops or self.fp16_tflops or 0.0) / 2 or None

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "memory_gb": self.memory_gb,
            "usable_gib": round(self.usable_gib, 2),
            "bf16": self.bf16,
            "bf16_tflops": self.bf16_tflops,
            "fp16_tflops": self.fp16_tflops,
            "fp8_tflops": self.fp8_tflops,
            "bandwidth_gbps": self.bandwidth_gbps,
            "tier": self.tier,
            "vendor": self.vendor,
            "interconnect": self.link,
            "interconnect_gbps": self.link_gbps,
            "host_link_gbps": self.host_link_gbps,
            "tdp_w": self.tdp_w,
            "source": self.source,
        }


def _num(s: str) -> float | None:
    return float(s) if s.strip() else None


@cache
def gpus() -> tuple[GPU, ...]:
    text = (resources.files("frugal.hardware") / "data" / "gpus.csv").read_text()
    rows = (r for _, r in data_rows(text))
    return tuple(
        GPU(
            name=r["name"],
            aliases=tuple(a for a in r["aliases"].split("|") if a),
            memory_gb=float(r["memory_gb"]),
            usable_gib=float(r["usable_mib"]) / 1024,
            bf16=r["bf16"] == "yes",
            bf16_tflops=_num(r["bf16_tflops"]),
            fp16_tflops=_num(r["fp16_tflops"]),
            bandwidth_gbps=float(r["bandwidth_gbps"]),
            source=f"{r['spec_source']}; usable: {r['usable_source']}; link: {r['link_source']}",
            tier=r["tier"],
            link=r["link"],
            link_gbps=float(r["link_gbps"]),
            tdp_w=float(r["tdp_w"]),
            fp8_tflops=_num(r["fp8_tflops"]),
            host_link_gbps=float(r["host_link_gbps"]),
        )
        for r in rows
    )


@cache
def lookup_gpu(name: str) -> GPU | None:
    """Our name, an alias, or the device name CUDA reports ('NVIDIA H100 80GB HBM3',
    'Tesla T4', 'NVIDIA GeForce RTX 4090'): vendor and brand words are dropped first."""
    key = norm(name)
    for word in ("nvidia", "tesla", "geforce"):
        if key.startswith(word) and len(key) > len(word):
            key = key[len(word) :]
    if key.endswith("gpu") and len(key) > 3:
        key = key[:-3]
    for g in gpus():
        if key == norm(g.name) or key in (norm(a) for a in g.aliases):
            return g
    return None


def find_gpu(name: str, otherwise: str = "") -> GPU:
    """Match forgivingly: 'l40s', 'RTX 4090', 'rtx4090', 'h100-sxm' all work. An unknown
    name's error names the closest GPUs, `frugal gpus`, and `otherwise` (the command's
    other way to say the card, e.g. "--gpu-memory GIB"), when it has one."""
    g = lookup_gpu(name)
    if g is not None:
        return g
    names = [g.name for g in gpus()]
    hint = closest(name, names)
    alt = f", or pass {otherwise}" if otherwise else ""
    raise FrugalError(
        f"unknown GPU {name!r}; closest: {', '.join(hint) if hint else ', '.join(names)} "
        f"(all of them: frugal gpus{alt})"
    )
