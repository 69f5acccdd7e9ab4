"""The training recipe: setup → train → cleanup, read top to bottom.

One process per GPU (launched by torchrun for `job.gpus > 1`), DDP through accelerate or
PyTorch FSDP (`job.sharding=fsdp`), transformers models, PEFT adapters, bitsandbytes for
QLoRA and 8-bit optimizers on CUDA.
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

import gc
import json
import math
import shutil
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from frugal.calibration import record_measurement
from frugal.config import RunConfig
from frugal.data.examples import Batcher, Row, Schedule, load_examples, pack, split, unpacked
from frugal.errors import RESUMABLE_EXIT as RESUMABLE_EXIT  # the runner's exit code
from frugal.errors import FrugalError
from frugal.estimate.core import get_profile, memory_at
from frugal.estimate.throughput import step_time
from frugal.files import write_text_atomic
from frugal.hardware.gpus import lookup_gpu
from frugal.models.specs import load_spec
from frugal.plan.spot import DEFAULT_CHECKPOINT_MIN
from frugal.run import checkpoint as ckpt
from frugal.run.build import (
    auto_micro_batch,
    choose_precision,
    load_model,
    make_optimizer,
    refuse_unsupported,
    shard,
)
from frugal.run.diagnose import Diagnostics
from frugal.run.meter import CostMeter, Progress, Sinks
from frugal.step.loop import Loss, Sums, forward, optimizer_step
from frugal.step.loss import IGNORE, causal_lm_loss

# peft still asks transformers for is_gradient_checkpointing, deprecated in v5: not our warning
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
# the distributed checkpoint API says so each time it runs in one process: that is intended
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
clock = time.monotonic  # step times, checkpoint times and dollars all read this clock


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
    batches: Batcher  # the training rows
    val_batches: Batcher  # the validation rows
    schedule: Schedule
    precision: str
    precision_reason: str
    micro: int
    eval_micro: int
    total_steps: int
    params: list[Any]  # the trainable parameters
    sharded: bool  # FSDP: every process holds a shard of each weight
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

    @property
    def unwrapped(self) -> Any:
        """The model itself (DDP's wrapper removed; an FSDP model is not wrapped)."""
        return self.acc.unwrap_model(self.model)

    @property
    def inner_optimizer(self) -> Any:
        """The torch optimizer (accelerate's wrapper removed)."""
        return getattr(self.optimizer, "optimizer", self.optimizer)


# -- setup ---------------------------------------------------------------------------------


def setup(cfg: RunConfig) -> Run:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    job = cfg.job
    refuse_unsupported(cfg)
    sharded = job.sharding == "fsdp" and job.gpus > 1
    precision, reason = choose_precision(job.precision, sharded)
    mixed = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(precision, "no")
    acc = Accelerator(mixed_precision=mixed, cpu=not torch.cuda.is_available())
    if acc.num_processes != job.gpus:
        raise FrugalError(
            f"job.gpus={job.gpus} but {acc.num_processes} processes were launched: "
            "let `frugal train` launch them (no torchrun of your own)"
        )
    set_seed(cfg.training.seed)
    model, tok = load_model(cfg, precision, empty=sharded and not acc.is_main_process)

    assert cfg.data.path  # refuse_unsupported checked it
    examples = load_examples(cfg.data.path, tok, job.seq, cfg.data.format)
    if cfg.data.val_path:
        train_ex, val_ex = examples, load_examples(cfg.data.val_path, tok, job.seq, cfg.data.format)
    else:
        train_ex, val_ex = split(examples, cfg.data.val_ratio, cfg.training.seed)
    pad = tok.pad_token_id

    def to_rows(ex: list[Any]) -> list[Row]:
        return pack(ex, job.seq, pad) if cfg.job.packing else unpacked(ex)

    rows, val_rows = to_rows(train_ex), to_rows(val_ex)
    sched_data = Schedule(
        len(rows), cfg.training.effective_batch, cfg.data.epochs, cfg.training.seed
    )
    total = sched_data.total_steps
    if cfg.training.max_steps:
        total = min(total, cfg.training.max_steps)

    if sharded:
        model = shard(model, acc.device, acc.is_main_process)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(cfg, params)
    from transformers import get_scheduler

    name = {"constant": "constant_with_warmup"}.get(cfg.training.schedule, cfg.training.schedule)
    scheduler = get_scheduler(
        name,
        optimizer,
        num_warmup_steps=math.ceil(cfg.training.warmup_ratio * total),
        num_training_steps=total,
    )
    if sharded:
        optimizer = acc.prepare(optimizer)  # the model is already distributed
    else:
        model, optimizer = acc.prepare(model, optimizer)
        # the step autocasts itself (frugal.step.loop), as the estimate does; accelerate's
        # forward wrapper would also copy every output (all logits) to fp32
        acc.unwrap_model(model, keep_fp32_wrapper=False)
    per_rank = cfg.training.effective_batch // acc.num_processes
    micro, why = auto_micro_batch(cfg, per_rank)
    out = Path(cfg.output_dir)
    run = Run(
        cfg=cfg, out=out, acc=acc, model=model, tokenizer=tok, optimizer=optimizer,
        scheduler=scheduler, batches=Batcher(rows, pad, cfg.job.packing),
        val_batches=Batcher(val_rows, pad, cfg.job.packing), schedule=sched_data,
        precision=precision, precision_reason=reason, micro=micro, eval_micro=micro,
        total_steps=total, params=params, sharded=sharded,
        notes=[f"micro-batch {micro}: {why}"],
    )  # fmt: skip
    return run


# -- one optimizer step ------------------------------------------------------------------------


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


@dataclass
class StepInput:
    """One step's micro-batches on the host and the counts that scale their losses."""

    batches: list[dict[str, torch.Tensor]]
    tokens: float  # trained tokens of the whole step, all processes
    segments: float  # segments with a contrastive pair, all processes
    real_tokens: int  # this process's tokens that are not padding


def step_input(run: Run, step: int) -> StepInput:
    contrastive = run.cfg.job.loss == "ce+contrastive"
    ids = run.schedule.micro_batches(step, run.acc.process_index, run.world, run.micro)
    batches = [run.batches(b) for b in ids]
    local_tok = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in batches)
    local_seg = (
        sum(_segments_with_pairs(b["labels"], b["segment_ids"]) for b in batches)
        if contrastive
        else 0
    )
    n_tok, n_seg = _global_sum(run, local_tok, local_seg)
    real = sum(int((b["segment_ids"] > 0).sum()) for b in batches)
    return StepInput(batches, n_tok, n_seg, real)


