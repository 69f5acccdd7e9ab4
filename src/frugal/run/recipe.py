"""The training recipe: `setup` → `start` (fresh or resumed) → `Loop` → summary, read top
to bottom.

One process per GPU (launched by `frugal train` for `job.gpus > 1`), DDP through accelerate
or PyTorch FSDP (`job.sharding=fsdp`), transformers models, PEFT adapters, bitsandbytes for
QLoRA and 8-bit optimizers on CUDA. The loop is four named steps: `decide` (one check all
processes agree on: signal, budget, time limit, checkpoint or evaluation due), `step`,
`evaluate`, `checkpoint`. What it carries between steps is one typed `TrainState`
(state.py), saved and restored whole through `Checkpoints` (checkpoint.py); predictions
come from predict.py, and the result is a typed `RunSummary` (summary.py).
What the runner adds to a plain loop, and where:
- exact gradient accumulation: each micro-batch's summed token loss is divided by the token
  count of the whole optimizer step, so micro-batch 4 x accum 2 equals micro-batch 8;
- automatic micro-batch: start from the estimator's largest fitting micro-batch on CUDA; on
  OOM halve it and double accumulation (the effective batch and the maths stay the same);
  an OOM in evaluation only halves the evaluation batch;
- money: a cost meter and a budget guard that stops before the budget is crossed;
- spot safety: atomic checkpoints every `save_every_min`; SIGTERM/SIGINT → checkpoint at the
  next step boundary and exit RESUMABLE_EXIT; `resume="auto"` restores weights, optimizer,
  scheduler, RNG and the data position (a function of the step, see frugal.data);
- diagnostics (diagnose.py), early stopping, best-model selection, a run summary.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from frugal.config import RunConfig
from frugal.data.examples import (
    Batcher,
    Rows,
    Schedule,
    load_examples,
    pack,
    split,
    unpacked,
)
from frugal.data.stats import DataStats
from frugal.data.tokens import Examples
from frugal.errors import RESUMABLE_EXIT as RESUMABLE_EXIT  # the runner's exit code
from frugal.errors import FrugalError, PeerLost
from frugal.files import write_text_atomic
from frugal.plan.spot import DEFAULT_CHECKPOINT_MIN
from frugal.run import checkpoint as ckpt
from frugal.run import outdir
from frugal.run.books import Cap, Preflight, RunBooks, Watchdog, is_main_process, preflight
from frugal.run.build import (
    auto_micro_batch,
    choose_precision,
    load_model,
    make_optimizer,
    refuse_unsupported,
    shard,
)
from frugal.run.diagnose import Diagnostics, Finding
from frugal.run.interrupt import Stop, orphaned
from frugal.run.meter import CostMeter, Progress, Sinks
from frugal.run.predict import expected_step_s, predict
from frugal.run.state import FindingRecord, TrainState
from frugal.run.summary import Actual, Outcome, RunSummary
from frugal.step.loop import Loss, Sums, forward, optimizer_step
from frugal.step.loss import IGNORE, causal_lm_loss

# peft still asks transformers for is_gradient_checkpointing, deprecated in v5: not our warning
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
# the distributed checkpoint API says so each time it runs in one process: that is intended
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


@dataclass
class TrainingRun:
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


def setup(cfg: RunConfig) -> TrainingRun:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import InitProcessGroupKwargs, set_seed

    job = cfg.job
    refuse_unsupported(cfg)
    sharded = job.sharding == "fsdp" and job.gpus > 1
    precision, reason = choose_precision(job.precision, sharded)
    mixed = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(precision, "no")
    # accelerate keeps one precision per process: a second run in it (a notebook, the GPU
    # tests) may want another, so its state is set afresh (the process group is kept)
    AcceleratorState._reset_state()
    # a process that waits for the others longer than this stops, resumable (PeerLost);
    # none: torch's own limit
    peer = cfg.training.peer_timeout_min
    wait = [InitProcessGroupKwargs(timeout=timedelta(minutes=peer))] if peer else []
    acc = Accelerator(
        mixed_precision=mixed, cpu=not torch.cuda.is_available(), kwargs_handlers=wait
    )
    if acc.num_processes != job.gpus:
        raise FrugalError(
            f"job.gpus={job.gpus} but {acc.num_processes} processes were launched: "
            "let `frugal train` launch them (no torchrun of your own)"
        )
    set_seed(cfg.training.seed)
    model, tok = load_model(
        cfg, precision, empty=sharded and not acc.is_main_process, sharded=sharded
    )

    assert cfg.data.path  # refuse_unsupported checked it
    st = DataStats()
    examples = load_examples(cfg.data.path, tok, job.seq, cfg.data.format, st)
    notes = [cut] if (cut := st.cut(job.seq, "job.seq")) else []
    if cfg.data.val_path:
        train_ex, val_ex = examples, load_examples(cfg.data.val_path, tok, job.seq, cfg.data.format)
    else:
        train_ex, val_ex = split(examples, cfg.data.val_ratio, cfg.training.seed)
    pad = tok.pad_token_id

    def to_rows(ex: Examples) -> Rows:
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
    run = TrainingRun(
        cfg=cfg, out=out, acc=acc, model=model, tokenizer=tok, optimizer=optimizer,
        scheduler=scheduler, batches=Batcher(rows, pad, cfg.job.packing),
        val_batches=Batcher(val_rows, pad, cfg.job.packing), schedule=sched_data,
        precision=precision, precision_reason=reason, micro=micro, eval_micro=micro,
        total_steps=total, params=params, sharded=sharded,
        notes=[f"micro-batch {micro}: {why}", *notes],
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


def _global_sum(run: TrainingRun, *values: float | torch.Tensor) -> list[float]:
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


def step_input(run: TrainingRun, step: int) -> StepInput:
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


def device_step(run: TrainingRun, inp: StepInput) -> Sums:
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
        Loss.of(run.cfg.job, t.contrastive_weight, t.contrastive_margin),
        ce_scale=run.world / max(inp.tokens, 1.0),
        cl_scale=run.world / max(inp.segments, 1.0),
        max_grad_norm=t.max_grad_norm,
        reduce_each=run.sharded,  # FSDP: no process ever holds more than its gradient shard
    )


def train_step(run: TrainingRun, step: int) -> dict[str, float]:
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


def _free_memory(run: TrainingRun) -> None:
    """After an OOM: free what the failed attempt held (called outside the `except` block,
    whose traceback would keep the attempt's tensors alive). Its peak is forgotten too, so
    the peak a run reports is of the steps that ran (the loop keeps the earlier steps')."""
    run.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def evaluate(run: TrainingRun) -> float | None:
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
        _free_memory(run)  # out of the except block: its traceback held the attempt's tensors
        run.eval_micro //= 2
        run.notes.append(f"evaluation OOM: evaluation batch now {run.eval_micro}")


# -- the loop ----------------------------------------------------------------------------------


Clock = Callable[[], float]


def train(
    cfg: RunConfig,
    resume: str = "auto",
    dry_run: int | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    quiet: bool = False,
    clock: Clock = time.monotonic,
    tags: list[str] | None = None,
    force: bool = False,
) -> RunSummary:
    """Run `cfg`; returns the run summary (also written to run_summary.json).
    resume: "auto" (newest complete checkpoint, if any), "never", or a checkpoint path.
    `clock` times steps, checkpoints and dollars (a test passes its own).
    tags: `key=value` ledger tags added to the config's; force: start even when the plan's
    estimate would cross a budget (see frugal.run.books)."""
    out = Path(cfg.output_dir) / ("dry-run" if dry_run else "")
    main = is_main_process()
    if main:
        outdir.check(Path(cfg.output_dir))  # frugal's, or refused before any work
    pre = preflight(cfg, tags or [], force, out, bool(dry_run)) if main else None  # no work yet
    source, notes = find_source(cfg, out, resume, dry_run)  # refuses a dir holding a run
    # one run at a time in a directory: this process holds it (the processes a multi-GPU
    # run's launcher starts run under the launcher's hold)
    alone = main and "LOCAL_RANK" not in os.environ
    with outdir.held(Path(cfg.output_dir)) if alone else contextlib.nullcontext():
        return _session(cfg, out, pre, source, notes, dry_run, on_step, quiet, clock)


def _session(
    cfg: RunConfig, out: Path, pre: Preflight | None, source: Path | None, notes: list[str],
    dry_run: int | None, on_step: Callable[[int, dict[str, float]], None] | None,
    quiet: bool, clock: Clock,
) -> RunSummary:  # fmt: skip
    """One session of the run in `out`, from `source` (a checkpoint, or None: fresh): set
    up, start or resume, train, save, summarize, with its books kept (`pre`: the
    preflight's tags and warnings, on the main process)."""
    if dry_run and pre is not None:
        shutil.rmtree(out, ignore_errors=True)  # measurements only: the run's files stay
    meter = CostMeter(cfg.hourly_usd, cfg.budget_usd, clock=clock,
                      max_hours=cfg.training.max_hours)  # bills setup too  # fmt: skip
    books = None
    if pre is not None:  # on the books before setup, so a budget's other runs see it
        books = RunBooks(cfg, pre.tags, out, bool(dry_run), Progress(0, False).alert)
        for w in pre.warnings:
            books.say(f"[yellow]{w}[/]")
        usd, hours = books.start(predict(cfg, 0, 0, None), _cuda_device())
    loop: Loop | None = None
    try:
        with Stop() as stop:  # held through the final save: a second SIGTERM must not cut it
            run = setup(cfg)
            run.out = out
            run.notes += notes
            state = start(run, source, meter)
            if books is not None:  # a resumed run's money, lost work included, is on the books
                meter.before_usd = max(meter.before_usd, usd)
                meter.before_s = max(meter.before_s, 3600 * hours)
            loop = Loop(run, state, meter, stop, clock, dry_run, on_step, quiet, books)
            idle_s = 60 * (cfg.training.idle_stop_min or float("inf"))
            with Watchdog(idle_s, loop.hung) as loop.dog:
                summary = loop.train()
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, the last checkpoint intact
        if loop is None:
            if books is not None:
                books.end_failed("preempted", "interrupted before the first step",
                                 round(meter.spent_usd(), 4), round(meter.elapsed_s() / 3600, 5),
                                 0, 0.0)  # fmt: skip
            raise
        summary = loop.interrupted()
    except BaseException as e:
        lost = _peer_lost(e, out)
        if books is not None:
            step, tokens = (loop.state.step, loop.state.tokens) if loop else (0, 0.0)
            why = str(lost) if lost else f"{type(e).__name__}: {e}"
            outcome: Outcome = "preempted" if lost else "failed"
            books.end_failed(outcome, why, round(meter.spent_usd(), 4),
                             round(meter.elapsed_s() / 3600, 5), step, tokens)  # fmt: skip
        if lost:
            raise lost from e
        raise
    if books is not None:
        books.end(summary)
    return summary


# what gloo and NCCL say when the other end of an exchange is gone, or never answered (not
# their other errors, a CUDA fault say, which are no reason to resume)
PEER_GONE = ("connection reset", "connection closed", "closed by peer", "broken pipe",
             "timed out", "timeout")  # fmt: skip


def peer_gone(e: BaseException) -> bool:
    """Whether `e`, raised by an exchange between processes, says the other end is gone."""
    import torch.distributed as dist

    return isinstance(e, dist.DistNetworkError | dist.DistStoreError) or (
        isinstance(e, RuntimeError) and any(s in str(e).lower() for s in PEER_GONE)
    )


def _peer_lost(e: BaseException, out: Path) -> PeerLost | None:
    """`e` as PeerLost where it is an exchange between processes that failed because another
    process is gone: its connection reset or closed (at once), or no answer within
    training.peer_timeout_min. None for anything else, and in a run of one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    if not peer_gone(e):
        return None
    text = str(e)
    newest = ckpt.latest(out / "checkpoints")
    kept = f"its newest complete checkpoint ({newest.name}) is intact" if newest else (
        "it has no checkpoint yet")  # fmt: skip
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    first = re.sub(r"^\[[^\]]*\]\s*", "", first)  # the C++ source line torch puts first
    return PeerLost(
        f"another process of this run is gone ({first[:160]}): this one stopped too, and "
        f"{kept}; once every node is up, run the same command on each to resume"
    )


def _parts(run: TrainingRun) -> ckpt.Parts:
    return ckpt.Parts(run.unwrapped, run.inner_optimizer, run.scheduler, run.acc)


def _run_key(run: TrainingRun) -> dict[str, Any]:
    """What a checkpoint's weights, optimizer state and data position depend on."""
    c = run.cfg
    return {"job.method": c.job.method, "job.optimizer": c.job.optimizer,
            "job.seq": c.job.seq, "job.lora_r": c.job.lora_r, "data.path": c.data.path,
            "job.packing": c.job.packing, "rows": len(run.batches),
            "training.effective_batch": c.training.effective_batch,
            "training.learning_rate": c.training.learning_rate,
            "training.seed": c.training.seed, "total steps": run.total_steps}  # fmt: skip


def find_source(
    cfg: RunConfig, out: Path, resume: str, dry_run: int | None
) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from (None: start fresh), with notes on the ones skipped;
    refuses to start fresh where a run would be overwritten."""
    store = ckpt.Checkpoints(out / "checkpoints", cfg.training.keep_checkpoints)
    source, notes = None, []
    if resume not in ("auto", "never"):
        source = Path(resume)
        if not ckpt.is_complete(source):
            raise FrugalError(f"--resume {resume}: not a complete checkpoint")
    elif resume == "auto" and not dry_run:
        source = store.latest()
        notes = [f"skipped checkpoint {why}" for why in store.skipped(source)]
    if source is None and store.any():  # --resume never
        raise FrugalError(
            f"{out} already holds a run: continue it with --resume auto, or set output_dir "
            "to a new directory (nothing there was changed)"
        )
    trained = _trained(out)
    if source is None and trained:
        raise FrugalError(
            f"{out} holds a run that {trained}, and no checkpoint to continue it from: start "
            "again in a new output_dir (nothing there was changed)"
        )
    return source, notes


def _trained(out: Path) -> str | None:
    """What the run in `out` got done, when it trained at all (a run stopped before its
    first step trained nothing: its directory is free to start again)."""
    if (out / "final").exists():
        return "finished"
    try:
        steps = json.loads((out / "run_summary.json").read_text())["steps"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return "left an unreadable run_summary.json"
    return f"reached step {steps}" if steps else None


def start(run: TrainingRun, source: Path | None, meter: CostMeter) -> TrainState:
    """Resume from `source`, a checkpoint, or start fresh."""
    out, cfg = run.out, run.cfg
    store = ckpt.Checkpoints(out / "checkpoints", cfg.training.keep_checkpoints)
    state = TrainState.fresh(run.micro, run.world, _run_key(run))
    if source is not None:
        state = _restore(run, store, _intact(run, store, source), meter)
    if run.main:
        out.mkdir(parents=True, exist_ok=True)
        cfg.write(out / "config.yaml")  # the resolved config, beside every output
        _truncate_metrics(out / "metrics.jsonl", state.step)
    return state


def _intact(run: TrainingRun, store: ckpt.Checkpoints, source: Path) -> Path:
    """The checkpoint to resume: `source`, or where it is damaged the newest intact one
    before it (said in the run's notes). The main process reads them whole, once, and
    tells the others."""
    chosen: Path | None = source
    notes: list[str] = []
    refused = ""  # why the resume cannot go on: every process raises it, none is left waiting
    if run.main:
        try:
            if source.parent == store.root:
                chosen, notes = store.intact(source)
            elif (why := ckpt.damage(source)) is not None:  # --resume DIR: that one, or none
                refused = f"--resume {source}: {why}: resume from another checkpoint"
        except (FrugalError, OSError) as e:
            refused = str(e)
        if chosen is None and not refused:
            refused = (
                f"no intact checkpoint in {store.root} ({'; '.join(notes)}): move it aside "
                "to start again (nothing was changed)"
            )
    if run.world > 1:
        from accelerate.utils import broadcast_object_list

        chosen, refused = broadcast_object_list([chosen, refused])
    if refused or chosen is None:
        raise FrugalError(refused)
    run.notes += notes
    return chosen


def _restore(
    run: TrainingRun, store: ckpt.Checkpoints, source: Path, meter: CostMeter
) -> TrainState:
    state, same_rng = store.restore(source, _parts(run))
    mismatch = [k for k, v in _run_key(run).items() if state.run_key.get(k) != v]
    if mismatch:
        raise FrugalError(
            f"{source} was made with different {', '.join(mismatch)}: resume with the "
            "config it was made with (see its config.yaml), or use a new output_dir"
        )
    if not same_rng:
        from accelerate.utils import set_seed

        set_seed(run.cfg.training.seed + state.step + run.acc.process_index)
        run.notes.append("resumed on a different number of processes: RNG streams reseeded")
    per_rank = run.cfg.training.effective_batch // run.world
    if per_rank % state.micro_batch == 0:
        run.micro = min(run.micro, state.micro_batch)  # keep an OOM back-off
    run.eval_micro = run.micro
    meter.before_usd, meter.before_s = state.spent_usd, state.elapsed_s
    run.notes.append(f"resumed from {source.name} (step {state.step})")
    if ckpt.best_step(run.out) not in (None, state.best_step):
        shutil.rmtree(run.out / "best")  # written after the checkpoint, on a lost timeline
        state.best_eval, state.best_step, state.bad_evals = None, None, 0
    return state


class Action(Enum):
    STEP = "step"
    EVALUATE = "evaluate"
    CHECKPOINT = "checkpoint"
    STOP = "stop"


class Loop:
    """The training loop as four named steps: `decide` what comes next (one check all
    processes agree on: stop signal, budget, time limit, checkpoint due, evaluation due),
    then `step`, `evaluate` or `checkpoint`; `finish` saves and summarizes."""

    def __init__(
        self, run: TrainingRun, state: TrainState, meter: CostMeter, stop: Stop, clock: Clock,
        dry_run: int | None, on_step: Callable[[int, dict[str, float]], None] | None,
        quiet: bool, books: RunBooks | None = None,
    ) -> None:  # fmt: skip
        self.run, self.state, self.meter, self.stop, self.clock = run, state, meter, stop, clock
        self.dry_run, self.on_step = dry_run, on_step
        cfg, t = run.cfg, run.cfg.training
        self.store = ckpt.Checkpoints(run.out / "checkpoints", t.keep_checkpoints)
        self.total = min(run.total_steps, dry_run or run.total_steps)
        self.sinks = (
            Sinks(run.out, t.loggers, cfg.model_dump(mode="json"), resume=state.step > 0)
            if run.main
            else None
        )
        self.progress = Progress(self.total, enabled=run.main and not quiet)
        self.progress.print(f"precision: {run.precision} ({run.precision_reason})")
        for n in run.notes:
            self.progress.print(n)
        self.diag = Diagnostics(t.learning_rate, run.precision, t.max_grad_norm)
        if state.diagnostics is not None:  # resumed: the windows carry on
            self.diag.load_state_dict(state.diagnostics)
        self.save_every_s = 60 * (t.save_every_min or _plan_interval(cfg) or DEFAULT_CHECKPOINT_MIN)
        self.prediction = predict(cfg, run.micro, run.accum, _cuda_device())
        self.expected_s = expected_step_s(cfg, self.prediction)
        # a clean stop writes a checkpoint and the final weights: guess their time from the
        # bytes until a checkpoint has been timed (1 GB/s disk, 20 ms of fixed cost)
        trainable = sum(p.numel() * p.element_size() for p in run.params)
        self.save_s = 0.02 + 3 * trainable / 1e9
        self.eval_s: float | None = None
        self.session_t0 = self.last_save = clock()
        self.start_step = self.saved_step = state.step  # nothing new to save yet
        self.eval_due = False
        self.outcome: Outcome = "completed"
        self.was_interrupted = False  # by a second Ctrl-C
        self.stopped = False  # set with outcome and reason by whatever ends the run
        self.reason = f"reached {self.total} steps"
        self.peak_alloc = self.peak_res = 0.0
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.books = books  # the main process keeps the books
        if books is not None:
            books.say = self.progress.alert
        self.dog: Watchdog | None = None

    def train(self) -> RunSummary:
        act = {Action.STEP: self.step, Action.EVALUATE: self.evaluate,
               Action.CHECKPOINT: self.checkpoint}  # fmt: skip
        while (action := self.decide()) is not Action.STOP:
            if self.dog:  # steps are watched; evaluations and checkpoints take what they take
                self.dog.watch(action is Action.STEP)
            act[action]()
            if self.dog:
                self.dog.touch()
        if self.dog:
            self.dog.watch(False)  # nor the final checkpoint and export
        return self.finish()

    def decide(self) -> Action:
        """What comes next; on STOP, `outcome` and `reason` say why. The stop rules, in the
        order they win: a stop signal, no progress, a money or hours limit (the meter's),
        the session's time; every process sees what any of them saw."""
        if self.stopped:
            return Action.STOP
        st, t = self.state, self.run.cfg.training
        nxt, stop_s = self._forecast()
        now = self.clock()
        then = nxt + stop_s  # the next piece of work, then a clean stop
        cap = self._books(now, then)
        orphan = orphaned()
        limits = self.meter.crossed(then, cap.limit_usd if cap else None)
        late = t.max_time_min is not None and now - self.session_t0 + nxt > 60 * t.max_time_min
        sig, idle, *over, over_time, save_due = _global_sum(
            self.run,
            float(self.stop.signal is not None or orphan),
            float(self.dog is not None and self.dog.idle),
            *map(float, limits),
            float(late),
            float(self._save_due(now)),
        )
        if sig:
            return self._stop("preempted", self._signalled(orphan))
        if idle:
            return self._stop(
                "idle-stopped", f"nothing progressed for {t.idle_stop_min:g} min (idle_stop_min)"
            )
        work_left = self.eval_due or st.step < self.total
        for limit, hit in enumerate(over):
            if hit and work_left:
                return self._stop(
                    "budget-stopped", self.meter.why(limit, cap.budget if cap else None)
                )
        if over_time and st.step < self.total:
            return self._stop("completed", f"max_time_min={t.max_time_min} reached in this session")
        if self.eval_due:
            return Action.EVALUATE
        if save_due:
            return Action.CHECKPOINT
        return Action.STOP if st.step >= self.total else Action.STEP

    def _forecast(self) -> tuple[float, float]:
        """How long the next piece of work and a clean stop after it may take. The guards
        plan for a slow step: the slowest of the last ten (the first step of a session,
        with its warm-up, only while it is the only one), or the expected before any, plus
        their spread: on a busy host the next one may be slower than any seen yet. A clean
        stop, a checkpoint and the weights, is as slow as the slowest save, and slower by
        as much as the steps now vary (a host that slows the steps slows the saves too)."""
        times = self.state.step_times
        recent = times[1:] if len(times) > 1 else times
        slow = 2 * max(recent) - min(recent) if recent else self.expected_s
        if self.eval_due:
            per = max(1, self.run.cfg.training.effective_batch)
            nxt = self.eval_s if self.eval_s is not None else (
                slow * len(self.run.val_batches) / per / 2)  # fmt: skip
        else:
            nxt = slow if self.state.step < self.total else 0.0
        return nxt, 2 * self.save_s * (max(recent) / min(recent) if recent else 1.0)

    def _save_due(self, now: float) -> bool:
        step = self.state.step
        return (
            not self.dry_run
            and step < self.total
            and step != self.saved_step  # nothing new to save yet
            and now - self.last_save >= self.save_every_s
        )

    def _signalled(self, orphan: bool) -> str:
        before = " before the first step: nothing to save" if self.state.step == 0 else ""
        got = self.stop.signal or "on another process"
        why = "this node's launcher is gone" if orphan and not self.stop.signal else ""
        return f"{why or f'signal {got}'}{before}"

    def _books(self, now: float, then: float) -> Cap | None:
        """A heartbeat when one is due, or when the work until the next check (`then`
        seconds) would go past what the run has reserved of a stop budget; what a stop
        budget lets the run spend."""
        if self.books is None:
            return None
        m = self.meter
        if self.books.due(now, m.spent_usd() + (then + self.books.ask_s) * m.rate):
            st = self.state
            self.books.beat(now, st.step, st.tokens, m.spent_usd(), self.total, then, m.rate)
        return self.books.cap

    def hung(self) -> None:
        """The watchdog's last word: no progress for twice idle_stop_min (a hang)."""
        minutes = 2 * (self.run.cfg.training.idle_stop_min or 0)
        if self.books is not None:
            m, st = self.meter, self.state
            self.books.end_failed(
                "idle-stopped", f"no progress for {minutes:g} min: hung; resume from the "
                "last checkpoint", round(m.spent_usd(), 4), round(m.elapsed_s() / 3600, 5),
                st.step, st.tokens,
            )  # fmt: skip

    def _stop(self, outcome: Outcome, reason: str) -> Action:
        self.outcome, self.reason, self.stopped = outcome, reason, True
        return Action.STOP

    def step(self) -> None:
        run, st, t = self.run, self.state, self.run.cfg.training
        t0 = self.clock()
        try:
            m: dict[str, float] | None = train_step(run, st.step)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e):
                raise
            m = None
        if m is None:  # out of the except block: its traceback held the attempt's tensors
            _back_off(run, self.progress)
            return
        dt = self.clock() - t0
        st.step += 1
        step = st.step
        st.step_times = [*st.step_times, dt][-10:]
        st.tokens += m["tokens"]
        if step != self.start_step + 1:  # a session's first step warms up: not typical
            st.train_tokens += m["tokens"]
            st.train_time_s += dt
        m.update(tokens_per_s=m["tokens"] / dt, step_time_s=dt, micro_batch=run.micro,
                 grad_accum=run.accum, spent_usd=round(self.meter.spent_usd(), 6))  # fmt: skip
        if torch.cuda.is_available():
            self.peak_alloc = max(self.peak_alloc, torch.cuda.max_memory_allocated() / 2**30)
            self.peak_res = max(self.peak_res, torch.cuda.max_memory_reserved() / 2**30)
            m.update(peak_allocated_gib=self.peak_alloc, peak_reserved_gib=self.peak_res)
        # a loss-scale overflow (fp16) skips the update; it is not a broken run
        new = self.diag.on_step(step, m["loss"], None if m.get("skipped") else m["grad_norm"])
        self._report(new)
        if self.sinks and (step % t.log_every == 0 or step == self.total):
            self.sinks.log(step, m)
        self.progress.update(step, m, self.meter, dt)
        if self.on_step is not None:
            self.on_step(step, m)
        if any(f.fatal for f in new):
            self._stop("failed", new[-1].message)
            return
        self.eval_due = not self.dry_run and (
            (t.eval_every and step % t.eval_every == 0) or step == self.total
        )

    def evaluate(self) -> None:
        run, st, t = self.run, self.state, self.run.cfg.training
        self.eval_due = False
        t0 = self.clock()
        ev = evaluate(run)
        self.eval_s = self.clock() - t0
        if ev is None:
            return
        self._report(self.diag.on_eval(st.step, ev, None))
        if st.best_eval is None or ev < st.best_eval:
            st.best_eval, st.best_step, st.bad_evals = ev, st.step, 0
            ckpt.save_best(run.out, run.unwrapped, st.step, run.main)
        else:
            st.bad_evals += 1
        if self.sinks:
            self.sinks.log(st.step, {"eval_loss": ev, "eval_time_s": self.eval_s})
        patience = t.early_stopping_patience
        if patience and st.bad_evals >= patience:
            self._stop("completed", f"early stopping: {patience} evaluations without improvement")

    def checkpoint(self) -> None:
        st = self.state
        if st.step == self.saved_step:
            return
        t0 = self.clock()
        st.diagnostics = self.diag.state_dict()
        st.spent_usd, st.elapsed_s = self.meter.spent_usd(), self.meter.elapsed_s()
        st.micro_batch, st.world = self.run.micro, self.run.world
        self.store.save(st, _parts(self.run))
        # the state holds the totals so far; the meter keeps counting this session on top
        # the guards plan for the slowest save of the session (the first replaces the guess)
        took = self.clock() - t0
        saved_before = self.saved_step != self.start_step
        self.save_s = max(took, self.save_s) if saved_before else took
        self.last_save, self.saved_step = self.clock(), st.step

    def interrupted(self) -> RunSummary:
        """A second Ctrl-C: no final save; the newest checkpoint is where a rerun resumes."""
        self.outcome, self.was_interrupted = "preempted", True
        kept = (
            f"the checkpoint of step {self.saved_step} is kept"
            if self.saved_step
            else "no checkpoint: nothing was saved yet"
        )
        self.reason = f"interrupted twice, stopped at once at step {self.state.step}; {kept}"
        return self.finish(save=False)

    def finish(self, save: bool = True) -> RunSummary:
        self.progress.close()
        if save and not self.dry_run and self.outcome != "failed":
            self.checkpoint()
        summary = _summary(self)
        if self.sinks:
            for n in self.sinks.notes:
                self.progress.print(n)
            self.sinks.close()
        return summary

    def _report(self, new: list[Finding]) -> None:
        for f in new:
            self.state.findings.append(FindingRecord(kind=f.kind, step=f.step, message=f.message))
            self.progress.print(f"[yellow]diagnostic:[/] {f.message}")


def _cuda_device() -> str | None:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _back_off(run: TrainingRun, progress: Progress) -> None:
    """After an OOM: halve the micro-batch, keeping the effective batch (more accumulation)."""
    if run.world > 1:
        raise FrugalError(
            "out of memory on one of the GPUs: set job.batch lower (the micro-batch) and "
            "run again with --resume auto"
        )
    _free_memory(run)
    if run.cfg.job.optimizer_in_backward:
        raise FrugalError(
            f"out of memory at micro-batch {run.micro}, which the optimizer in backward cannot "
            "split: lower training.effective_batch and job.batch, or turn off "
            "job.optimizer_in_backward"
        )
    if run.micro == 1:
        raise FrugalError(
            "out of memory at micro-batch 1: turn on job.grad_checkpointing, lower job.seq, "
            "or use job.method=qlora / a bigger GPU"
        )
    per_rank = run.cfg.training.effective_batch // run.world
    run.micro = max(d for d in range(1, run.micro // 2 + 1) if per_rank % d == 0)
    progress.print(f"OOM: micro-batch now {run.micro}, gradient accumulation {run.accum}")


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


def _export(run: TrainingRun, best_step: int | None) -> dict[str, str]:
    """The adapter (or the full model) in HF format, from the best evaluation if there was
    one; with training.merge, the adapter merged into the model as well. Every process
    calls it (under FSDP each sends its shards); the main process writes."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress line is enough
    model = run.unwrapped
    best = run.out / "best" / "trainable.safetensors"
    if best_step is not None and best.exists():
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


def _summary(loop: Loop) -> RunSummary:
    run, st, meter, cfg = loop.run, loop.state, loop.meter, loop.run.cfg
    outputs: dict[str, str] = {}
    if not loop.dry_run and loop.outcome in ("completed", "budget-stopped"):
        outputs = _export(run, st.best_step)
    times = st.step_times
    if st.train_time_s > 0:  # steps after each session's first (warm-up) step
        tokens_per_s: float | None = st.train_tokens / st.train_time_s
    else:
        tokens_per_s = st.tokens / sum(times) if times else None
    cuda = torch.cuda.is_available()
    actual = Actual(
        hours=round(meter.elapsed_s() / 3600, 5),
        cost_usd=round(meter.spent_usd(), 4),
        tokens=int(st.tokens),
        step_time_s=sorted(times)[len(times) // 2] if times else None,
        tokens_per_s=None if tokens_per_s is None else round(tokens_per_s, 1),
        peak_allocated_gib=round(loop.peak_alloc, 3) if cuda else None,
        peak_reserved_gib=round(loop.peak_res, 3) if cuda else None,
    )
    summary = RunSummary(
        outcome=loop.outcome,
        reason=loop.reason,
        resumable=loop.outcome in ("preempted", "idle-stopped"),
        interrupted=loop.was_interrupted,
        steps=st.step,
        total_steps=loop.total,
        steps_this_session=st.step - loop.start_step,
        micro_batch=run.micro,
        grad_accum=run.accum,
        effective_batch=cfg.training.effective_batch,
        tokens_per_step=cfg.training.effective_batch * cfg.job.seq if cfg.job.packing else None,
        precision=run.precision,
        precision_reason=run.precision_reason,
        predicted=predict(cfg, run.micro, run.accum, _cuda_device()),
        actual=actual,
        budget_usd=cfg.budget_usd,
        best_eval_loss=st.best_eval,
        best_step=st.best_step,
        outputs=outputs,
        diagnostics=st.findings,
        notes=run.notes,
    )
    if run.main:
        name = "dry_run.json" if loop.dry_run else "run_summary.json"
        write_text_atomic(run.out / name, summary.to_json(), durable=True)
    return summary
