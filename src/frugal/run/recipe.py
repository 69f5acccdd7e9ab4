"""The training recipe: `setup` → `start` (fresh or resumed) → `Loop` → summary, read top
to bottom (the run and one optimizer step of it: steps.py; the loop: training_loop.py).

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
import json
import math
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from frugal.config import RunConfig
from frugal.data.examples import Batcher, Schedule
from frugal.data.labels import LabelledRows
from frugal.errors import RESUMABLE_EXIT as RESUMABLE_EXIT  # the runner's exit code
from frugal.errors import FrugalError, PeerLost
from frugal.files import write_text_atomic
from frugal.run import checkpoint as ckpt
from frugal.run import outdir
from frugal.run.books import Preflight, RunBooks, Watchdog, is_main_process, preflight
from frugal.run.build import (
    auto_micro_batch,
    choose_precision,
    classifier,
    compute_dtype,
    load_model,
    make_optimizer,
    refuse_unsupported,
    same_tokenizer,
    shard,
)
from frugal.run.guard import MoneyGuard
from frugal.run.interrupt import Stop
from frugal.run.meter import CostMeter, Progress
from frugal.run.passes import run_passes
from frugal.run.predict import predict
from frugal.run.rows import task_rows
from frugal.run.state import TrainState
from frugal.run.steps import TrainingRun, _cuda_device, _parts
from frugal.run.summary import Outcome, RunSummary
from frugal.run.training_loop import Clock, Driving, Loop
from frugal.step.extra import build_extra

if TYPE_CHECKING:
    from accelerate import Accelerator

# peft still asks transformers for is_gradient_checkpointing, deprecated in v5: not our warning
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
# the distributed checkpoint API says so each time it runs in one process: that is intended
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


# -- setup ---------------------------------------------------------------------------------


def setup(cfg: RunConfig) -> TrainingRun:
    """A run ready to train: its processes, its model, its data and its optimizer."""
    from accelerate.utils import set_seed

    job = cfg.job
    refuse_unsupported(cfg)
    sharded = job.sharding == "fsdp" and job.gpus > 1
    precision, reason = choose_precision(job.precision, sharded)
    acc = _accelerator(cfg, precision)
    set_seed(cfg.training.seed)
    model, tok = load_model(
        cfg, precision, empty=sharded and not acc.is_main_process, sharded=sharded
    )
    rows, val_rows, notes = task_rows(cfg, tok)
    weights = classifier(cfg, model, tok, rows) if isinstance(rows, LabelledRows) else ()
    same_tokenizer(cfg, tok)
    # the task's second model, before training: a reference is the model as built
    extra = build_extra(model, job, compute_dtype(job, precision))
    sched_data = Schedule(
        len(rows), cfg.training.effective_batch, cfg.data.epochs, cfg.training.seed
    )
    total = sched_data.total_steps
    if cfg.training.max_steps:
        total = min(total, cfg.training.max_steps)
    model, optimizer, scheduler, params = _optimizer(cfg, model, acc, total, sharded)
    if extra is not None:
        extra = extra.to(acc.device)
    per_rank = cfg.training.effective_batch // acc.num_processes
    micro, why = auto_micro_batch(cfg, per_rank)
    pad = tok.pad_token_id
    return TrainingRun(
        cfg=cfg,
        out=Path(cfg.output_dir),
        acc=acc,
        model=model,
        tokenizer=tok,
        optimizer=optimizer,
        scheduler=scheduler,
        batches=Batcher(rows, pad, cfg.job.packing),
        val_batches=Batcher(val_rows, pad, cfg.job.packing),
        schedule=sched_data,
        precision=precision,
        precision_reason=reason,
        micro=micro,
        eval_micro=micro,
        total_steps=total,
        params=params,
        sharded=sharded,
        notes=[f"micro-batch {micro}: {why}", *notes],
        class_weights=weights,
        extra_model=extra,
    )


def _accelerator(cfg: RunConfig, precision: str) -> Accelerator:
    """This process's accelerate state, one process per GPU of the job."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import InitProcessGroupKwargs

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
    if acc.num_processes != cfg.job.gpus:
        raise FrugalError(
            f"job.gpus={cfg.job.gpus} but {acc.num_processes} processes were launched: "
            "let `frugal train` launch them (no torchrun of your own)"
        )
    return acc


def _optimizer(
    cfg: RunConfig, model: Any, acc: Accelerator, total: int, sharded: bool
) -> tuple[Any, Any, Any, list[torch.nn.Parameter]]:
    """The model as accelerate runs it, its optimizer and learning-rate schedule, and the
    parameters it trains."""
    from transformers import get_scheduler

    if sharded:
        model = shard(model, acc.device, acc.is_main_process)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(cfg, params)
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
    return model, optimizer, scheduler, params


# -- a run: its sessions, its peers, where it resumes from ---------------------------------


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
        drive = Driving(dry_run, on_step, quiet, clock)
        return _session(cfg, out, pre, source, notes, drive)