def device_step(run: Run, inp: StepInput) -> Sums:
    """The step itself (`frugal.step.loop.optimizer_step`, what the estimate simulates)."""
    t = run.cfg.training
    run.model.train()
    # DDP and FSDP average gradients over processes; scaling by world makes it a global sum
    return optimizer_step(
        run.model,
        run.optimizer,
        run.params,
        inp.batches,
        run.acc,
        Loss(run.cfg.job.loss == "ce+contrastive", t.contrastive_weight, t.contrastive_margin),
        ce_scale=run.world / max(inp.tokens, 1.0),
        cl_scale=run.world / max(inp.segments, 1.0),
        max_grad_norm=t.max_grad_norm,
        reduce_each=run.sharded,  # FSDP: no process ever holds more than its gradient shard
    )


def train_step(run: Run, step: int) -> dict[str, float]:
    inp = step_input(run, step)
    sums = device_step(run, inp)
    skipped = bool(getattr(run.optimizer, "step_was_skipped", False))  # fp16 overflow
    if not skipped:
        run.scheduler.step()
    norm = ckpt.whole(sums.grad_norm)  # under FSDP a distributed tensor of the shards' norms
    # one transfer (and one all-reduce) per step; the norm is the same on every process
    real = torch.full_like(sums.ce, inp.real_tokens)
    stats = torch.stack([sums.ce, sums.cl, real, norm.to(sums.ce) / run.world])
    ce_g, cl_g, tok_g, norm_g = _global_sum(run, stats)
    m = {
        "loss": ce_g / max(inp.tokens, 1.0),
        "grad_norm": norm_g,
        "tokens": tok_g,
        "lr": float(run.scheduler.get_last_lr()[0]),
    }
    if run.cfg.job.loss == "ce+contrastive":
        m["contrastive_loss"] = cl_g / max(inp.segments, 1.0)
    if skipped:
        m["skipped"] = 1.0
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
    if not len(run.val_batches):
        return None
    # the unwrapped model: DDP's forward would wait for processes that have no rows left.
    # FSDP gathers each layer from all processes, so all run the same number of forwards:
    # a process out of rows runs one on row 0 and does not count it.
    model, acc = run.unwrapped, run.acc
    n_rows = len(run.val_batches)
    mine = list(range(acc.process_index, n_rows, run.world))
    while True:
        try:
            model.eval()
            total = count = 0.0
            m = run.eval_micro
            chunks = [mine[i : i + m] for i in range(0, len(mine), m)]
            if run.sharded:
                chunks += [[]] * (math.ceil(math.ceil(n_rows / run.world) / m) - len(chunks))
            with torch.no_grad():
                for rows in chunks:
                    b = run.val_batches(rows or [0])
                    b = {k: v.to(acc.device) for k, v in b.items()}
                    with acc.autocast():
                        s, n = causal_lm_loss(forward(model, b).logits, b["labels"])
                    if rows:
                        total, count = total + float(s), count + float(n)
            total, count = _global_sum(run, total, count)
            return total / max(count, 1.0)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e):
                raise
            if run.eval_micro == 1 or run.world > 1:
                raise FrugalError(
                    "out of memory in evaluation: lower job.batch, or data.val_ratio / "
                    "training.eval_every=0 to evaluate less"
                ) from None
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
        "run_key": _run_key(run),
        **book,
    }


