"""Ground truth on a GPU: `frugal train --dry-run` on random weights, measured beside the estimate.

For each config of the matrix, one fresh process runs a few steps of frugal's own trainer
(random weights built from a bundled config, the tiny example tokenizer, synthetic packed
text) and records what CUDA measured: `max_memory_allocated`, `max_memory_reserved`, the
device-wide memory in use at its highest (what nvidia-smi shows: total - free, read after
every step), and tokens/s after the first (warm-up) step; beside each, frugal's estimate of
the same step (same micro-batch and accumulation) and its error. A config that fails is a
row with its error; the matrix never stops early. One CSV row per config, plus the
environment (GPU, driver, library versions) in a JSON file beside it.

    python benchmarks/gpu_truth.py --out DIR [--matrix first|speed|core|long|moe|full]
        [--steps 6] [--only SUBSTR] [--warm-workers 4] [--no-dispatch]
    python benchmarks/gpu_truth.py --out DIR --smoke     # four tiny configs, CPU is enough

`--matrix first` is for a short loan of a GPU, most valuable rows first, so a run cut short
still leaves the rows that matter: on an H200 with --steps 4 --effective-batch 4 a row takes
10-30 s, the 32 rows about 11 minutes, so a 7-minute call gets two thirds of them (`--start
N` skips the first N in a second call; `--timeout 60` keeps a slow row from eating it; the
rows of minute-long steps carry their own limit).
Rows with runner "hf" run `frugal plan --emit hf`'s Trainer script of the same run
(transformers + PEFT + bitsandbytes) on random weights saved where it loads them: a plain
Trainer beside frugal's own loop. Each config's process is started, and imports, while
the one before runs; `--warm-workers` processes simulate the next configs' profiles on the
idle CPU cores.
Random weights are drawn on the GPU (frugal.run.build.random_weights_device). Runs are
dry runs and go on the books: point FRUGAL_DB_URL at a SQLite file under DIR to bring them
back for `frugal calibrate`. Where the estimator fails (a torch it was not tried with), the
measurement is kept and the error noted.

`--matrix long` (issue 18): Llama-3.1-8B QLoRA r32 at batch 1 with the plain step and the
memory techniques (--loss-chunks 16, --offload-activations, --optimizer adamw-8bit) at 16K
tokens, for the memory and tokens/s each costs, then all of them at 0.9x and 1.1x the
estimator's longest sequence on this GPU: the first should run, the second run out of memory;
and Llama-3.2-1B full fine-tuning with the optimizer after backward and in it.

`--matrix moe` (issue 42): Qwen3-30B-A3B reduced to 8 layers (LoRA with the experts'
adapters, attention only, QLoRA's 4-bit experts) and gpt-oss-20b to 6 (eager attention):
the first MoE steps measured beside their estimate; `first` carries its first three rows.

`--matrix speed` (issue 43): the rows whose pace followed the host CPU on earlier loans, each
at micro-batch 1 and 4 (the same four sequences a step), so the speed model can tell the
host's share from the GPU's: the host's dispatch is the same per micro-step at both, the
GPU's work grows with the micro-batch. Before the first row, on every matrix but the smoke,
the host's own per-op dispatch cost is measured (`dispatch_cost.py`, tiny dimensions on the
CPU, about 10 s): `host_dispatch.json` beside the CSV, and `host_us_per_op` in the
environment JSON, so the fit can tie each loan's host factor to a measurement.

Each row's `estimated_tokens_per_s` is the shipped constants' prediction, made before the
row runs and fitted on no row of this loan: on a GPU kind never measured (the catalog's
other cards), the CSV is the H200-fitted model's prediction beside the measurement
(NeuSight's test) before `benchmarks/speed_fit.py` refits with it.

Commit the CSV under benchmarks/data/ with the date and GPU in its name.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "examples" / "tiny-llama"
FIELDS = (
    "id", "model", "method", "precision", "checkpointing", "seq", "micro_batch", "grad_accum",
    "lora_r", "optimizer", "loss_chunks", "offload", "in_backward", "estimated_max_seq",
    "measured_host_gib", "estimated_host_gib",
    "measured_allocated_gib", "measured_reserved_gib", "measured_device_gib",
    "measured_tokens_per_s", "estimated_allocated_gib", "estimated_reserved_gib",
    "estimated_device_gib", "estimated_tokens_per_s", "error_allocated", "error_reserved",
    "error_device", "error_tokens_per_s", "seconds", "error", "runner",
)  # fmt: skip


@dataclass(frozen=True)
class Config:
    model: str
    method: str
    precision: str
    checkpointing: bool
    seq: int
    micro: int | None  # None: the estimator's largest micro-batch (auto_micro_batch)
    lora_r: int = 16
    optimizer: str = "adamw"
    loss_chunks: int = 0
    offload: bool = False
    in_backward: bool = False  # the optimizer in backward (one micro-batch, no clipping)
    max_seq_share: float = 0.0  # > 0: seq is this share of the estimator's longest sequence
    effective: int | None = None  # sequences per step (None: --effective-batch)
    runner: str = "frugal"  # "hf": the `--emit hf` Trainer script of the same run
    history: bool = False  # print where the memory alive after the first step was allocated
    packing: bool = True  # False: padded rows, no block-diagonal mask (the Trainer's data)
    steps: int | None = None  # dry-run steps (None: --steps); 2 for minute-long steps
    timeout: float | None = None  # seconds this config may take (None: --timeout)
    layers: int | None = None  # the bundled config reduced to this many decoder layers
    targets: str = "all-linear"  # LoRA's targets (MoE: with or without the experts)

    def job_fields(self) -> dict[str, Any]:
        """The job of this config at its micro-batch (1 when the estimator picks it)."""
        return {
            "method": self.method,
            "precision": self.precision,
            "batch": self.micro or 1,
            "seq": self.seq or 2048,
            "grad_checkpointing": self.checkpointing,
            "optimizer": self.optimizer,
            "loss_chunks": self.loss_chunks,
            "offload_activations": self.offload,
            "optimizer_in_backward": self.in_backward,
            "packing": self.packing,
            **({"lora_r": self.lora_r, "lora_targets": self.targets}
               if self.method != "full" else {}),
        }  # fmt: skip

    @property
    def id(self) -> str:
        short = self.model.split("/")[-1] + (f"-L{self.layers}" if self.layers else "")
        ckpt = "ckpt" if self.checkpointing else "nockpt"
        mb = "auto" if self.micro is None else f"mb{self.micro}"
        seq = f"s{self.seq}" if not self.max_seq_share else f"max{self.max_seq_share:g}"
        out = f"{short}-{self.method}-{self.precision}-{ckpt}-{seq}-{mb}"
        out += f"-r{self.lora_r}" if self.lora_r != 16 else ""
        out += f"-{self.optimizer}" if self.optimizer != "adamw" else ""
        out += f"-chunks{self.loss_chunks}" if self.loss_chunks else ""
        out += "-offload" if self.offload else ""
        out += "-inbwd" if self.in_backward else ""
        out += "" if self.packing else "-padded"
        out += "" if self.targets == "all-linear" else "-attn"
        return out + ("-hf" if self.runner == "hf" else "")


def matrix(name: str) -> list[Config]:
    """`core`: 16 configs, about 15 minutes on an H100; `full`: the whole cross product."""
    if name == "smoke":
        small = "HuggingFaceTB/SmolLM2-135M"
        return [
            Config(small, "lora", "fp32", False, 64, 2),
            Config(small, "lora", "fp32", True, 64, 2, loss_chunks=4, offload=True),
            Config(small, "full", "fp32", True, 64, 2, loss_chunks=4, in_backward=True),
            Config(small, "lora", "fp32", True, 64, 2, runner="hf"),
        ]
    if name == "first":
        # one lent session's calls (about 10 minutes on an H200), most valuable first: a
        # killed run still leaves its rows. The open questions of the last loans, frugal beside the
        # `--emit hf` Trainer script of the same run, the memory techniques at 16K and the
        # estimator's longest sequence, then the rows measured before (repeatability): the
        # step of each method, QLoRA through bitsandbytes, the estimator's micro-batch on
        # CUDA, fp16 loss scaling, 8-bit and paged optimizers.
        c, l1, l3, l8 = Config, "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", \
            "meta-llama/Llama-3.1-8B"  # fmt: skip
        return list(dict.fromkeys([  # the long matrix repeats the first row
            # 2026-11-26 and -27: 122 GiB allocated at micro-batch 2 after backing off from 32,
            # 76 GiB asked for directly (the second row): what the back-off run holds, by
            # line, in ID.alive.txt (the third loan's went to the call's cut output)
            c(l1, "full", "bf16-mixed", False, 8192, 32, effective=32, history=True),
            c(l1, "full", "bf16-mixed", False, 8192, 2),
            # frugal beside the Trainer: at micro-batch 1 (0.2 s micro-steps) both followed
            # the host CPU on the third loan; at 8 the GPU sets the pace
            c(l1, "lora", "bf16-mixed", True, 2048, 8, effective=8),
            c(l1, "lora", "bf16-mixed", True, 2048, 8, effective=8, runner="hf"),
            c(l1, "lora", "bf16-mixed", True, 2048, 8, effective=8, packing=False),
            c(l1, "qlora", "bf16-mixed", True, 2048, 8, effective=8),
            c(l1, "qlora", "bf16-mixed", True, 2048, 8, effective=8, runner="hf"),
            c(l1, "lora", "bf16-mixed", True, 2048, 1),
            c(l1, "qlora", "bf16-mixed", True, 2048, 1),
            *matrix("moe")[:3],  # issue 42: no MoE step has been measured yet
            *[x for x in matrix("long") if not x.max_seq_share],
            c(l8, "qlora", "bf16-mixed", True, 2048, 1),
            c(l8, "lora", "bf16-mixed", True, 2048, 1),
            c(l1, "full", "bf16-mixed", True, 2048, 1),
            c(l1, "lora", "bf16-mixed", False, 512, 1),
            c(l3, "lora", "bf16-mixed", False, 2048, 1),
            c("Qwen/Qwen3-0.6B", "lora", "bf16-mixed", True, 2048, 1),
            c(l8, "qlora", "bf16-mixed", True, 8192, 1),
            c(l1, "lora", "bf16-mixed", True, 8192, 1),
            c("HuggingFaceTB/SmolLM2-360M", "full", "bf16-mixed", False, 2048, 1),
            c(l8, "lora", "bf16-mixed", True, 2048, None, effective=16),
            c(l1, "lora", "fp16-mixed", True, 2048, 2),
            c(l3, "qlora", "bf16-mixed", True, 2048, 1, optimizer="paged-adamw-8bit"),
            c(l1, "full", "bf16-mixed", True, 2048, 2, optimizer="adamw-8bit"),
            c(l8, "lora", "bf16-true", False, 512, 1),
            c(l1, "qlora", "bf16-mixed", True, 2048, None, effective=16),
            *[x for x in matrix("long") if x.max_seq_share],
        ]))  # fmt: skip
    if name == "speed":
        # issue 43: the small steps two loans ran up to 65% apart, at micro-batch 1 and 4
        c, l1, l3, l8 = Config, "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", \
            "meta-llama/Llama-3.1-8B"  # fmt: skip
        rows = [
            (l1, "lora", True, 2048),
            (l1, "qlora", True, 2048),
            (l8, "lora", True, 2048),
            (l8, "qlora", True, 2048),
            (l3, "lora", False, 2048),
            ("Qwen/Qwen3-0.6B", "lora", True, 2048),
            ("HuggingFaceTB/SmolLM2-360M", "full", False, 2048),
            (l1, "lora", False, 512),
        ]
        return [c(m, method, "bf16-mixed", ckpt, seq, micro, effective=4)
                for m, method, ckpt, seq in rows for micro in (1, 4)]  # fmt: skip
    if name == "moe":
        # issue 42: mixtures of experts, reduced in depth to fit beside their estimate: the
        # grouped-GEMM experts with PEFT's adapters on them (LoRA), attention only, and
        # QLoRA's 4-bit experts; gpt-oss with eager attention
        q3, oss = "Qwen/Qwen3-30B-A3B", "openai/gpt-oss-20b"
        return [
            Config(q3, "lora", "bf16-mixed", True, 2048, 1, layers=8),
            Config(q3, "qlora", "bf16-mixed", True, 2048, 1, layers=8),
            Config(q3, "lora", "bf16-mixed", True, 2048, 1, layers=8,
                   targets="q_proj,k_proj,v_proj,o_proj"),
            Config(q3, "lora", "bf16-mixed", True, 2048, 4, effective=4, layers=8),
            Config(oss, "lora", "bf16-mixed", True, 2048, 1, layers=6),
            Config(oss, "qlora", "bf16-mixed", True, 2048, 1, layers=6),
        ]  # fmt: skip
    if name == "long":
        m, q = "meta-llama/Llama-3.1-8B", "qlora"
        techniques: list[dict[str, Any]] = [
            {},
            {"loss_chunks": 16},
            {"loss_chunks": 16, "offload": True},
            {"loss_chunks": 16, "offload": True, "optimizer": "adamw-8bit"},
        ]
        at_16k = [
            Config(m, q, "bf16-mixed", True, 16384, 1, 32, effective=1, **t) for t in techniques
        ]
        every = techniques[-1]
        # a step near the longest sequence takes about a minute on an H200: two of them (the
        # peaks are the first step's), and last in the first matrix
        edges = [
            Config(m, q, "bf16-mixed", True, 0, 1, 32, max_seq_share=share, effective=1,
                   steps=2, timeout=240, **every)
            for share in (0.9, 1.1)
        ]  # fmt: skip
        # full fine-tuning, gradients freed in backward: the same step after backward and in it
        full = [
            Config("meta-llama/Llama-3.2-1B", "full", "bf16-mixed", True, 2048, 4, effective=4,
                   loss_chunks=16, in_backward=b)
            for b in (False, True)
        ]  # fmt: skip
        return at_16k + edges + full
    if name == "core":
        c = Config
        return [
            c("HuggingFaceTB/SmolLM2-360M", "full", "bf16-mixed", False, 2048, 1),
            c("HuggingFaceTB/SmolLM2-360M", "full", "bf16-true", True, 2048, None),
            c("meta-llama/Llama-3.2-1B", "full", "bf16-mixed", True, 2048, 1),
            c("meta-llama/Llama-3.2-1B", "lora", "bf16-mixed", False, 512, 1),
            c("meta-llama/Llama-3.2-1B", "lora", "bf16-mixed", True, 8192, 1),
            c("meta-llama/Llama-3.2-1B", "qlora", "bf16-mixed", True, 2048, None),
            c("meta-llama/Llama-3.2-3B", "lora", "bf16-true", True, 2048, 1),
            c("meta-llama/Llama-3.2-3B", "lora", "bf16-mixed", False, 2048, 1),
            c("meta-llama/Llama-3.2-3B", "qlora", "bf16-mixed", False, 512, 1),
            c("meta-llama/Llama-3.2-3B", "qlora", "bf16-true", True, 8192, 1),
            c("meta-llama/Llama-3.1-8B", "lora", "bf16-mixed", True, 2048, 1),
            c("meta-llama/Llama-3.1-8B", "lora", "bf16-mixed", True, 2048, None),
            c("meta-llama/Llama-3.1-8B", "lora", "bf16-true", False, 512, 1),
            c("meta-llama/Llama-3.1-8B", "qlora", "bf16-mixed", True, 2048, 1),
            c("meta-llama/Llama-3.1-8B", "qlora", "bf16-mixed", True, 8192, 1),
            c("meta-llama/Llama-3.1-8B", "qlora", "bf16-true", False, 2048, 1),
        ]
    out = []
    for model in (
        "HuggingFaceTB/SmolLM2-360M",
        "meta-llama/Llama-3.2-1B",
        "meta-llama/Llama-3.2-3B",
        "meta-llama/Llama-3.1-8B",
    ):
        small = not model.endswith(("3B", "8B"))
        for method in ("full", "lora", "qlora") if small else ("lora", "qlora"):
            for precision in ("bf16-mixed", "bf16-true"):
                for ckpt in (True, False):
                    for seq in (512, 2048, 8192):
                        for micro in (1, None):
                            out.append(Config(model, method, precision, ckpt, seq, micro))
    return out


def _data(path: Path, rows: int, seq: int) -> None:
    """Synthetic text: the tiny tokenizer maps one character to one token."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz     "
    with path.open("w") as f:
        for _ in range(rows):
            text = "".join(rng.choice(letters) for _ in range(seq - 2))
            f.write(json.dumps({"text": text}) + "\n")


