"""A training run as it lives in its processes (`TrainingRun`), and one optimizer step of
it: the micro-batches, their forward and backward on the device, the sums every process
agrees on; and the evaluation."""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from frugal.config import RunConfig
from frugal.data.examples import (
    Batcher,
    Schedule,
)
from frugal.errors import RESUMABLE_EXIT as RESUMABLE_EXIT  # the runner's exit code
from frugal.errors import FrugalError
from frugal.run import checkpoint as ckpt
from frugal.step.loop import Loss, Sums, UpdateRule, forward, optimizer_step
from frugal.step.loss import IGNORE, causal_lm_loss


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
        UpdateRule(
            Loss.of(run.cfg.job, t.contrastive_weight, t.contrastive_margin),
            ce_scale=run.world / max(inp.tokens, 1.0),
            cl_scale=run.world / max(inp.segments, 1.0),
            max_grad_norm=t.max_grad_norm,
            reduce_each=run.sharded,  # FSDP: no process ever holds more than its gradient shard
        ),
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


def _parts(run: TrainingRun) -> ckpt.Parts:
    return ckpt.Parts(run.unwrapped, run.inner_optimizer, run.scheduler, run.acc)


def _cuda_device() -> str | None:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None
