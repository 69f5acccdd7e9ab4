"""What a decoder layer costs the CPU to dispatch: the floor of a small step's time on a GPU.

Each model is built from its bundled config with tiny dimensions (hidden 64) and its real
layer count, so a step does no arithmetic to speak of: what is left is eager PyTorch
dispatching each op (and autograd recording it). One forward and backward of a 64-token row
with the job's LoRA targets and checkpointing (the recompute included); the ops counted by
a dispatch mode. On a GPU
a step whose kernels finish faster than this cannot go faster than this (docs/accuracy.md:
Qwen3-0.6B LoRA on an H200 ran at 12.3 ms per layer per micro-batch).

    python benchmarks/dispatch_cost.py [--runs 7] [--models ID ...] [--method lora|full]
        [--no-checkpointing]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from frugal.models.specs import load_spec
from frugal.step.job import make_job
from frugal.step.model import build_model

MODELS = ("meta-llama/Llama-3.2-1B", "Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B")
TINY = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
}  # fmt: skip


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def measure(model_id: str, method: str, runs: int, checkpointing: bool) -> dict[str, float]:
    config = dict(load_spec(model_id).config) | TINY
    config.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    job = make_job(
        method=method, precision="fp32", batch=1, seq=64, grad_checkpointing=checkpointing
    )
    model = build_model(config, job, "cpu")
    model.train()  # checkpointing recomputes only in training
    ids = torch.randint(0, TINY["vocab_size"], (1, 64))

    def step() -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    for _ in range(2):  # warm-up
        step()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    count = _Count()
    with count:
        step()
    layers = config["num_hidden_layers"]
    s = statistics.median(times)
    return {
        "layers": layers,
        "ops": count.ops,
        "step_ms": s * 1e3,
        "us_per_op": s / count.ops * 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--method", default="lora", choices=("lora", "full"))
    ap.add_argument("--no-checkpointing", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ckpt = not args.no_checkpointing
    what = "forward, backward and recompute" if ckpt else "forward and backward"
    print(f"{args.method}, {what}, 64 tokens, tiny dimensions; median of {args.runs}")
    print("| model | layers | ops per layer | ms per layer | us per op |")
    print("|---|---:|---:|---:|---:|")
    for m in args.models:
        r = measure(m, args.method, args.runs, ckpt)
        print(f"| {m} | {r['layers']:.0f} | {r['ops'] / r['layers']:.0f} | "
              f"{r['step_ms'] / r['layers']:.2f} | {r['us_per_op']:.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