def save_checkpoint(run: Run, step: int, meter: CostMeter, book: dict[str, Any]) -> None:
    """Every process writes its part of the weights and optimizer state and sends its RNG
    state; the main process writes the rest and commits the checkpoint."""
    root = run.out / "checkpoints"
    tmp = ckpt.begin(root, step) if run.main else ckpt.staging(root, step)
    run.acc.wait_for_everyone()  # the staging directory exists, and is empty
    ckpt.save_tensors(tmp / "tensors", run.unwrapped, run.inner_optimizer)
    rngs = [ckpt.rng_state()]
    if run.world > 1:
        import torch.distributed as dist

        gathered: list[Any] = [None] * run.world
        dist.all_gather_object(gathered, rngs[0])  # also: every process's shard is written
        rngs = gathered
    if run.main:
        scaler = run.acc.scaler.state_dict() if run.acc.scaler is not None else None
        torch.save(
            {"scheduler": run.scheduler.state_dict(), "scaler": scaler}, tmp / "scheduler.pt"
        )
        for r, state in enumerate(rngs):
            torch.save(state, tmp / f"rng-{r}.pt")
        ckpt.commit(tmp, _state(run, step, meter, book), run.cfg.training.keep_checkpoints)
    run.acc.wait_for_everyone()


def _load(path: Path) -> Any:
    """A checkpoint file, onto the CPU first (not every process's state onto GPU 0)."""
    return torch.load(path, map_location="cpu", weights_only=False)


def restore(run: Run, path: Path) -> dict[str, Any]:
    state = ckpt.read_state(path)
    if not (path / "tensors").is_dir():
        raise FrugalError(
            f"{path} was written by an older frugal (no tensors/): resume it with that "
            "version, or start again in a new output_dir"
        )
    ckpt.load_tensors(path / "tensors", run.unwrapped, run.inner_optimizer)
    sched = _load(path / "scheduler.pt")
    run.scheduler.load_state_dict(sched["scheduler"])
    if sched["scaler"] is not None and run.acc.scaler is not None:
        run.acc.scaler.load_state_dict(sched["scaler"])
    rng = path / f"rng-{run.acc.process_index}.pt"
    if state.get("world") == run.world and rng.exists():
        ckpt.set_rng_state(_load(rng))
    else:
        from accelerate.utils import set_seed

        set_seed(run.cfg.training.seed + int(state["step"]) + run.acc.process_index)
        run.notes.append("resumed on a different number of processes: RNG streams reseeded")
    per_rank = run.cfg.training.effective_batch // run.world
    micro = int(state.get("micro_batch", run.micro))
    if per_rank % micro == 0:
        run.micro = min(run.micro, micro)  # keep an OOM back-off across the restart
    run.eval_micro = run.micro
    return state


