"""The GPU catalog: memory a process can use, bf16 support, tensor throughput, bandwidth."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

from frugal.errors import FrugalError, closest

GIB = 2**30


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


def _norm(s: str) -> str:
    return "".join(c for c in s.lower() if c.isalnum())


@cache
def gpus() -> tuple[GPU, ...]:
    text = (resources.files("frugal.hardware") / "data" / "gpus.csv").read_text()
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    out = []
    for r in rows:
        out.append(
            GPU(
                name=r["name"],
                aliases=tuple(a for a in r["aliases"].split("|") if a),
                memory_gb=float(r["memory_gb"]),
                usable_gib=float(r["usable_mib"]) / 1024,
                bf16=r["bf16"] == "yes",
                bf16_tflops=float(r["bf16_tflops"]) if r["bf16_tflops"] else None,
                fp16_tflops=float(r["fp16_tflops"]) if r["fp16_tflops"] else None,
                bandwidth_gbps=float(r["bandwidth_gbps"]),
                source=r["usable_source"],
            )
        )
    return tuple(out)


def find_gpu(name: str) -> GPU:
    """Match forgivingly: 'l40s', 'RTX 4090', 'rtx4090', 'h100-sxm' all work."""
    key = _norm(name)
    for g in gpus():
        if key == _norm(g.name) or key in (_norm(a) for a in g.aliases):
            return g
    names = [g.name for g in gpus()]
    hint = closest(name, names)
    raise FrugalError(
        f"unknown GPU {name!r}; closest: {', '.join(hint) if hint else ', '.join(names)} "
        "(or pass --gpu-memory GIB)"
    )
