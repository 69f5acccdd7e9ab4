"""The training recipe: setup → train → cleanup, read top to bottom.

One process per GPU (launched by torchrun for `job.gpus > 1`), DDP through accelerate,
transformers models, PEFT adapters, bitsandbytes for QLoRA and 8-bit optimizers on CUDA.
What the runner adds to a plain loop, and where:
- exact gradient accumulation: each micro-batch's summed token loss is divided by the token
  count of the whole optimizer step, so micro-batch 4 x accum 2 equals micro-batch 8;
- automatic micro-batch: start from the estimator's largest fitting micro-batch on CUDA; on
  OOM halve it and double accumulation (the effective batch and the maths stay the same);
  an OOM in evaluation only halves the evaluation batch;
- money: a cost meter and a budget guard that stops before the budget is crossed;
- spot safety: atomic checkpoints every `save_every_min`; SIGTERM/SIGINT → checkpoint at the
  next step boundary and exit RESUMABLE_EXIT; `resume="auto"` restores weights, optimizer,
  scheduler, RNG and the data position (a function of the step, see data.py);
- diagnostics (diagnose.py), early stopping, best-model selection, a run summary.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from frugal.errors import FrugalError
from frugal.run import checkpoint as ckpt
from frugal.run.config import RunConfig
from frugal.run.data import Row, Schedule, collate, load_examples, pack, split, unpacked
from frugal.run.diagnose import Diagnostics
from frugal.run.losses import IGNORE, causal_lm_loss, contrastive_loss
from frugal.run.meter import CostMeter, Progress, Sinks

# peft still asks transformers for is_gradient_checkpointing, deprecated in v5: not our warning
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
clock = time.monotonic  # step times, checkpoint times and dollars all read this clock
RESUMABLE_EXIT = 75  # EX_TEMPFAIL: stopped on a signal, checkpoint saved, run `--resume auto`
DEFAULT_SAVE_MIN = 30.0


@dataclass
class Run:
    """Everything `train` sets up, in one place."""

    cfg: RunConfig
    out: Path
    acc: Any  # accelerate.Accelerator
    model: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    rows: list[Row]
    val_rows: list[Row]
    schedule: Schedule
    precision: str
    precision_reason: str
    micro: int
    eval_micro: int
    total_steps: int
    notes: list[str] = field(default_factory=list)

    @property
    def world(self) -> int:
        return int(self.acc.num_processes)

    @property
    def main(self) -> bool:
        return bool(self.acc.is_main_process)

    @property
    def accum(self) -> int:
        return self.cfg.training.effective_batch // (self.micro * self.world)


# -- setup ---------------------------------------------------------------------------------


def choose_precision(wanted: str) -> tuple[str, str]:
    """The precision to run with on this hardware, and why."""
    if not torch.cuda.is_available():
        return "fp32", "no CUDA GPU: fp32 on CPU, where fp16 is unsupported and bf16 slow"
    name = torch.cuda.get_device_name()
    if wanted.startswith("bf16") and not torch.cuda.is_bf16_supported():
        return "fp16-mixed", f"{name} has no bf16: fp16-mixed with loss scaling instead"
    return wanted, f"{wanted} as configured; {name} supports it"


def _load_model(cfg: RunConfig, precision: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from frugal.models.specs import load_spec

    job = cfg.job
    tok_src = cfg.tokenizer or cfg.model
    try:
        tok = AutoTokenizer.from_pretrained(tok_src, local_files_only=True)
    except Exception as e:
        raise FrugalError(
            f"no tokenizer at {tok_src} offline ({type(e).__name__}): set tokenizer= to a "
            "directory with tokenizer files"
        ) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    kwargs: dict[str, Any] = {"attn_implementation": job.attention, "dtype": dtype}
    if job.method == "qlora":
        from transformers import BitsAndBytesConfig

        compute = torch.bfloat16 if precision.startswith("bf16") else torch.float16
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute,
        )
    if cfg.init == "random":
        spec = load_spec(cfg.model)
        conf = AutoConfig.for_model(**spec.config)
        model = AutoModelForCausalLM.from_config(conf, **kwargs)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(cfg.model, local_files_only=True, **kwargs)
        except OSError:
            raise FrugalError(
                f"no weights for {cfg.model} offline: give a local model directory with "
                "weights, or init=random to train from random weights"
            ) from None
    if len(tok) > model.get_input_embeddings().num_embeddings:
        raise FrugalError(
            f"the tokenizer has {len(tok)} tokens, the model's vocabulary "
            f"{model.get_input_embeddings().num_embeddings}: pair the model with its tokenizer"
        )
    if job.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if job.method == "full":
        return model, tok
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if job.method == "qlora":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=job.grad_checkpointing
        )
    lora = LoraConfig(
        r=job.lora_r,
        lora_alpha=job.alpha,
        lora_dropout=job.lora_dropout,
        target_modules=job.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    if job.grad_checkpointing:
        model.enable_input_require_grads()
    return model, tok


def _optimizer(cfg: RunConfig, params: list[torch.nn.Parameter]) -> Any:
    t, name = cfg.training, cfg.job.optimizer
    if name in ("adamw-8bit", "paged-adamw-8bit"):
        if not torch.cuda.is_available():
            raise FrugalError(f"job.optimizer={name} needs CUDA (bitsandbytes): use adamw on CPU")
        import bitsandbytes as bnb

        cls = bnb.optim.PagedAdamW8bit if name.startswith("paged") else bnb.optim.AdamW8bit
        return cls(params, lr=t.learning_rate, weight_decay=t.weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=t.learning_rate, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=t.learning_rate, scale_parameter=False, relative_step=False)
    return torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay)


def _auto_micro(cfg: RunConfig, per_rank: int) -> tuple[int, str]:
    """The starting micro-batch: a divisor of the rows each process reads per step."""
    want = cfg.job.batch
    why = f"job.batch={want}"
    if cfg.training.auto_micro_batch and torch.cuda.is_available():
        from frugal.estimate.core import estimate
        from frugal.models.specs import load_spec

        _, total = torch.cuda.mem_get_info()
        cap_gib = total / 2**30 * 0.92  # keep 8% spare, as the plan's margin does
        est = estimate(load_spec(cfg.model), cfg.job, gpu_memory_gib=cap_gib)
        if est.max_batch:
            want = est.max_batch
            why = f"estimator: largest micro-batch fitting {cap_gib:.1f} GiB is {want}"
    micro = max(d for d in range(1, per_rank + 1) if per_rank % d == 0 and d <= max(1, want))
    return micro, why


def setup(cfg: RunConfig, quiet: bool = False) -> Run:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    job = cfg.job
    if job.sharding != "ddp":
        raise FrugalError(
            f"job.sharding={job.sharding}: frugal train runs DDP (one full copy per GPU) for "
            "now; use job.sharding=ddp, or a method that fits one GPU (lora/qlora)"
        )
    if job.method == "qlora" and not torch.cuda.is_available():
        raise FrugalError(
            "QLoRA needs a CUDA GPU (bitsandbytes 4-bit kernels): use job.method=lora on CPU"
        )
    if not cfg.data.path:
        raise FrugalError("data.path is not set: give the training file (data.path=FILE)")
    if cfg.budget_usd is not None and not cfg.hourly_usd:
        raise FrugalError(
            "a budget needs the machine's price: run a plan's config, or give "
            "--price-per-hour USD (price_per_hour_usd=...)"
        )
    precision, reason = choose_precision(job.precision)
    mixed = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(precision, "no")
    acc = Accelerator(mixed_precision=mixed, cpu=not torch.cuda.is_available())
    if acc.num_processes != job.gpus:
        raise FrugalError(
            f"job.gpus={job.gpus} but {acc.num_processes} processes were launched: "
            "let `frugal train` launch them (no torchrun of your own)"
        )
    set_seed(cfg.training.seed)
    model, tok = _load_model(cfg, precision)

    examples = load_examples(cfg.data.path, tok, job.seq, cfg.data.format)
    if cfg.data.val_path:
        train_ex, val_ex = examples, load_examples(cfg.data.val_path, tok, job.seq, cfg.data.format)
    else:
        train_ex, val_ex = split(examples, cfg.data.val_ratio, cfg.training.seed)
    pad = tok.pad_token_id

    def to_rows(ex: list[Any]) -> list[Row]:
        return pack(ex, job.seq, pad) if cfg.data.packing else unpacked(ex)

    rows, val_rows = to_rows(train_ex), to_rows(val_ex)
    sched_data = Schedule(
        len(rows), cfg.training.effective_batch, cfg.data.epochs, cfg.training.seed
    )
    total = sched_data.total_steps
    if cfg.training.max_steps:
        total = min(total, cfg.training.max_steps)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(cfg, params)
    from transformers import get_scheduler

    name = {"constant": "constant_with_warmup"}.get(cfg.training.schedule, cfg.training.schedule)
    scheduler = get_scheduler(
        name,
        optimizer,
        num_warmup_steps=math.ceil(cfg.training.warmup_ratio * total),
        num_training_steps=total,
    )
    model, optimizer = acc.prepare(model, optimizer)
    per_rank = cfg.training.effective_batch // acc.num_processes
    micro, why = _auto_micro(cfg, per_rank)
    out = Path(cfg.output_dir)
    run = Run(
        cfg=cfg, out=out, acc=acc, model=model, tokenizer=tok, optimizer=optimizer,
        scheduler=scheduler, rows=rows, val_rows=val_rows, schedule=sched_data,
        precision=precision, precision_reason=reason, micro=micro, eval_micro=micro,
        total_steps=total, notes=[f"micro-batch {micro}: {why}"],
    )  # fmt: skip
    return run


# -- one optimizer step ------------------------------------------------------------------------


def _forward(model: Any, batch: dict[str, torch.Tensor], hidden: bool) -> Any:
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "segment_ids")}
    return model(**inputs, output_hidden_states=hidden, use_cache=False)


def _segments_with_pairs(labels: torch.Tensor, segments: torch.Tensor) -> int:
    """Segments with at least two trained tokens: the contrastive term's count."""
    n = 0
    for lab, seg in zip(labels, segments, strict=True):
        ids = seg[lab != IGNORE]
        if ids.numel():
            n += int((torch.bincount(ids) >= 2).sum())
    return n


