"""The longest sequence that fits: Llama-3.1-8B QLoRA r32 on all linear layers, batch 1, by
GPU memory, with the plain loss and with the loss in chunks (`--loss-chunks`), beside the
published Hugging Face + FA2 and Unsloth figures (issue 18).

The estimator's `max_seq` for a card of that many GB (usable memory = the GB in GiB less the
5% margin every plan keeps). Usage: python benchmarks/long_context.py [--write docs/estimate.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from frugal.estimate.core import estimate
from frugal.models.specs import load_spec
from frugal.step.job import make_job

sys.path.insert(0, str(Path(__file__).parent))
from _docs import write_block

MODEL = "meta-llama/Llama-3.1-8B"
GBS = (12, 16, 24, 40, 48, 80)
# Unsloth's blog (unsloth.ai/blog/llama3-3, Dec 2024): Llama 3.1 (8B), QLoRA r32 on all
# linear layers, batch 1, sequences padded to length; only the figures carried in issue 18
PUBLISHED = {24: ("5,789", "78,475"), 80: ("28,454", "342,733")}


def longest(gb: int, chunks: int) -> int:
    job = make_job(method="qlora", lora_r=32, batch=1, seq=2048, loss_chunks=chunks)
    return int(estimate(load_spec(MODEL), job, gpu_memory_gib=gb * 1e9 / 2**30).max_seq or 0)


def table() -> str:
    lines = [
        f"Longest sequence that fits, {MODEL} QLoRA r32 all-linear, batch 1 "
        "(`python benchmarks/long_context.py`):",
        "",
        "| GPU memory | frugal, plain loss | frugal, --loss-chunks 16 | ratio | "
        "published HF + FA2 | published Unsloth |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for gb in GBS:
        plain, chunked = longest(gb, 0), longest(gb, 16)
        hf, us = PUBLISHED.get(gb, ("-", "-"))
        ratio = f"{chunked / plain:.1f}x" if plain else "-"
        lines.append(f"| {gb} GB | {plain:,} | {chunked:,} | {ratio} | {hf} | {us} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", type=Path, help="markdown file whose long-context block to replace")
    args = ap.parse_args()
    text = table()
    print(text)
    if args.write:
        write_block(args.write, "long-context", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
