"""Long context on small GPUs (issue 18): what each memory technique of the step buys.

1. The longest sequence that fits: Llama-3.1-8B QLoRA r32 on all linear layers, batch 1, by
   GPU memory, with the plain step, each technique alone (the loss in 16 chunks, the layer
   inputs offloaded to host memory, the 8-bit optimizer) and all together, beside the
   published Hugging Face + FA2 and Unsloth figures. The estimator's `max_seq` for a card of
   that many GB (usable memory = the GB in GiB, less the 5% margin every plan keeps), with
   the tokens/s each technique costs at 16K on an RTX 4090.
2. The plan of a 32K-context 8B QLoRA job (20M tokens, effective batch 8) before (plain step:
   `--loss-chunks 0 --no-offload-activations`) and after (the plan turns techniques on),
   on AWS on-demand and on your own RTX 4090 at 24K.
3. Full fine-tuning with the optimizer in backward: device memory of one step (8 x 512
   tokens, the loss in 16 chunks, checkpointing) with the optimizer after backward and in
   it, by model and precision; and the plan of Qwen3-0.6B in bf16 on a 6 GB laptop GPU
   before (`--no-optimizer-in-backward`) and after.

Usage: python benchmarks/long_context.py [--write docs/estimate.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from frugal.errors import FrugalError
from frugal.estimate.core import estimate
from frugal.hardware.catalog import select_offers
from frugal.hardware.gpus import find_gpu
from frugal.models.specs import load_spec
from frugal.plan.constraints import Constraints
from frugal.plan.search import search
from frugal.step.job import make_job

sys.path.insert(0, str(Path(__file__).parent))
from _docs import write_block

MODEL = "meta-llama/Llama-3.1-8B"
GBS = (12, 16, 24, 40, 48, 80)
# Unsloth's blog (unsloth.ai/blog/llama3-3, Dec 2024): Llama 3.1 (8B), QLoRA r32 on all
# linear layers, batch 1, sequences padded to length; only the figures carried in issue 18
PUBLISHED = {24: ("5,789", "78,475"), 80: ("28,454", "342,733")}
CHUNKS = {"loss_chunks": 16}
OFFLOAD = {"offload_activations": True}
EIGHT_BIT = {"optimizer": "adamw-8bit"}
TECHNIQUES: dict[str, dict[str, Any]] = {
    "plain": {},
    "--loss-chunks 16": CHUNKS,
    "--offload-activations": OFFLOAD,
    "--optimizer adamw-8bit": EIGHT_BIT,
    "all three": {**CHUNKS, **OFFLOAD, **EIGHT_BIT},
}


def _job(**extra: Any) -> Any:
    return make_job(method="qlora", lora_r=32, batch=1, **{"seq": 2048, **extra})


def longest(gb: int, **extra: Any) -> int:
    return int(
        estimate(load_spec(MODEL), _job(**extra), gpu_memory_gib=gb * 1e9 / 2**30).max_seq or 0
    )


def longest_table() -> str:
    names = list(TECHNIQUES)
    lines = [
        f"Longest sequence that fits, {MODEL} QLoRA r32 all-linear, batch 1 "
        "(`python benchmarks/long_context.py`):",
        "",
        "| GPU memory | " + " | ".join(names) + " | all / plain | published HF + FA2 | "
        "published Unsloth |",
        "|---:|" + "---:|" * (len(names) + 3),
    ]
    for gb in GBS:
        got = [longest(gb, **TECHNIQUES[n]) for n in names]
        hf, us = PUBLISHED.get(gb, ("-", "-"))
        ratio = f"{got[-1] / got[0]:.1f}x" if got[0] else "-"
        cells = " | ".join(f"{x:,}" for x in got)
        lines.append(f"| {gb} GB | {cells} | {ratio} | {hf} | {us} |")
    card = find_gpu("RTX 4090")
    speed = {
        n: estimate(load_spec(MODEL), _job(seq=16384, **CHUNKS, **t), gpu=card)
        for n, t in {
            "--loss-chunks 16": {},
            "chunks + offload": OFFLOAD,
            "chunks + adamw-8bit": EIGHT_BIT,
        }.items()
    }
    base = speed["--loss-chunks 16"]
    assert base.tokens_per_s is not None
    lines += [
        "",
        "What each costs in time at 16K tokens on an RTX 4090 (plan's throughput model):",
        "",
    ]
    lines += ["| step | device total GiB | host GiB | tokens/s | vs chunked loss alone |"]
    lines += ["|---|---:|---:|---:|---:|"]
    for name, e in speed.items():
        t = e.tokens_per_s or 0.0
        lines.append(
            f"| {name} | {e.memory.device_total / 2**30:.1f} | {e.memory.host / 2**30:.1f} | "
            f"{t:,.0f} | {t / base.tokens_per_s - 1:+.1%} |"
        )
    return "\n".join(lines)


def _plan_row(label: str, seq: int, before: bool, **where: Any) -> str:
    spec = load_spec(MODEL)
    pinned = {"loss_chunks": 0} if before else {}
    base = make_job(method="qlora", lora_r=32, seq=seq, **pinned)
    k = Constraints(
        tokens=20e6, effective_batch=8, methods=("qlora",), spot=where.pop("spot", "auto"),
        auto_loss_chunks=not before, auto_offload=not before,
    )  # fmt: skip
    try:
        p = search(spec, base, select_offers(**where), k).recommendation
    except FrugalError:
        return f"| {label} | {'before' if before else 'after'} | nothing fits | | | | |"
    j = p.job
    on = [f"loss in {j.loss_chunks} chunks"] if j.loss_chunks else []
    on += [f"offload ({p.host_offload_gib:.1f} GiB host)"] if j.offload_activations else []
    return (
        f"| {label} | {'before' if before else 'after'} | {p.offer.provider} {p.offer.instance} "
        f"({j.gpus}x {p.offer.gpu.name}) | {', '.join(on) or 'plain'} | "
        f"{p.device_total_gib:.1f} | {p.hours:.2f} | ${p.cost_usd:.2f} |"
    )


def plan_table() -> str:
    lines = [
        f"Plans for {MODEL} QLoRA r32, 20M tokens, effective batch 8: before (the plain step, "
        "`--loss-chunks 0 --no-offload-activations`) and after (`frugal plan` turns the "
        "techniques on where they make a plan feasible or faster):",
        "",
        "| job | | plan | techniques | GiB per GPU | hours | cost |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for before in (True, False):
        lines.append(
            _plan_row("32K tokens, AWS on-demand", 32768, before, providers_csv="aws", spot="never")
        )
    for before in (True, False):
        lines.append(
            _plan_row(
                "24K tokens, your RTX 4090",
                24576,
                before,
                local=["RTX 4090"],
                providers_csv="local",
            )
        )
    return "\n".join(lines)


IN_BACKWARD_ROWS = (
    ("Qwen/Qwen2.5-0.5B", "bf16-mixed"),
    ("Qwen/Qwen3-0.6B", "bf16-true"),
    ("meta-llama/Llama-3.2-1B", "bf16-mixed"),
    ("meta-llama/Llama-3.2-1B", "bf16-true"),
    ("meta-llama/Llama-3.2-1B", "fp32"),
)


def in_backward_table() -> str:
    lines = [
        "Full fine-tuning, AdamW, one step of 8 x 512 tokens with the loss in 16 chunks and "
        "checkpointing: device memory with the optimizer after backward and in it:",
        "",
        "| model | precision | gradients GiB | after backward GiB | in backward GiB | saved GiB "
        "| saved bytes / param | its peak at |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for model, precision in IN_BACKWARD_ROWS:
        spec = load_spec(model)
        est = {}
        for fused in (False, True):
            job = make_job(
                method="full", precision=precision, batch=8, seq=512, loss_chunks=16,
                optimizer_in_backward=fused,
            )  # fmt: skip
            est[fused] = estimate(spec, job).to_json()
        saved = est[False]["device_total_gib"] - est[True]["device_total_gib"]
        per_param = saved * 2**30 / est[True]["trainable_params"]
        lines.append(
            f"| {model} | {precision} | {est[False]['breakdown_gib']['gradients']:.2f} | "
            f"{est[False]['device_total_gib']:.2f} | {est[True]['device_total_gib']:.2f} | "
            f"{saved:.2f} | {per_param:.1f} | {est[True]['peak_at']} |"
        )
    lines += ["", _in_backward_plans()]
    return "\n".join(lines)


def _in_backward_plans() -> str:
    spec = load_spec("Qwen/Qwen3-0.6B")
    rows = [
        "Plans for Qwen/Qwen3-0.6B full fine-tuning in bf16-true, AdamW, 5M tokens of 512, "
        "effective batch 8, on your RTX 4050 Laptop (6 GB):",
        "",
        "| | plan | techniques | GiB per GPU | tokens/s | hours | cost |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for before in (True, False):
        base = make_job(method="full", precision="bf16-true", seq=512)
        k = Constraints(
            tokens=5e6, effective_batch=8, methods=("full",), optimizers=("adamw",),
            auto_in_backward=not before,
        )  # fmt: skip
        offers = select_offers(local=["RTX 4050 Laptop"], providers_csv="local")
        label = "before" if before else "after"
        try:
            p = search(spec, base, offers, k).recommendation
        except FrugalError:
            rows.append(f"| {label} | nothing fits | | | | | |")
            continue
        j = p.job
        on = [f"loss in {j.loss_chunks} chunks"] if j.loss_chunks else []
        on += ["optimizer in backward"] if j.optimizer_in_backward else []
        on += ["offload"] if j.offload_activations else []
        rows.append(
            f"| {label} | micro-batch {j.batch} x accum {j.grad_accum} | {', '.join(on)} | "
            f"{p.device_total_gib:.1f} | {p.speed.tokens_per_s:,.0f} | {p.hours:.2f} | "
            f"${p.cost_usd:.2f} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", type=Path, help="markdown file whose long-context blocks to replace")
    args = ap.parse_args()
    longest_text, plans, fused = longest_table(), plan_table(), in_backward_table()
    print(longest_text + "\n\n" + plans + "\n\n" + fused)
    if args.write:
        write_block(args.write, "long-context", longest_text)
        write_block(args.write, "long-context-plans", plans)
        write_block(args.write, "in-backward", fused)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