def _global_sum(run: Run, *values: float | torch.Tensor) -> list[float]:
    """Sums over all processes of scalars (or of one stacked tensor)."""
    if len(values) == 1 and isinstance(values[0], torch.Tensor):
        t = values[0].to(torch.float64)
    else:
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=run.acc.device)
    if run.world > 1:
        t = run.acc.reduce(t, reduction="sum")
    return [float(x) for x in t.tolist()]


def train_step(run: Run, step: int) -> dict[str, float]:
    cfg, acc, model = run.cfg, run.acc, run.model
    contrastive = cfg.training.loss == "ce+contrastive"
    ids = list(run.schedule.micro_batches(step, acc.process_index, run.world, run.micro))
    batches = [
        collate([run.rows[i] for i in b], run.tokenizer.pad_token_id, cfg.data.packing) for b in ids
    ]
    local_tok = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in batches)
    local_seg = (
        sum(_segments_with_pairs(b["labels"], b["segment_ids"]) for b in batches)
        if (contrastive)
        else 0
    )
    n_tok, n_seg = _global_sum(run, local_tok, local_seg)
    # DDP averages gradients over processes; scaling by world makes that average a global sum
    ce_scale = run.world / max(n_tok, 1.0)
    cl_scale = run.world * cfg.training.contrastive_weight / max(n_seg, 1.0)
    model.train()
    zero = torch.zeros((), device=acc.device)
    ce_total, cl_total = zero.clone(), zero.clone()  # on the device: no sync per micro-batch
    real_tokens = 0
    for i, b in enumerate(batches):
        real_tokens += int((b["segment_ids"] > 0).sum())  # still on the CPU
        b = {k: v.to(acc.device, non_blocking=True) for k, v in b.items()}
        sync = contextlib.nullcontext() if i == len(batches) - 1 else acc.no_sync(model)
        with sync, acc.autocast():
            out = _forward(model, b, contrastive)
            ce_sum, _ = causal_lm_loss(out.logits, b["labels"])
            loss = ce_sum * ce_scale
            if contrastive:
                cl_sum, _ = contrastive_loss(
                    out.hidden_states[-1],
                    b["labels"],
                    b["segment_ids"],
                    cfg.training.contrastive_margin,
                )
                loss = loss + cl_sum * cl_scale
                cl_total += cl_sum.detach()
            acc.backward(loss)
        ce_total += ce_sum.detach()
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.training.max_grad_norm > 0:
        norm = acc.clip_grad_norm_(params, cfg.training.max_grad_norm)
    else:
        grads = [torch.linalg.vector_norm(p.grad) for p in params if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack(grads)) if grads else zero
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    # one transfer (and one all-reduce) per step; the norm is the same on every process
    stats = torch.stack([ce_total, cl_total, zero + real_tokens, norm.to(zero) / run.world])
    ce_g, cl_g, tok_g, norm_g = _global_sum(run, stats)
    m = {
        "loss": ce_g / max(n_tok, 1.0),
        "grad_norm": norm_g,
        "tokens": tok_g,
        "lr": float(run.scheduler.get_last_lr()[0]),
    }
    if contrastive:
        m["contrastive_loss"] = cl_g / max(n_seg, 1.0)
    return m


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def _free_memory(run: Run) -> None:
    run.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluate(run: Run) -> float | None:
    """Mean token loss on the validation rows; an OOM halves only the evaluation batch."""
    if not run.val_rows:
        return None
    model, acc = run.model, run.acc
    mine = list(range(acc.process_index, len(run.val_rows), run.world))
    while True:
        try:
            model.eval()
            total = count = 0.0
            with torch.no_grad():
                for i in range(0, len(mine), run.eval_micro):
                    rows = [run.val_rows[j] for j in mine[i : i + run.eval_micro]]
                    b = collate(rows, run.tokenizer.pad_token_id, run.cfg.data.packing)
                    b = {k: v.to(acc.device) for k, v in b.items()}
                    with acc.autocast():
                        s, n = causal_lm_loss(_forward(model, b, False).logits, b["labels"])
                    total, count = total + float(s), count + float(n)
            total, count = _global_sum(run, total, count)
            return total / max(count, 1.0)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e) or run.eval_micro == 1:
                raise
            _free_memory(run)
            run.eval_micro //= 2
            run.notes.append(f"evaluation OOM: evaluation batch now {run.eval_micro}")