def _save_best(run: Run, step: int) -> None:
    """The trainable weights of the best evaluation so far, in `best/`, swapped in whole."""
    weights = ckpt.trainable_state(run.unwrapped, keep=run.main)  # FSDP: all gather
    if not run.main:
        return
    from safetensors.torch import save_file

    tmp = run.out / ".tmp-best"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(weights, str(tmp / "trainable.safetensors"))
    (tmp / "step.json").write_text(json.dumps({"step": step}))
    ckpt.swap_in(tmp, run.out / "best")


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
    resume: "auto" (newest complete checkpoint, if any), "never", or a checkpoint path.
    Every unit of work (a step, an evaluation, a checkpoint) is preceded by one check that
    all processes agree on: stop signal, budget, time limit."""
    meter = CostMeter(cfg.hourly_usd, cfg.budget_usd, clock=lambda: clock())  # bills setup too
    with _Stop() as stop:  # held through the final save: a second SIGTERM must not cut it
        run = setup(cfg)
        if dry_run:
            run.out = run.out / "dry-run"  # measurements only: the run's own files stay as they are
            if run.main:
                shutil.rmtree(run.out, ignore_errors=True)
        step, book = _start(run, cfg, resume, meter, dry_run)
        total = min(run.total_steps, dry_run or run.total_steps)
        return _loop(run, cfg, stop, meter, step, book, total, on_step, quiet, dry_run)


def _start(
    run: Run, cfg: RunConfig, resume: str, meter: CostMeter, dry_run: int | None
) -> tuple[int, dict[str, Any]]:
    """Resume from a checkpoint, or start fresh where nothing would be overwritten."""
    out = run.out
    book: dict[str, Any] = {"best_eval": None, "best_step": None, "bad_evals": 0,
                            "tokens": 0.0, "train_tokens": 0.0, "train_time_s": 0.0,
                            "step_times": [], "findings": [],
                            "diagnostics": None}  # fmt: skip
    source = None
    if resume not in ("auto", "never"):
        source = Path(resume)
        if not ckpt.is_complete(source):
            raise FrugalError(f"--resume {resume}: not a complete checkpoint")
    elif resume == "auto" and not dry_run:
        source = ckpt.latest(out / "checkpoints")
        for why in ckpt.skipped(out / "checkpoints", source):
            run.notes.append(f"skipped checkpoint {why}")
    finished = [f for f in ("final", "run_summary.json") if (out / f).exists()]
    if source is None and (ckpt.complete(out / "checkpoints") or finished):
        raise FrugalError(
            f"{out} already holds a run: continue it with --resume auto, or set output_dir "
            "to a new directory (nothing there was changed)"
        )
    step = 0
    if source is not None:
        state = restore(run, source)
        mismatch = [k for k, v in _run_key(run).items() if state.get("run_key", {}).get(k) != v]
        if mismatch:
            raise FrugalError(
                f"{source} was made with different {', '.join(mismatch)}: resume with the "
                "config it was made with (see its config.yaml), or use a new output_dir"
            )
        step = int(state["step"])
        meter.before_usd, meter.before_s = float(state["spent_usd"]), float(state["elapsed_s"])
        book.update({k: state[k] for k in book if k in state})
        run.notes.append(f"resumed from {source.name} (step {step})")
        best = out / "best" / "step.json"
        if best.exists() and json.loads(best.read_text())["step"] != book["best_step"]:
            shutil.rmtree(out / "best")  # written after the checkpoint, on a lost timeline
            book.update(best_eval=None, best_step=None, bad_evals=0)
    if run.main:
        out.mkdir(parents=True, exist_ok=True)
        cfg.write(out / "config.yaml")  # the resolved config, beside every output
        _truncate_metrics(out / "metrics.jsonl", step)
    return step, book


def _run_key(run: Run) -> dict[str, Any]:
    """What a checkpoint's weights, optimizer state and data position depend on."""
    c = run.cfg
    return {"job.method": c.job.method, "job.optimizer": c.job.optimizer,
            "job.seq": c.job.seq, "job.lora_r": c.job.lora_r, "data.path": c.data.path,
            "job.packing": c.job.packing, "rows": len(run.batches),
            "training.effective_batch": c.training.effective_batch,
            "training.learning_rate": c.training.learning_rate,
            "training.seed": c.training.seed, "total steps": run.total_steps}  # fmt: skip