def _session(
    cfg: RunConfig,
    out: Path,
    pre: Preflight | None,
    source: Path | None,
    notes: list[str],
    drive: Driving,
) -> RunSummary:
    """One session of the run in `out`, from `source` (a checkpoint, or None: fresh): set
    up, start or resume, train, save, summarize, with its books kept (`pre`: the
    preflight's tags and warnings, on the main process)."""
    if drive.dry_run and pre is not None:
        shutil.rmtree(out, ignore_errors=True)  # measurements only: the run's files stay
    meter = CostMeter(
        cfg.hourly_usd, cfg.budget_usd, clock=drive.clock, max_hours=cfg.training.max_hours
    )  # bills setup too
    books, (usd, hours) = _books(cfg, pre, out, bool(drive.dry_run))
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
            loop = Loop(run, state, meter, stop, drive, books)
            summary = _guarded(loop, meter, books, cfg)
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, the last checkpoint intact
        if loop is None:
            _end_failed(books, meter, None, "preempted", "interrupted before the first step")
            raise
        summary = loop.interrupted()
    except BaseException as e:
        lost = _peer_lost(e, out)
        why = str(lost) if lost else f"{type(e).__name__}: {e}"
        _end_failed(books, meter, loop, "preempted" if lost else "failed", why)
        if lost:
            raise lost from e
        raise
    if books is not None:
        books.end(summary)
    return summary


def _books(
    cfg: RunConfig, pre: Preflight | None, out: Path, dry_run: bool
) -> tuple[RunBooks | None, tuple[float, float]]:
    """The run on the books (the main process's, `pre`), before setup, so that a budget's
    other runs see it; and what the books hold of it already (dollars, hours)."""
    if pre is None:
        return None, (0.0, 0.0)
    books = RunBooks(cfg, pre.tags, out, dry_run, Progress(0, False).alert)
    for w in pre.warnings:
        books.say(f"[yellow]{w}[/]")
    return books, books.start(predict(cfg, 0, 0, None), _cuda_device())


def _guarded(loop: Loop, meter: CostMeter, books: RunBooks | None, cfg: RunConfig) -> RunSummary:
    """The loop, trained under the idle watchdog and the money guard, which hold the
    run's limits by the clock while a step stalls."""
    idle_s = 60 * (cfg.training.idle_stop_min or float("inf"))
    guard = MoneyGuard(
        meter,
        loop.money_stop,
        cap=lambda: books.cap if books else None,
        renew=loop.renew,
        down=lambda: bool(books and books.recorder.down),
    )
    loop.guard_s = guard.reach_s
    with Watchdog(idle_s, loop.hung) as loop.dog, guard:
        return loop.train()


def _end_failed(
    books: RunBooks | None, meter: CostMeter, loop: Loop | None, outcome: Outcome, why: str
) -> None:
    """A session that ended without its summary, on the books with what it had done."""
    if books is None:
        return
    step, tokens = (loop.state.step, loop.state.tokens) if loop else (0, 0.0)
    spent, hours = round(meter.spent_usd(), 4), round(meter.elapsed_s() / 3600, 5)
    books.end_failed(outcome, why, spent, hours, step, tokens)


# what gloo and NCCL say when the other end of an exchange is gone, or never answered (not
# their other errors, a CUDA fault say, which are no reason to resume)
PEER_GONE = (
    "connection reset",
    "connection closed",
    "closed by peer",
    "broken pipe",
    "timed out",
    "timeout",
)


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
    kept = (
        f"its newest complete checkpoint ({newest.name}) is intact"
        if newest
        else ("it has no checkpoint yet")
    )
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    first = re.sub(r"^\[[^\]]*\]\s*", "", first)  # the C++ source line torch puts first
    return PeerLost(
        f"another process of this run is gone ({first[:160]}): this one stopped too, and "
        f"{kept}; once every node is up, run the same command on each to resume"
    )


def _run_key(run: TrainingRun) -> dict[str, Any]:
    """What a checkpoint's weights, optimizer state and data position depend on."""
    c = run.cfg
    return {
        "job.method": c.job.method,
        "job.optimizer": c.job.optimizer,
        "job.seq": c.job.seq,
        "job.lora_r": c.job.lora_r,
        "data.path": c.data.path,
        "job.packing": c.job.packing,
        "rows": len(run.batches),
        "training.effective_batch": c.training.effective_batch,
        "training.learning_rate": c.training.learning_rate,
        "training.seed": c.training.seed,
        "total steps": run.total_steps,
    }


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
    if run.main:
        out.mkdir(parents=True, exist_ok=True)
    run_passes(run)  # before a checkpoint's weights: a reference pass reads the model as built
    state = TrainState.fresh(run.micro, run.world, _run_key(run))
    if source is not None:
        state = _restore(run, store, _intact(run, store, source), meter)
    if run.main:
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