def _run(cfg: Config, steps: int, effective: int, work: Path, out: Path) -> dict[str, Any]:
    """One config in this (fresh) process; returns its measured and estimated figures (and
    writes what a `history` config holds after its first step to OUT/ID.alive.txt)."""
    import torch

    steps = cfg.steps or steps

    from frugal.config import validate_run_config
    from frugal.estimate.core import estimate
    from frugal.hardware.gpus import lookup_gpu
    from frugal.models.specs import load_spec
    from frugal.run import recipe, training_loop
    from frugal.run.predict import Prediction
    from frugal.step.job import make_job

    cuda = torch.cuda.is_available()
    effective = cfg.effective or effective
    gpu = lookup_gpu(torch.cuda.get_device_name()) if cuda else None
    model = cfg.model
    if cfg.layers:  # the bundled config at a reduced depth, as a local config.json
        config = {**load_spec(cfg.model).config, "num_hidden_layers": cfg.layers}
        for key in ("layer_types", "no_rope_layers"):
            if config.get(key):
                config[key] = config[key][: cfg.layers]
        (work / "model").mkdir(exist_ok=True)
        (work / "model" / "config.json").write_text(json.dumps(config))
        model = str(work / "model")
    spec = load_spec(model)
    job_fields = cfg.job_fields()
    max_seq = None
    if cfg.max_seq_share:
        max_seq = estimate(spec, make_job(**job_fields), gpu=gpu).max_seq
        if not max_seq:
            raise RuntimeError("the estimator has no longest sequence without a known GPU")
        job_fields["seq"] = int(max_seq * cfg.max_seq_share)
    seq = int(job_fields["seq"])
    data = work / "data.jsonl"
    _data(data, rows=effective * (steps + 1), seq=seq)
    run_cfg = validate_run_config(
        {
            "model": model,
            "tokenizer": str(TOKENIZER),
            "init": "random",
            "job": job_fields,
            "data": {"path": str(data), "val_ratio": 0, "epochs": 1},
            "training": {
                "effective_batch": effective,
                "auto_micro_batch": cfg.micro is None,
                "max_grad_norm": 0.0 if cfg.in_backward else 1.0,  # in backward: no clipping
                "loggers": ["jsonl"],
            },
            "output_dir": str(work / "run"),
        },
        cfg.id,
    )
    device_peak = 0.0

    def on_step(step: int, metrics: dict[str, float]) -> None:
        nonlocal device_peak
        if cuda:
            free, total = torch.cuda.mem_get_info()
            device_peak = max(device_peak, (total - free) / 2**30)
            if cfg.history and step == 1:  # a file: a call's printed output can be cut
                alive = "\n".join(_live_allocations(f"{cfg.id} alive after step 1"))
                (out / f"{cfg.id}.alive.txt").write_text(alive + "\n")
                print(alive)
            if cfg.offload:  # pinned host memory should not grow from step to step
                host = {k: v / 2**30 for k, v in torch.cuda.host_memory_stats().items()}
                active, held = (
                    host.get("active_bytes.current", 0),
                    host.get("allocated_bytes.current", 0),
                )
                pages = int(Path("/proc/self/statm").read_text().split()[1])
                rss = pages * os.sysconf("SC_PAGE_SIZE") / 2**30
                print(f"{cfg.id} step {step}: pinned host active {active:.2f} GiB, held by "
                      f"the allocator {held:.2f} GiB; process RSS {rss:.2f} GiB")  # fmt: skip

    # the measurement outlives a failing estimator (a torch it was not tried with): the
    # run's prediction and micro-batch fall back, the error is kept, the estimate is left out
    failed: list[str] = []
    real_predict, real_micro = recipe.predict, recipe.auto_micro_batch

    def guarded(real: Any, fallback: Any) -> Any:
        def call(*args: Any) -> Any:
            try:
                return real(*args)
            except Exception as e:
                failed.append(f"{real.__name__}: {type(e).__name__}: {e}"[:240])
                return fallback(*args)

        return call

    recipe.predict = training_loop.predict = guarded(real_predict, lambda *a: Prediction())
    recipe.auto_micro_batch = guarded(real_micro, lambda c, n: (1, "estimator failed"))
    if cuda and cfg.history:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    t0 = time.perf_counter()
    if cfg.runner == "hf":
        s = _train_hf(run_cfg, spec.config, work, on_step)
    else:
        s = recipe.train(run_cfg, dry_run=steps, on_step=on_step, quiet=True)
    job = run_cfg.job.model_copy(update={"batch": s.micro_batch, "grad_accum": s.grad_accum})
    try:
        est = estimate(spec, job).to_json()  # the profile the run's own prediction simulated
    except Exception as e:
        failed.append(f"estimate: {type(e).__name__}: {e}"[:240])
        est = {}
    est["tokens_per_s"] = s.predicted.tokens_per_s  # the run's prediction, for this GPU
    a = s.actual
    row = {
        "seq": seq,
        "estimated_max_seq": max_seq,
        "measured_host_gib": _pinned_peak_gib(),
        "estimated_host_gib": est.get("host_offload_gib"),
        "micro_batch": s.micro_batch,
        "grad_accum": s.grad_accum,
        "measured_allocated_gib": a.peak_allocated_gib,
        "measured_reserved_gib": a.peak_reserved_gib,
        "measured_device_gib": round(device_peak, 3) if cuda else None,
        "measured_tokens_per_s": a.tokens_per_s,
        "estimated_allocated_gib": est.get("peak_allocated_gib"),
        "estimated_reserved_gib": est.get("peak_reserved_gib"),
        "estimated_device_gib": est.get("device_total_gib"),
        "estimated_tokens_per_s": est.get("tokens_per_s"),
        "seconds": round(time.perf_counter() - t0, 1),
        "error": " | ".join(dict.fromkeys(failed)) or None,
    }
    for key in ("allocated", "reserved", "device", "tokens_per_s"):
        m = row[f"measured_{key}" if key == "tokens_per_s" else f"measured_{key}_gib"]
        e = row[f"estimated_{key}" if key == "tokens_per_s" else f"estimated_{key}_gib"]
        row[f"error_{key}"] = round(e / m - 1, 4) if m and e else None
    return row


