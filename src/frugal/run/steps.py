"""A training run as it lives in its processes (`TrainingRun`), and one optimizer step of
it: the micro-batches, their forward and backward on the device, the sums every process
agrees on; and the evaluation."""

from __future__ import annotations

import gc
import json
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
from frugal.data.labels import PAIR, Classes, LabelledRows, class_metrics
from frugal.errors import RESUMABLE_EXIT as RESUMABLE_EXIT  # the runner's exit code
from frugal.errors import FrugalError
from frugal.files import write_text_atomic
from frugal.run import checkpoint as ckpt
from frugal.step.forward import forward
from frugal.step.loop import Sums, UpdateRule, optimizer_step
from frugal.step.loss import IGNORE
from frugal.step.tasks import Task, task_of
from frugal.step.tasks.base import Loss, LossInputs


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
    class_weights: tuple[float, ...] = ()  # a classifier's loss per class (none: equal)
    extra_model: Any = None  # a second, frozen model: a reference copy, a teacher

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
    def task(self) -> Task:
        return task_of(self.cfg.job.task)

    @property
    def loss(self) -> Loss:
        """The task's loss settings from the run config (a classifier's class weights from
        its rows), as the estimate builds them with the defaults (`Task.loss`)."""
        given = self.cfg.training.model_dump() | {"class_weights": self.class_weights}
        return self.task.loss(self.cfg.job, given)

    def loss_inputs(self) -> LossInputs:
        """What the task's loss reads besides a micro-batch, in evaluation."""
        return LossInputs(self.unwrapped, self.loss, self.extra_model)

    @property
    def classes(self) -> Classes | None:
        """A classifier's classes (its training file's); None for a causal LM."""
        rows = self.batches.rows
        return rows.classes if isinstance(rows, LabelledRows) else None

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
    # what each micro-batch's summed loss is divided by: its predicted tokens, a
    # classifier's rows (weighted by class when weighted), ...: the task's count
    loss = run.loss
    local_tok = sum(run.task.count(b, loss) for b in batches)
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
            run.task,
            run.loss,
            ce_scale=run.world / max(inp.tokens, 1.0),
            cl_scale=run.world / max(inp.segments, 1.0),
            max_grad_norm=t.max_grad_norm,
            reduce_each=run.sharded,  # FSDP: no process ever holds more than its gradient shard
        ),
        run.extra_model,
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
    names = sorted(sums.stats)  # the task's own sums (preference tuning's rewards)
    own = [sums.stats[k].to(sums.ce) for k in names]
    stats = torch.stack([sums.ce, sums.cl, real, norm.to(sums.ce) / run.world, *own])
    ce_g, cl_g, tok_g, norm_g, *own_g = _global_sum(run, stats)
    m = {
        "loss": ce_g / max(inp.tokens, 1.0),
        "grad_norm": norm_g,
        "tokens": tok_g,
        "lr": float(run.scheduler.get_last_lr()[0]),
        **run.task.metrics(dict(zip(names, own_g, strict=True)), inp.tokens),
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


@dataclass
class Evaluation:
    """One evaluation: the mean loss of the validation rows (a classifier's unweighted, per
    row) and a classifier's metrics (`data.labels.class_metrics`)."""

    loss: float
    metrics: dict[str, float] = field(default_factory=dict)

    def value(self, metric: str) -> float:
        return self.loss if metric == "eval_loss" else self.metrics[metric]

    def better(self, than: float | None, metric: str) -> bool:
        """Whether this evaluation beats `than` (a value of `metric`; None: nothing yet)."""
        if than is None:
            return True
        v = self.value(metric)
        return v < than if metric == "eval_loss" else v > than


def evaluate(run: TrainingRun) -> Evaluation | None:
    """The validation rows' mean loss (and a classifier's metrics); an OOM halves only the
    evaluation batch."""
    if not len(run.val_batches):
        return None
    while True:
        try:
            return _evaluate(run)
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


def _evaluate(run: TrainingRun) -> Evaluation:
    # the unwrapped model: DDP's forward would wait for processes that have no rows left.
    # FSDP gathers each layer from all processes, so all run the same number of forwards:
    # a process out of rows runs one on row 0 and does not count it.
    model, acc = run.unwrapped, run.acc
    n_rows = len(run.val_batches)
    mine = list(range(acc.process_index, n_rows, run.world))
    k = len(run.classes.names) if run.classes else 0
    # the loss, its count, and the task's metric sums (a classifier's confusion[true][said])
    sums = torch.zeros(2 + run.task.eval_width(k), dtype=torch.float64)
    m = run.eval_micro
    chunks = [mine[i : i + m] for i in range(0, len(mine), m)]
    if run.sharded:
        chunks += [[]] * (math.ceil(math.ceil(n_rows / run.world) / m) - len(chunks))
    model.eval()
    inputs = run.loss_inputs()
    with torch.no_grad():
        for rows in chunks:
            b = run.val_batches(rows or [0])
            b = {key: v.to(acc.device) for key, v in b.items()}
            with acc.autocast():
                got = run.task.eval_sums(inputs, b)
            if rows:
                sums += got.cpu()
    total = _global_sum(run, sums.to(acc.device))
    loss_value = total[0] / max(total[1], 1.0)
    if run.classes is None:  # the task's metrics of its sums (none for a causal LM)
        own = dict(zip(run.task.eval_names, total[2:], strict=True))
        return Evaluation(loss_value, run.task.metrics(own, total[1]))
    confusion = [total[2 + r * k : 2 + (r + 1) * k] for r in range(k)]
    return Evaluation(loss_value, class_metrics(confusion, run.classes.names))


def write_predictions(run: TrainingRun) -> Path:
    """A classifier's predictions of its validation rows, one JSON line each (its text or
    texts, the true class, the predicted one and every class's probability), from the
    weights the model holds now: `predictions.jsonl` in the output directory."""
    assert run.classes is not None and isinstance(run.val_batches.rows, LabelledRows)
    names, rows = run.classes.names, run.val_batches.rows
    model, acc = run.unwrapped, run.acc
    model.eval()
    lines = []
    with torch.no_grad():
        for start in range(0, len(rows), run.eval_micro):
            idx = list(range(start, min(start + run.eval_micro, len(rows))))
            b = {k: v.to(acc.device) for k, v in run.val_batches(idx).items()}
            with acc.autocast():
                probs = forward(model, b).logits.float().softmax(-1).cpu()
            for i, p in zip(idx, probs.tolist(), strict=True):
                e = rows.examples[i]
                texts = dict(zip(("text",) if len(e.texts) == 1 else PAIR, e.texts, strict=True))
                lines.append(
                    json.dumps(
                        {
                            **texts,
                            "label": names[e.label],
                            "predicted": names[max(range(len(p)), key=p.__getitem__)],
                            "probabilities": {
                                n: round(x, 6) for n, x in zip(names, p, strict=True)
                            },
                        }
                    )
                )
    path = run.out / "predictions.jsonl"
    write_text_atomic(path, "".join(line + "\n" for line in lines))
    return path


def _parts(run: TrainingRun) -> ckpt.Parts:
    return ckpt.Parts(run.unwrapped, run.inner_optimizer, run.scheduler, run.acc)


def _cuda_device() -> str | None:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None