# -- checkpoints -------------------------------------------------------------------------------


def _state(run: Run, step: int, meter: CostMeter, book: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": step,
        "spent_usd": meter.spent_usd(),
        "elapsed_s": meter.elapsed_s(),
        "micro_batch": run.micro,
        "world": run.world,
        **book,
    }


def save_checkpoint(run: Run, step: int, meter: CostMeter, book: dict[str, Any]) -> None:
    """Every process sends its RNG state; the main process writes the checkpoint."""
    rngs = [ckpt.rng_state()]
    if run.world > 1:
        import torch.distributed as dist

        gathered: list[Any] = [None] * run.world
        dist.all_gather_object(gathered, rngs[0])
        rngs = gathered
    if run.main:
        unwrapped = run.acc.unwrap_model(run.model)

        def write(tmp: Path) -> None:
            from safetensors.torch import save_file

            save_file(ckpt.trainable_state(unwrapped), str(tmp / "trainable.safetensors"))
            torch.save(run.optimizer.state_dict(), tmp / "optimizer.pt")
            scaler = run.acc.scaler.state_dict() if run.acc.scaler is not None else None
            torch.save(
                {"scheduler": run.scheduler.state_dict(), "scaler": scaler}, tmp / "scheduler.pt"
            )
            for r, state in enumerate(rngs):
                torch.save(state, tmp / f"rng-{r}.pt")

        best = run.out / "best"
        ckpt.save(
            run.out / "checkpoints",
            step,
            write,
            _state(run, step, meter, book),
            run.cfg.training.keep_checkpoints,
            protect=best if best.exists() else None,
        )
    run.acc.wait_for_everyone()