def _train_hf(run_cfg: Any, config: dict[str, Any], work: Path, on_step: Any) -> Any:
    """The run through `frugal plan --emit hf`'s Trainer script (transformers + PEFT +
    bitsandbytes), on random weights saved where the script loads them, timed per optimizer
    step by a callback: what frugal's own loop is compared with."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback

    from frugal.plan.emit import hf_script
    from frugal.run import recipe

    j = run_cfg.job
    j = j.model_copy(update={"grad_accum": run_cfg.training.effective_batch // j.batch})
    run_cfg = run_cfg.model_copy(update={"job": j})
    weights = work / "weights"
    conf = AutoConfig.for_model(**config)
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else lambda: None
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16)
    model.save_pretrained(weights)
    del model
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for f in TOKENIZER.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            (weights / f.name).write_bytes(f.read_bytes())
    script = work / "train_hf.py"
    script.write_text(hf_script(run_cfg.model_copy(update={"model": str(weights)}), 3600.0))
    spec = importlib.util.spec_from_file_location("train_hf", script)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ends: list[float] = []
    tokens: list[int] = []

    class Timed(TrainerCallback):
        """Step end to step end, one sync a step: frugal's own window (its batches, its
        step, the one sync that reads the loss), the first step left out as warm-up."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            ends.append(time.perf_counter())
            on_step(state.global_step, {})

    class TimedTrainer(Trainer):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.add_callback(Timed())
            per_step = j.batch * j.grad_accum
            rows: Any = self.train_dataset
            tokens.append(per_step * max(len(r) for r in rows["input_ids"]))

    mod.Trainer = TimedTrainer  # type: ignore[attr-defined]
    here = Path.cwd()
    os.chdir(work)
    try:
        mod.main()
    finally:
        os.chdir(here)
    device = torch.cuda.get_device_name() if cuda else None
    peak = torch.cuda.max_memory_allocated() if cuda else None
    held = torch.cuda.max_memory_reserved() if cuda else None
    return SimpleNamespace(
        micro_batch=j.batch,
        grad_accum=j.grad_accum,
        predicted=recipe.predict(run_cfg, j.batch, j.grad_accum, device),
        actual=SimpleNamespace(
            peak_allocated_gib=round(peak / 2**30, 3) if peak is not None else None,
            peak_reserved_gib=round(held / 2**30, 3) if held is not None else None,
            tokens_per_s=round(tokens[0] * (len(ends) - 1) / (ends[-1] - ends[0]), 1)
            if len(ends) > 1
            else None,
        ),
    )