def _loop(
    run: Run, cfg: RunConfig, stop: _Stop, meter: CostMeter, step: int, book: dict[str, Any],
    total: int, on_step: Any, quiet: bool, dry_run: int | None,
) -> dict[str, Any]:  # fmt: skip
    t = cfg.training
    config = cfg.model_dump(mode="json")
    sinks = Sinks(run.out, t.loggers, config, resume=step > 0) if run.main else None
    progress = Progress(total, enabled=run.main and not quiet)
    progress.print(f"precision: {run.precision} ({run.precision_reason})")
    for n in run.notes:
        progress.print(n)
    diag = Diagnostics(t.learning_rate, run.precision, t.max_grad_norm)
    if book["diagnostics"] is not None:  # resumed: the windows carry on
        diag.load_state_dict(book["diagnostics"])
    save_every_s = 60 * (t.save_every_min or _plan_interval(cfg) or DEFAULT_CHECKPOINT_MIN)
    expected_s = _expected_step_s(run)
    # a clean stop writes a checkpoint and the final weights: guess their time from the bytes
    # until a checkpoint has been timed (1 GB/s disk, 20 ms of fixed cost)
    trainable = sum(p.numel() * p.element_size() for p in run.params)
    save_s, eval_s = 0.02 + 3 * trainable / 1e9, None
    session_t0 = last_save = clock()
    saved_step = step  # a fresh run has nothing to save at step 0
    eval_due = False
    outcome, reason = "completed", f"reached {total} steps"
    peak_alloc = peak_res = 0.0
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start_step = step

    def save(at: int) -> None:
        nonlocal save_s, last_save, saved_step
        if at == saved_step:
            return
        t0 = clock()
        book["diagnostics"] = diag.state_dict()
        save_checkpoint(run, at, meter, book)
        save_s, last_save, saved_step = clock() - t0, clock(), at

    while True:
        times = book["step_times"]
        # the guards plan for a slow step: the slowest of the last ten (the first step of a
        # session, with its warm-up, only while it is the only one), or the expected before any
        slowest = max(times[1:] if len(times) > 1 else times, default=expected_s)
        if eval_due:
            nxt = eval_s if eval_s is not None else slowest * len(run.val_batches) / max(
                1, t.effective_batch) / 2  # fmt: skip
        else:
            nxt = slowest if step < total else 0.0
        limit = t.max_time_min
        sig, over_budget, over_time, save_due = _global_sum(
            run,
            float(stop.signal is not None),
            float(meter.would_exceed(nxt, 2 * save_s)),  # the work, a checkpoint, final weights
            float(limit is not None and clock() - session_t0 + nxt > 60 * limit),
            float(
                not dry_run
                and step < total
                and step != saved_step  # nothing new to save yet
                and clock() - last_save >= save_every_s
            ),
        )
        if sig:
            outcome, reason = "preempted", f"signal {stop.signal or 'on another process'}"
            break
        if over_budget and (eval_due or step < total):
            outcome = "budget-stopped"
            reason = f"the next step would cross the ${cfg.budget_usd:,.2f} budget"
            break
        if over_time and step < total:
            reason = f"max_time_min={limit} reached in this session"
            break
        if eval_due:
            eval_due = False
            t0 = clock()
            ev = evaluate(run)
            eval_s = clock() - t0
            if ev is None:
                continue
            new = diag.on_eval(step, ev, None)
            _report(new, book, progress)
            if book["best_eval"] is None or ev < book["best_eval"]:
                book.update(best_eval=ev, best_step=step, bad_evals=0)
                _save_best(run, step)
            else:
                book["bad_evals"] += 1
            if sinks:
                sinks.log(step, {"eval_loss": ev, "eval_time_s": eval_s})
            patience = t.early_stopping_patience
            if patience and book["bad_evals"] >= patience:
                reason = f"early stopping: {patience} evaluations without improvement"
                break
            continue
        if save_due:
            save(step)
            continue
        if step >= total:
            break
        t0 = clock()
        try:
            m = train_step(run, step)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e):
                raise
            _back_off(run, progress)
            continue
        dt = clock() - t0
        step += 1
        first = step == start_step + 1  # warm-up: not a typical step
        book["step_times"] = [*times, dt][-10:]
        book["tokens"] += m["tokens"]
        if not first:
            book["train_tokens"] += m["tokens"]
            book["train_time_s"] += dt
        m.update(tokens_per_s=m["tokens"] / dt, step_time_s=dt, micro_batch=run.micro,
                 grad_accum=run.accum, spent_usd=round(meter.spent_usd(), 6))  # fmt: skip
        if torch.cuda.is_available():
            peak_alloc = max(peak_alloc, torch.cuda.max_memory_allocated() / 2**30)
            peak_res = max(peak_res, torch.cuda.max_memory_reserved() / 2**30)
            m.update(peak_allocated_gib=peak_alloc, peak_reserved_gib=peak_res)
        # a loss-scale overflow (fp16) skips the update; it is not a broken run
        new = diag.on_step(step, m["loss"], None if m.get("skipped") else m["grad_norm"])
        _report(new, book, progress)
        if sinks and (step % t.log_every == 0 or step == total):
            sinks.log(step, m)
        progress.update(step, m, meter, dt)
        if on_step is not None:
            on_step(step, m)
        if any(f.fatal for f in new):
            outcome, reason = "failed", new[-1].message
            break
        eval_due = not dry_run and ((t.eval_every and step % t.eval_every == 0) or step == total)
    progress.close()
    if not dry_run and outcome != "failed":
        save(step)
    summary = _finish(run, step, start_step, total, outcome, reason, meter, book,
                      peak_alloc, peak_res, dry_run)  # fmt: skip
    if sinks:
        for n in sinks.notes:
            progress.print(n)
        sinks.close()
    return summary