def restore(run: Run, path: Path) -> dict[str, Any]:
    state = ckpt.read_state(path)
    ckpt.load_trainable(run.acc.unwrap_model(run.model), path / "trainable.safetensors")
    run.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    sched = torch.load(path / "scheduler.pt", weights_only=False)
    run.scheduler.load_state_dict(sched["scheduler"])
    if sched["scaler"] is not None and run.acc.scaler is not None:
        run.acc.scaler.load_state_dict(sched["scaler"])
    rng = path / f"rng-{run.acc.process_index}.pt"
    if state.get("world") == run.world and rng.exists():
        ckpt.set_rng_state(torch.load(rng, weights_only=False))
    else:
        run.notes.append("resumed on a different number of processes: RNG streams reseeded")
    per_rank = run.cfg.training.effective_batch // run.world
    micro = int(state.get("micro_batch", run.micro))
    if per_rank % micro == 0:
        run.micro = min(run.micro, micro)  # keep an OOM back-off across the restart
    return state


def _save_best(run: Run) -> None:
    if not run.main:
        return
    from safetensors.torch import save_file

    best = run.out / "best"
    tmp = run.out / ".tmp-best"
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(
        ckpt.trainable_state(run.acc.unwrap_model(run.model)), str(tmp / "trainable.safetensors")
    )
    old = run.out / ".old-best"
    if best.exists():
        best.rename(old)
    tmp.rename(best)
    if old.exists():
        import shutil

        shutil.rmtree(old)