def _live_allocations(name: str, top: int = 10) -> list[str]:
    """The device memory alive now, by the Python lines that allocated it (largest first):
    what a run holds that its estimate does not, after an OOM back-off for one."""
    import torch

    by_line: dict[str, int] = {}
    for seg in torch.cuda.memory._snapshot()["segments"]:
        for block in seg["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames = [f for f in block.get("frames", ()) if f["filename"].endswith(".py")]
            where = " < ".join(
                f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames[:3]
            )
            by_line[where or "?"] = by_line.get(where or "?", 0) + block["size"]
    largest = sorted(by_line.items(), key=lambda kv: -kv[1])[:top]
    return [f"{name}: {size / 2**30:7.2f} GiB  {where}" for where, size in largest]


def _pinned_peak_gib() -> float | None:
    """Peak bytes PyTorch's pinned host allocator held (where offloaded inputs wait), GiB.

    Not its `active_bytes`: with torch 2.11 on an H200 that counted up by one step's
    offloaded inputs every step (4, 8, 12, 16 GiB) while the bytes held stayed at 4.0 GiB,
    the process's RSS stayed flat and no pinned tensor was alive between steps."""
    import torch

    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None or not torch.cuda.is_available():
        return None
    return round(stats().get("allocated_bytes.peak", 0) / 2**30, 3)


def _child(cfg: Config, steps: int, effective: int, out: Path, queue: Any, go: Any) -> None:
    """One config in a fresh process, started while the one before runs: it imports, then
    waits for its turn on the GPU (importing touches no CUDA memory)."""
    import torch
    import transformers  # noqa: F401

    import frugal.run.recipe  # noqa: F401

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        print(f"{cfg.id}: its imports made a CUDA context, counted in the running config's")
    go.wait()
    try:
        with tempfile.TemporaryDirectory() as d:
            queue.put(_run(cfg, steps, effective, Path(d), out))
    except BaseException as e:  # a failed config is a row, never the end of the matrix
        last = traceback.format_exc().strip().splitlines()[-1]
        queue.put({"error": f"{type(e).__name__}: {last}"[:300]})


def _warm(configs: list[Config], effective: int, workers: int) -> None:
    """Simulate the profiles the configs' predictions will ask for, on the CPU cores the GPU
    runs leave idle, in the order the configs run (the cache is shared: a config whose
    profile is ready reads it, one that is not simulates it itself)."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(c, effective) for c in configs
            if c.micro is not None and not c.max_seq_share and not c.layers]  # fmt: skip
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_warm_one, jobs))


def _warm_one(item: tuple[Config, int]) -> None:
    from frugal.estimate.core import get_profile
    from frugal.models.specs import load_spec
    from frugal.step.job import make_job

    cfg, effective = item
    accum = max(1, (cfg.effective or effective) // (cfg.micro or 1))
    job = make_job(**cfg.job_fields(), grad_accum=accum)
    with contextlib.suppress(Exception):  # the config's own run reports what is wrong
        get_profile(load_spec(cfg.model), job, job.seq, "gpu_truth's warm-up")


DISPATCH_MODELS = ("meta-llama/Llama-3.2-1B", "Qwen/Qwen3-0.6B")


def host_dispatch(models: tuple[str, ...] = DISPATCH_MODELS, runs: int = 5) -> dict[str, Any]:
    """This host's eager dispatch cost per op (`dispatch_cost.measure`: each model at tiny
    dimensions on the CPU, LoRA with checkpointing), and its median over the models."""
    import torch
    from dispatch_cost import measure  # beside this script

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # dispatch, not arithmetic: one thread, as the script measures
    try:
        each = {m: measure(m, "lora", runs, checkpointing=True) for m in models}
    finally:
        torch.set_num_threads(threads)
    us = sorted(r["us_per_op"] for r in each.values())
    return {"models": each, "us_per_op": us[len(us) // 2]}


def environment() -> dict[str, Any]:
    import platform
    import subprocess
    from datetime import date
    from importlib.metadata import PackageNotFoundError, version

    import torch

    env: dict[str, Any] = {"date": date.today().isoformat(), "python": platform.python_version()}
    for pkg in ("frugal-ft", "torch", "transformers", "peft", "accelerate", "bitsandbytes"):
        try:
            env[pkg] = version(pkg)
        except PackageNotFoundError:
            env[pkg] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=False,
            ).stdout.strip()  # fmt: skip
        except OSError:
            env["driver"] = None
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for the CSV and env JSON")
    ap.add_argument(
        "--matrix", default="core", choices=("first", "speed", "core", "long", "moe", "full")
    )
    ap.add_argument("--smoke", action="store_true", help="three tiny configs (CPU is enough)")
    ap.add_argument("--steps", type=int, default=6, help="dry-run steps per config")
    ap.add_argument("--effective-batch", type=int, default=16)
    ap.add_argument("--only", default="", help="run the configs whose id contains this")
    ap.add_argument("--start", type=int, default=0, help="skip the matrix's first N configs")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per config")
    ap.add_argument(
        "--warm-workers",
        type=int,
        default=4,
        help="processes simulating the next configs' profiles (0: none)",
    )
    ap.add_argument("--no-dispatch", action="store_true",
                    help="skip measuring the host's per-op dispatch cost first")  # fmt: skip
    args = ap.parse_args()
    configs = [c for c in matrix("smoke" if args.smoke else args.matrix) if args.only in c.id]
    configs = configs[args.start :]
    effective = 2 if args.smoke else args.effective_batch
    steps = 2 if args.smoke else args.steps
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    if not (args.smoke or args.no_dispatch):  # before any row: the host alone
        host = host_dispatch()
        (args.out / "host_dispatch.json").write_text(json.dumps(host, indent=1))
        env["host_us_per_op"] = host["us_per_op"]
        print(json.dumps({"host_us_per_op": host["us_per_op"]}))
    (args.out / "gpu_truth_env.json").write_text(json.dumps(env, indent=1))
    path = args.out / "gpu_truth.csv"
    ctx = mp.get_context("spawn")  # a fresh CUDA context and allocator per config
    warmer = None
    if args.warm_workers and not args.smoke:
        warmer = ctx.Process(target=_warm, args=(configs, effective, args.warm_workers))
        warmer.start()

    def start(cfg: Config) -> tuple[Any, Any, Any]:
        queue, go = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=_child, args=(cfg, steps, effective, args.out, queue, go))
        p.start()
        return p, queue, go

    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        nxt = start(configs[0]) if configs else None
        for i, cfg in enumerate(configs):
            assert nxt is not None
            p, queue, go = nxt
            go.set()
            nxt = start(configs[i + 1]) if i + 1 < len(configs) else None
            limit = cfg.timeout or args.timeout
            p.join(limit)
            if p.is_alive():
                p.kill()
                res: dict[str, Any] = {"error": f"timed out after {limit:.0f} s"}
            else:
                res = queue.get() if not queue.empty() else {"error": f"exit {p.exitcode}"}
            row = {"id": cfg.id, **asdict(cfg), **res}
            row["checkpointing"] = cfg.checkpointing
            for key in ("micro", "max_seq_share", "effective", "timeout"):
                row.pop(key, None)
            w.writerow({k: row.get(k) for k in FIELDS})
            f.flush()
            print(json.dumps({k: row.get(k) for k in FIELDS if row.get(k) is not None}))
    if warmer is not None:
        warmer.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
