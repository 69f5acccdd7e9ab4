"""The estimate against the step `frugal train` runs: both measured by one tracker.

Each case runs real training steps with the trainer's own code (`recipe.setup`,
`steps.step_input`, `steps.device_step`) on CPU tensors while `StepTracker` records every
live storage, and simulates the same job with the estimator (`get_profile`, which runs
`frugal.step` on fake tensors at shallower depths and extrapolates). At the peak of each
segment of the step (forward; backward through the head, the layers, the embeddings; the
optimizer) the bytes of every category are compared. `tests/test_step_consistency.py`
holds them to the target: weights, gradients and optimizer state exact (no allocator on
either side), activations, logits and loss, and temporaries within 2%.

    python benchmarks/step_consistency.py [--write docs/estimate.md]

prints, per case, the largest deviation of each category over the segments.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

from frugal.config import RunConfig, validate_run_config
from frugal.estimate.categories import CATEGORIES, DEVICE, SEGMENTS, peak_row
from frugal.estimate.core import get_profile
from frugal.estimate.tracker import StepTracker, tracking
from frugal.models.specs import load_spec
from frugal.run import recipe, steps
from frugal.run.passes import run_passes
from frugal.step.model import cuda_kernels
from frugal.step.tasks import task_of

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "examples" / "tiny-llama"
SPELL = ROOT / "examples" / "data" / "spell.jsonl"
EXACT = ("frozen_weights", "trainable_weights", "gradients", "optimizer_state")
TRANSIENT_TOL = 0.02

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 4,  # the estimate simulates 1 and 2 layers and extrapolates
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    # the tracker tells logits by their last dimension: no other size may equal it, here
    # nor in the estimate's runs (64, 128, 192 tokens; 96, 192, 288 beyond Gemma's window)
    "vocab_size": 200,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MOE = {
    **LLAMA,
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "head_dim": 16,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
# gpt-oss's shape: experts with biases and an interleaved, clamped gate, attention sinks
# (eager attention: transformers has no SDPA path for them), sliding and full layers
GPT_OSS = {
    **LLAMA,
    "model_type": "gpt_oss",
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "head_dim": 16,
    "sliding_window": 32,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "attention_bias": True,
}
GEMMA = {
    **LLAMA,
    "model_type": "gemma2",
    "head_dim": 16,
    "sliding_window": 32,  # shorter than the rows: the sliding masks are banded
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "query_pre_attn_scalar": 16,
    "tie_word_embeddings": True,
}


def scaled_down(model_id: str, **dims: int) -> dict[str, Any]:
    """A bundled model's own config (its rope scaling, GQA, ties) with small dimensions."""
    config = {k: v for k, v in load_spec(model_id).config.items() if not k.startswith("_")}
    return {**config, **dims, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


# Llama-3.1-8B's architecture at 1/32 of its width and 1/8 of its depth
LLAMA31_8B = scaled_down(
    "meta-llama/Llama-3.1-8B",
    hidden_size=128,
    intermediate_size=448,
    num_attention_heads=4,
    num_key_value_heads=1,
    num_hidden_layers=4,
    vocab_size=200,
)
MODELS = {"llama": LLAMA, "moe": MOE, "gpt-oss": GPT_OSS, "gemma": GEMMA, "llama31-8b": LLAMA31_8B}
# a distillation's teacher: wider and deeper than the students (6 layers to their 4), with
# weights on disk as a teacher has them (random: memory does not read their values)
TEACHER = {**LLAMA, "hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 6}


@dataclass(frozen=True)
class Case:
    model: str
    method: str
    precision: str
    optimizer: str
    checkpointing: bool
    packing: bool = True
    accum: int = 1
    contrastive: bool = False
    loss_chunks: int = 0
    offload: bool = False
    in_backward: bool = False
    classify: bool = False  # a sequence classifier of 3 classes (padded rows, no LM head)
    preference: str = ""  # preference tuning's method (pairs of padded rows, a reference)
    distill: bool = False  # a student of TEACHER (its weights and forward beside the step)
    top_k: int = 0  # distilled from TEACHER's top-k logits, precomputed (no teacher in the step)

    @property
    def task(self) -> str:
        if self.distill:
            return "distill"
        return "classification" if self.classify else "preference" if self.preference else "causal"

    @property
    def id(self) -> str:
        bits = [self.model, self.method, self.precision, self.optimizer]
        bits += [
            "ckpt" if self.checkpointing else "no-ckpt",
            "packed" if self.packing else "padded",
        ]
        bits += [f"accum{self.accum}"] if self.accum > 1 else []
        bits += ["contrastive"] if self.contrastive else []
        bits += [f"chunks{self.loss_chunks}"] if self.loss_chunks else []
        bits += ["offload"] if self.offload else []
        bits += ["in-backward"] if self.in_backward else []
        bits += ["classifier"] if self.classify else []
        bits += [self.preference] if self.preference else []
        bits += ["distilled"] if self.distill else []
        bits += [f"top{self.top_k}"] if self.top_k else []
        return "-".join(bits)


CASES = [
    Case("llama", "full", "fp32", "adamw", False),
    Case("llama", "full", "bf16-mixed", "adamw", True, accum=2),
    Case("llama", "full", "bf16-true", "sgd", False),
    Case("llama", "lora", "bf16-mixed", "adamw", True),
    Case("llama31-8b", "lora", "bf16-mixed", "adamw", True),  # the README's job, scaled down
    Case("llama", "lora", "bf16-mixed", "adafactor", False, packing=False),
    Case("llama", "lora", "fp32", "sgd", True, packing=False),
    Case("llama", "lora", "bf16-true", "adamw", True, contrastive=True),
    Case("llama", "full", "fp32", "adafactor", True, accum=2, contrastive=True),
    Case("moe", "lora", "bf16-mixed", "adamw", True),
    Case("moe", "full", "fp32", "adamw", False),
    Case("moe", "lora", "bf16-mixed", "adamw", False),  # the experts' adapters, not recomputed
    Case("gpt-oss", "lora", "bf16-mixed", "adamw", True),
    Case("gpt-oss", "full", "bf16-true", "sgd", False),
    Case("gemma", "lora", "bf16-mixed", "adamw", True),
    Case("gemma", "full", "bf16-true", "adafactor", False, packing=False),
    Case("llama31-8b", "lora", "bf16-mixed", "adamw", True, loss_chunks=4),  # issue 18
    Case("llama", "full", "fp32", "adamw", False, contrastive=True, loss_chunks=3),
    Case("llama31-8b", "lora", "bf16-mixed", "adamw", True, loss_chunks=4, offload=True),
    Case("llama", "full", "bf16-mixed", "adamw", True, accum=2, contrastive=True, offload=True),
    Case("llama", "full", "bf16-mixed", "adamw", True, in_backward=True),
    Case("moe", "full", "fp32", "adafactor", False, loss_chunks=2, in_backward=True),
    # issue 31: a classifier's head on the last token, LoRA with PEFT's saved head, and full
    Case("llama31-8b", "lora", "bf16-mixed", "adamw", True, packing=False, classify=True),
    Case("llama", "full", "fp32", "adamw", False, packing=False, accum=2, classify=True),
    # issue 46: preference tuning, the reference as the adapter off, a frozen copy, or none
    Case("llama31-8b", "lora", "bf16-mixed", "adamw", True, packing=False, preference="dpo"),
    Case("llama", "full", "bf16-mixed", "adamw", False, False, 2, preference="dpo"),
    Case("llama", "lora", "bf16-mixed", "adamw", True, packing=False, preference="orpo"),
    # distillation: a teacher deeper than the student, priced at its own depth
    Case("llama", "lora", "bf16-mixed", "adamw", True, distill=True),
    Case("llama31-8b", "full", "bf16-mixed", "adamw", False, accum=2, distill=True),
    Case("llama", "lora", "bf16-mixed", "adamw", True, distill=True, top_k=16),
]
MICRO, SEQ = 2, 96


def make_workdir(d: Path) -> Path:
    """The tiny models (configs and the example tokenizer) and the padded data, in `d`."""
    for name, config in MODELS.items():
        m = d / name
        m.mkdir()
        (m / "config.json").write_text(json.dumps(config))
        for f in TOKENIZER.iterdir():
            if f.name != "config.json":
                shutil.copy(f, m / f.name)
    # padded rows: one of full length and one short, so a micro-batch of both is padded
    (d / "padded.jsonl").write_text(
        json.dumps({"text": "x" * 3 * SEQ}) + "\n" + json.dumps({"text": "short row"}) + "\n"
    )
    # a classifier's rows, laid out the same way, of three classes
    (d / "labelled.jsonl").write_text("".join(
        json.dumps({"text": t, "label": c}) + "\n"
        for t, c in [("x" * 3 * SEQ, "a"), ("short row", "b"), ("y" * 3 * SEQ, "c"),
                     ("another", "a")]
    ))  # fmt: skip
    # preference pairs: a full-length chosen and a short rejected completion, and the other
    # way round, so that each micro-batch of two pairs is padded to SEQ
    (d / "pairs.jsonl").write_text("".join(
        json.dumps({"prompt": "q", "chosen": a, "rejected": b}) + "\n"
        for a, b in [("x" * 3 * SEQ, "short"), ("no", "y" * 3 * SEQ)] * 2
    ))  # fmt: skip
    _teacher(d / "teacher")
    return d


def _teacher(where: Path) -> None:
    """TEACHER's config, random weights and the tokenizer, as a teacher's directory."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    AutoModelForCausalLM.from_config(LlamaConfig(**TEACHER)).save_pretrained(where)
    for f in TOKENIZER.iterdir():
        if f.name != "config.json":
            shutil.copy(f, where / f.name)


CLASSES = 3


def make_cfg(case: Case, workdir: Path, out: Path) -> RunConfig:
    data = SPELL if case.packing else workdir / "padded.jsonl"
    if case.classify:
        data = workdir / "labelled.jsonl"
    if case.preference:
        data = workdir / "pairs.jsonl"
    base: dict[str, Any] = {
        "model": str(workdir / case.model),
        "init": "random",
        "job": {
            "task": case.task,
            **({"num_labels": CLASSES} if case.classify else {}),
            **({"preference": case.preference} if case.preference else {}),
            **({"teacher": str(workdir / "teacher")} if case.distill else {}),
            **(
                {"teacher_logits": "precomputed", "teacher_top_k": case.top_k} if case.top_k else {}
            ),
            "method": case.method,
            "precision": case.precision,
            "optimizer": case.optimizer,
            "lora_r": 8,
            "batch": MICRO,
            "seq": SEQ,
            "grad_checkpointing": case.checkpointing,
            "packing": case.packing,
            "loss": "ce+contrastive" if case.contrastive else "ce",
            "loss_chunks": case.loss_chunks,
            "offload_activations": case.offload,
            "optimizer_in_backward": case.in_backward,
        },
        "data": {"path": str(data), "val_ratio": 0},
        "training": {
            "effective_batch": MICRO * case.accum,
            "auto_micro_batch": False,
            "max_grad_norm": 0.0 if case.in_backward else 1.0,
            "loggers": ["jsonl"],
        },
        "output_dir": str(out),
    }
    return validate_run_config(base, case.id)


@dataclass
class Measured:
    peaks: np.ndarray  # (segments, categories) bytes at each segment's peak
    width: int  # tokens per row of the micro-batches


def segment_peaks(tracker: StepTracker, micro_steps: int) -> np.ndarray:
    """Category bytes at the peak of each segment, as `profile.LayerFit.peaks` reads a
    simulated trace (micro-steps past the simulated ones do not count)."""
    live, segs, micro = tracker.timeline(), tracker.segments(), tracker.micro_steps()
    out = np.zeros((len(SEGMENTS), len(CATEGORIES)))
    for k, name in enumerate(SEGMENTS):
        idx = np.flatnonzero((segs == name) & ((micro <= micro_steps) | (segs == "opt")))
        if len(idx):
            out[k] = peak_row(live, idx)
    return out


def measure(cfg: RunConfig) -> Measured:
    """Two steps of `frugal train`'s own code on CPU at the configured precision (a CPU run
    would otherwise fall back to fp32); the second, the steady state (optimizer state
    exists), recorded by the tracker."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # one process, many precisions
    try:
        return _measure(cfg)
    finally:  # leave no precision behind for whatever runs next in this process
        AcceleratorState._reset_state(True)


def _measure(cfg: RunConfig) -> Measured:
    as_configured = patch.object(recipe, "choose_precision", lambda w, sharded=False: (w, "as set"))
    with as_configured:
        run = recipe.setup(cfg)
    if run.micro != MICRO or run.accum != cfg.training.effective_batch // MICRO:
        raise AssertionError(f"the trainer chose micro-batch {run.micro} x {run.accum}")
    run.out.mkdir(parents=True, exist_ok=True)
    run_passes(run)  # the task's passes (a teacher's top k), as `recipe.start` runs them
    steps.train_step(run, 0)
    inp = steps.step_input(run, 1)
    widths = {b["input_ids"].shape[1] for b in inp.batches}
    if widths != {SEQ}:  # the data is laid out so that every row is SEQ wide
        raise AssertionError(f"rows of {widths} tokens, not {SEQ}")
    job = cfg.job  # the logits' last dimension: the vocabulary, or the classes
    tracker = StepTracker(task_of(job.task).logits_width(job, load_spec(cfg.model).config))
    hooks = tracker.watch(run.model, run.optimizer)
    if run.extra_model is not None:  # a second model the task reads: frozen weights
        hooks += tracker.watch(run.extra_model)
    try:
        with cuda_kernels(), tracking(tracker):
            steps.device_step(run, inp)
    finally:
        for h in hooks:
            h.remove()
    return Measured(segment_peaks(tracker, min(run.accum, 2)), SEQ)


def predicted(cfg: RunConfig) -> np.ndarray:
    spec = load_spec(cfg.model)
    job = cfg.job.model_copy(update={"grad_accum": cfg.training.effective_batch // MICRO})
    return get_profile(spec, job, SEQ).segment_peaks(MICRO, SEQ)


def mismatches(real: np.ndarray, sim: np.ndarray) -> Iterator[str]:
    for k, seg in enumerate(SEGMENTS):
        if not real[k].any():
            continue  # a segment this model's step does not have
        for c, cat in enumerate(CATEGORIES):
            r, s = real[k, c], sim[k, c]
            tol = 0.0 if cat in EXACT else TRANSIENT_TOL * max(r, 1.0)
            if abs(s - r) > tol + 0.5:
                rel = s / max(r, 1.0) - 1
                yield f"{seg}/{cat}: trainer {r:,.0f} B, estimate {s:,.0f} B ({rel:+.2%})"
    r_peak, s_peak = real[:, DEVICE].sum(axis=1).max(), sim[:, DEVICE].sum(axis=1).max()
    if abs(s_peak / r_peak - 1) > TRANSIENT_TOL:
        yield f"peak: trainer {r_peak:,.0f} B, estimate {s_peak:,.0f} B"


def deviations(real: np.ndarray, sim: np.ndarray) -> dict[str, float]:
    """Largest relative deviation of each category (and of the peak) over the segments."""
    out = {}
    live = [k for k in range(len(SEGMENTS)) if real[k].any()]
    for c, cat in enumerate(CATEGORIES):
        devs = [abs(sim[k, c] - real[k, c]) / max(real[k, c], 1.0) for k in live]
        out[cat] = max(devs, default=0.0)
    out["peak"] = abs(sim[:, DEVICE].sum(axis=1).max() / real[:, DEVICE].sum(axis=1).max() - 1)
    return out


def table() -> str:
    cols = [*CATEGORIES, "peak"]
    lines = [
        "| case | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    with tempfile.TemporaryDirectory() as d:
        work = make_workdir(Path(d))
        for case in CASES:
            cfg = make_cfg(case, work, Path(d) / case.id)
            dev = deviations(measure(cfg).peaks, predicted(cfg))
            cells = [f"{dev[c]:.2%}" if dev[c] else "0" for c in cols]
            lines.append(f"| {case.id} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", type=Path, help="also write the table to this markdown file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    body = table()
    print(body + f"\n({time.perf_counter() - t0:.0f} s)")
    if args.write:
        from _docs import write_block  # beside this script

        write_block(args.write, "consistency", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