# -- the loop ----------------------------------------------------------------------------------


class _Stop:
    """Set by SIGTERM/SIGINT; acted on at the next step boundary."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.old: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        for s in (signal.SIGTERM, signal.SIGINT):
            self.old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signal = signum

    def __exit__(self, *exc: Any) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


def train(
    cfg: RunConfig,
    resume: str = "auto",
    dry_run: int | None = None,
    on_step: Any = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run `cfg`; returns the run summary (also written to run_summary.json).
    resume: "auto" (newest complete checkpoint, if any), "never", or a checkpoint path."""
    run = setup(cfg, quiet)
    t = cfg.training
    out = run.out
    total = run.total_steps
    if dry_run:
        total = min(total, dry_run)
    step = 0
    book: dict[str, Any] = {"best_eval": None, "best_step": None, "bad_evals": 0, "tokens": 0.0}
    spent0 = elapsed0 = 0.0
    source = None
    if resume not in ("auto", "never"):
        source = Path(resume)
        if not ckpt.is_complete(source):
            raise FrugalError(f"--resume {resume}: not a complete checkpoint")
    elif resume == "auto" and not dry_run:
        source = ckpt.latest(out / "checkpoints")
    if source is None and ckpt.complete(out / "checkpoints"):
        raise FrugalError(
            f"{out} already holds a run with checkpoints: continue it with --resume auto, or "
            "set output_dir to a new directory (nothing there was changed)"
        )
    if source is not None:
        state = restore(run, source)
        step = int(state["step"])
        spent0, elapsed0 = float(state["spent_usd"]), float(state["elapsed_s"])
        book.update({k: state[k] for k in book if k in state})
        run.notes.append(f"resumed from {source.name} (step {step})")
        if run.main:
            _truncate_metrics(out / "metrics.jsonl", step)
    if run.main:
        out.mkdir(parents=True, exist_ok=True)
        cfg.write(out / "config.yaml")  # the resolved config, beside every output
    meter = CostMeter(cfg.hourly_usd, cfg.budget_usd, spent0, elapsed0, clock=lambda: clock())
    sinks = Sinks(out, t.loggers, cfg.model_dump(mode="json")) if run.main else None
    progress = Progress(total, enabled=run.main and not quiet)
    progress.print(f"precision: {run.precision} ({run.precision_reason})")
    for n in run.notes:
        progress.print(n)
    diag = Diagnostics(t.learning_rate, run.precision, t.max_grad_norm)
    findings: list[dict[str, Any]] = []
    save_every_s = 60 * (t.save_every_min or _plan_interval(cfg) or DEFAULT_SAVE_MIN)
    # a clean stop writes a checkpoint and the final weights: guess their time from the bytes
    # until the first checkpoint has been timed (1 GB/s disk, 50 ms of fixed cost)
    trainable = sum(p.numel() * p.element_size() for p in run.model.parameters() if p.requires_grad)
    last_save, save_s = clock(), 0.02 + 3 * trainable / 1e9
    step_times: list[float] = []
    planned_step_s = _planned_step_s(cfg)
    outcome, reason = "completed", f"reached {total} steps"
    peak_alloc = peak_res = 0.0
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start_step = step

    def save(at: int) -> None:
        nonlocal save_s, last_save
        t0 = clock()
        save_checkpoint(run, at, meter, book)
        save_s, last_save = clock() - t0, clock()

    with _Stop() as stop:
        while step < total:
            # the guards plan for a slow step: the slowest of the last ten (the first step,
            # with its warm-up, only while it is the only one), or the plan's before any
            slowest = max(
                step_times[-10:] if len(step_times) < 2 else step_times[1:][-10:],
                default=planned_step_s,
            )
            flags = _global_sum(
                run,
                float(stop.signal is not None),
                float(meter.would_exceed(slowest, 2 * save_s)),  # checkpoint + final weights
                float(
                    t.max_time_min is not None and meter.elapsed_s() + slowest > 60 * t.max_time_min
                ),
            )
            if flags[0]:
                outcome, reason = "preempted", f"signal {stop.signal or 'on another process'}"
                break
            if flags[1]:
                outcome = "budget-stopped"
                reason = f"the next step would cross the ${cfg.budget_usd:,.2f} budget"
                break
            if flags[2]:
                reason = f"max_time_min={t.max_time_min} reached"
                break
            t0 = clock()
            try:
                m = train_step(run, step)
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not _is_oom(e) or run.world > 1:
                    raise
                _free_memory(run)
                if run.micro == 1:
                    raise FrugalError(
                        "out of memory at micro-batch 1: turn on job.grad_checkpointing, "
                        "lower job.seq, or use job.method=qlora / a bigger GPU"
                    ) from None
                run.micro = max(
                    d
                    for d in range(1, run.micro)
                    if (t.effective_batch // run.world) % d == 0 and d <= run.micro // 2
                )
                progress.print(
                    f"OOM: micro-batch now {run.micro}, gradient accumulation {run.accum}"
                )
                continue
            dt = clock() - t0
            step += 1
            step_times = [*step_times, dt][-50:]
            book["tokens"] += m["tokens"]
            m.update(
                tokens_per_s=m["tokens"] / dt,
                step_time_s=dt,
                micro_batch=run.micro,
                grad_accum=run.accum,
                spent_usd=round(meter.spent_usd(), 6),
            )
            if torch.cuda.is_available():
                peak_alloc = max(peak_alloc, torch.cuda.max_memory_allocated() / 2**30)
                peak_res = max(peak_res, torch.cuda.max_memory_reserved() / 2**30)
                m.update(peak_allocated_gib=peak_alloc, peak_reserved_gib=peak_res)
            new = diag.on_step(step, m["loss"], m["grad_norm"])
            due = (t.eval_every and step % t.eval_every == 0) or step == total
            if due and not dry_run:
                ev = evaluate(run)
                if ev is not None:
                    m["eval_loss"] = ev
                    new += diag.on_eval(step, ev, None)
                    if book["best_eval"] is None or ev < book["best_eval"]:
                        book.update(best_eval=ev, best_step=step, bad_evals=0)
                        _save_best(run)
                    else:
                        book["bad_evals"] += 1
            if sinks and (step % t.log_every == 0 or step == total):
                sinks.log(step, m)
            for f in new:
                findings.append({"kind": f.kind, "step": f.step, "message": f.message})
                progress.print(f"[yellow]diagnostic:[/] {f.message}")
            progress.update(step, m, meter, dt)
            if on_step is not None:
                on_step(step, m)
            if any(f.fatal for f in new):
                outcome, reason = "failed", new[-1].message
                break
            patience = t.early_stopping_patience
            if patience and book["bad_evals"] >= patience:
                reason = f"early stopping: {patience} evaluations without improvement"
                break
            if not dry_run and step < total and clock() - last_save >= save_every_s:
                save(step)
    progress.close()
    if not dry_run and outcome != "failed":
        save(step)
    summary = _finish(
        run,
        step,
        start_step,
        total,
        outcome,
        reason,
        meter,
        book,
        findings,
        step_times,
        peak_alloc,
        peak_res,
        dry_run,
    )
    if sinks:
        for n in sinks.notes:
            progress.print(n)
        sinks.close()
    return summary


def _planned_step_s(cfg: RunConfig) -> float:
    p = cfg.plan
    if p is None or not p.tokens_per_s:
        return 0.0
    return cfg.training.effective_batch * cfg.job.seq / p.tokens_per_s


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines logged after the checkpoint a run resumes from."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if json.loads(ln).get("step", 0) <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(ln + "\n" for ln in keep))
    tmp.replace(path)


def _plan_interval(cfg: RunConfig) -> float | None:
    return cfg.plan.checkpoint_interval_min if cfg.plan else None


# -- cleanup -----------------------------------------------------------------------------------


def _export(run: Run, book: dict[str, Any]) -> dict[str, str]:
    """The adapter (or the full model) in HF format, from the best evaluation if there was
    one; with training.merge, the adapter merged into the model as well."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress line is enough
    model = run.acc.unwrap_model(run.model)
    best = run.out / "best" / "trainable.safetensors"
    if book.get("best_step") is not None and best.exists():
        ckpt.load_trainable(model, best)
    final = run.out / "final"
    tmp = run.out / ".tmp-final"
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp), safe_serialization=True)
    run.tokenizer.save_pretrained(str(tmp))
    if final.exists():
        import shutil

        shutil.rmtree(final)
    tmp.rename(final)
    outputs = {"adapter" if run.cfg.job.method != "full" else "model": str(final)}
    if run.cfg.training.merge and run.cfg.job.method != "full":
        merged = model.merge_and_unload()
        merged.save_pretrained(str(run.out / "merged"), safe_serialization=True)
        run.tokenizer.save_pretrained(str(run.out / "merged"))
        outputs["merged"] = str(run.out / "merged")
    return outputs


def _predicted(cfg: RunConfig, micro: int) -> dict[str, Any]:
    """What the plan (or, on CUDA, the estimator for this GPU) predicted."""
    pred: dict[str, Any] = {}
    if cfg.plan:
        p = cfg.plan
        pred.update(
            hours=p.est_hours,
            cost_usd=p.est_cost_usd,
            tokens_per_s=p.tokens_per_s,
            peak_reserved_gib=p.peak_reserved_gib,
            gpu=p.gpu,
        )
    if torch.cuda.is_available():
        from frugal.estimate.core import estimate
        from frugal.hardware.gpus import lookup_gpu
        from frugal.models.specs import load_spec

        job = cfg.job.model_copy(update={"batch": micro, "gpus": 1})
        gpu = lookup_gpu(torch.cuda.get_device_name())
        est = estimate(load_spec(cfg.model), job, gpu=gpu, gpu_memory_gib=None if gpu else 1e9)
        pred.update(
            peak_allocated_gib=round(est.memory.peak_allocated / 2**30, 3),
            peak_reserved_gib=round(est.memory.peak_reserved / 2**30, 3),
        )
        if est.tokens_per_s:
            pred["tokens_per_s"] = round(est.tokens_per_s * cfg.job.gpus, 1)
    return pred


def _finish(
    run: Run,
    step: int,
    start: int,
    total: int,
    outcome: str,
    reason: str,
    meter: CostMeter,
    book: dict[str, Any],
    findings: list[dict[str, Any]],
    step_times: list[float],
    peak_alloc: float,
    peak_res: float,
    dry_run: int | None,
) -> dict[str, Any]:
    cfg = run.cfg
    outputs: dict[str, str] = {}
    if run.main and not dry_run and outcome in ("completed", "budget-stopped"):
        outputs = _export(run, book)
    typical = sorted(step_times)[len(step_times) // 2] if step_times else None
    tokens_step = cfg.training.effective_batch * cfg.job.seq if cfg.data.packing else None
    actual: dict[str, Any] = {
        "hours": round(meter.elapsed_s() / 3600, 5),
        "cost_usd": round(meter.spent_usd(), 4),
        "tokens": int(book["tokens"]),
        "step_time_s": typical,
        "tokens_per_s": round(book["tokens"] / max(sum(step_times), 1e-9), 1)
        if step_times
        else None,
    }
    if torch.cuda.is_available():
        actual.update(peak_allocated_gib=round(peak_alloc, 3), peak_reserved_gib=round(peak_res, 3))
    summary = {
        "outcome": outcome,
        "reason": reason,
        "resumable": outcome == "preempted",
        "steps": step,
        "total_steps": total,
        "steps_this_session": step - start,
        "micro_batch": run.micro,
        "grad_accum": run.accum,
        "effective_batch": cfg.training.effective_batch,
        "tokens_per_step": tokens_step,
        "precision": run.precision,
        "precision_reason": run.precision_reason,
        "predicted": _predicted(cfg, run.micro),
        "actual": actual,
        "budget_usd": cfg.budget_usd,
        "best_eval_loss": book["best_eval"],
        "best_step": book["best_step"],
        "outputs": outputs,
        "diagnostics": findings,
        "notes": run.notes,
    }
    if run.main:
        name = "dry_run.json" if dry_run else "run_summary.json"
        tmp = run.out / f".{name}.tmp"
        tmp.write_text(json.dumps(summary, indent=1))
        tmp.replace(run.out / name)
        if dry_run:
            from frugal.calibration import record_measurement

            record_measurement(
                {"kind": "dry_run", "model": cfg.model, "job": cfg.job.model_dump(), **summary}
            )
    return summary