def _report(new: list[Any], book: dict[str, Any], progress: Progress) -> None:
    for f in new:
        book["findings"].append({"kind": f.kind, "step": f.step, "message": f.message})
        progress.print(f"[yellow]diagnostic:[/] {f.message}")


def _back_off(run: Run, progress: Progress) -> None:
    """After an OOM: halve the micro-batch, keeping the effective batch (more accumulation)."""
    if run.world > 1:
        raise FrugalError(
            "out of memory on one of the GPUs: set job.batch lower (the micro-batch) and "
            "run again with --resume auto"
        )
    _free_memory(run)
    if run.micro == 1:
        raise FrugalError(
            "out of memory at micro-batch 1: turn on job.grad_checkpointing, lower job.seq, "
            "or use job.method=qlora / a bigger GPU"
        )
    per_rank = run.cfg.training.effective_batch // run.world
    run.micro = max(d for d in range(1, run.micro // 2 + 1) if per_rank % d == 0)
    progress.print(f"OOM: micro-batch now {run.micro}, gradient accumulation {run.accum}")


def _expected_step_s(run: Run) -> float:
    """A step's seconds before one is timed, for the guards: the estimator's for this GPU on
    CUDA, else the plan's; 0 when neither knows (then only the first step is unguarded)."""
    cfg = run.cfg
    if cfg.budget_usd is None and cfg.training.max_time_min is None:
        return 0.0  # no guard to feed
    tokens_per_s = _predicted(cfg, run.micro, run.accum).get("tokens_per_s")
    return cfg.training.effective_batch * cfg.job.seq / tokens_per_s if tokens_per_s else 0.0


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines logged after the checkpoint a run resumes from."""
    if not path.exists():
        return
    keep = []
    for ln in path.read_text().splitlines():
        try:
            if json.loads(ln).get("step", 0) <= step:
                keep.append(ln)
        except json.JSONDecodeError:  # a line torn by a crash mid-write
            continue
    write_text_atomic(path, "".join(ln + "\n" for ln in keep))


def _plan_interval(cfg: RunConfig) -> float | None:
    return cfg.plan.checkpoint_interval_min if cfg.plan else None


# -- cleanup -----------------------------------------------------------------------------------


def _export(run: Run, book: dict[str, Any]) -> dict[str, str]:
    """The adapter (or the full model) in HF format, from the best evaluation if there was
    one; with training.merge, the adapter merged into the model as well. Every process
    calls it (under FSDP each sends its shards); the main process writes."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress line is enough
    model = run.unwrapped
    best = run.out / "best" / "trainable.safetensors"
    if book.get("best_step") is not None and best.exists():
        ckpt.load_trainable(model, best)
    whole: dict[str, Any] = {}  # the weights to save, gathered from the shards
    if run.sharded and run.cfg.job.method == "full":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_model_state_dict(model, options=opts)
        # a tied weight (the head sharing the embeddings) is saved once, as transformers does
        tied = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        tied -= {n for n, _ in model.named_parameters()}
        whole = {"state_dict": {k: v for k, v in sd.items() if k not in tied}}
    elif run.sharded:  # an adapter: its weights are all PEFT saves
        whole = {"state_dict": ckpt.trainable_state(model, keep=run.main)}
    if not run.main:
        return {}
    final, tmp = run.out / "final", run.out / ".tmp-final"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True, **whole)
    run.tokenizer.save_pretrained(str(tmp))
    ckpt.swap_in(tmp, final)
    outputs = {"adapter" if run.cfg.job.method != "full" else "model": str(final)}
    if run.cfg.training.merge and run.cfg.job.method != "full":
        merged, tmp = model.merge_and_unload(), run.out / ".tmp-merged"
        shutil.rmtree(tmp, ignore_errors=True)
        merged.save_pretrained(str(tmp), safe_serialization=True)
        run.tokenizer.save_pretrained(str(tmp))
        ckpt.swap_in(tmp, run.out / "merged")
        outputs["merged"] = str(run.out / "merged")
    return outputs


def _predicted(cfg: RunConfig, micro: int, accum: int) -> dict[str, Any]:
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
    if torch.cuda.is_available():  # the estimate of the step that ran: memory and speed only
        spec = load_spec(cfg.model)
        job = cfg.job.model_copy(update={"batch": micro, "grad_accum": accum})
        prof = get_profile(spec, job, job.seq)
        mem = memory_at(prof, job, job.batch, job.seq)
        pred.update(
            peak_allocated_gib=round(mem.peak_allocated / 2**30, 3),
            peak_reserved_gib=round(mem.peak_reserved / 2**30, 3),
        )
        gpu = lookup_gpu(torch.cuda.get_device_name())
        speed = step_time(prof, job, gpu, spec.hidden_size) if gpu else None
        if speed is not None:
            pred["tokens_per_s"] = round(speed.tokens_per_s, 1)
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
    peak_alloc: float,
    peak_res: float,
    dry_run: int | None,
) -> dict[str, Any]:
    cfg = run.cfg
    outputs: dict[str, str] = {}
    if not dry_run and outcome in ("completed", "budget-stopped"):
        outputs = _export(run, book)
    times = book["step_times"]
    typical = sorted(times)[len(times) // 2] if times else None
    if book["train_time_s"] > 0:  # steps after each session's first (warm-up) step
        tokens_per_s: float | None = book["train_tokens"] / book["train_time_s"]
    else:
        tokens_per_s = book["tokens"] / sum(times) if times else None
    tokens_step = cfg.training.effective_batch * cfg.job.seq if cfg.job.packing else None
    actual: dict[str, Any] = {
        "hours": round(meter.elapsed_s() / 3600, 5),
        "cost_usd": round(meter.spent_usd(), 4),
        "tokens": int(book["tokens"]),
        "step_time_s": typical,
        "tokens_per_s": None if tokens_per_s is None else round(tokens_per_s, 1),
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
        "predicted": _predicted(cfg, run.micro, run.accum),
        "actual": actual,
        "budget_usd": cfg.budget_usd,
        "best_eval_loss": book["best_eval"],
        "best_step": book["best_step"],
        "outputs": outputs,
        "diagnostics": book["findings"],
        "notes": run.notes,
    }
    if run.main:
        name = "dry_run.json" if dry_run else "run_summary.json"
        write_text_atomic(run.out / name, json.dumps(summary, indent=1), durable=True)
        if dry_run:
            record_measurement(
                {"kind": "dry_run", "model": cfg.model, "job": cfg.job.model_dump(), **summary}
            )
    return summary
