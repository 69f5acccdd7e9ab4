"""One optimizer step over a process's micro-batches: the code `frugal train` runs and the
estimate simulates.

For each micro-batch: forward under the engine's autocast, the task's loss (`tasks/`: a
causal LM's summed token cross-entropy, plus the contrastive term when configured; a
classifier's over its classes) scaled to its share of the step, backward (gradients
reduced after the last micro-batch under DDP, after each under FSDP). Then gradient
clipping (or just the norm), the optimizer update and `zero_grad(set_to_none=True)`, which
frees the gradients before the next forward. With the optimizer in backward
(`optim.PerParameter`), each weight is updated during the backward as its gradient
completes, and the step after it has nothing left to update.

The engine is accelerate's `Accelerator` in `frugal train` (loss scaling for fp16, DDP's
no_sync) and `PlainEngine` in the estimate: the same autocast, backward and clipping on
one process. The marks (`marks.py`) tell a watching memory tracker where the step is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from frugal.errors import FrugalError
from frugal.step import marks
from frugal.step.optim import PerParameter
from frugal.step.tasks.base import Loss, LossInputs, Task

AUTOCAST = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


class Engine(Protocol):
    """What the step needs from accelerate's Accelerator."""

    device: torch.device

    def autocast(self) -> Any: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def no_sync(self, model: Any) -> Any: ...
    def clip_grad_norm_(self, parameters: Any, max_norm: float) -> Any: ...


class PlainEngine:
    """The Accelerator's step on one process without accelerate (the estimate's)."""

    def __init__(self, precision: str, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.dtype = AUTOCAST.get(precision)

    def autocast(self) -> Any:
        return torch.autocast(
            self.device.type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None
        )

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def no_sync(self, model: Any) -> Any:
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Any, max_norm: float) -> Any:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


@dataclass
class Sums:
    """What one process's micro-batches gave: the task's summed (unscaled) loss, the
    contrastive term's, the gradients' norm, and the task's other sums by name."""

    ce: torch.Tensor
    cl: torch.Tensor
    grad_norm: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class UpdateRule:
    """How one optimizer step turns its micro-batches into an update.

    The `task`'s loss with its settings (`loss`, `Task.loss`); `ce_scale` and `cl_scale`
    turn each micro-batch's summed losses into its share of the step's loss (1 / the
    step's token or segment count, times the process count under data parallelism, whose
    reduction averages). `max_grad_norm`: clipping (0: none). `reduce_each`: FSDP
    reduce-scatters the gradients after every micro-batch; DDP all-reduces once, after
    the last."""

    task: Task
    loss: Loss
    ce_scale: float
    cl_scale: float
    max_grad_norm: float
    reduce_each: bool = False


def optimizer_step(
    model: Any,
    optimizer: Any,
    params: list[torch.nn.Parameter],
    batches: Iterable[dict[str, torch.Tensor]],
    engine: Engine,
    update: UpdateRule,
    extra: Any = None,
) -> Sums:
    """Accumulate the micro-batches' gradients, clip, update, free the gradients. `extra`:
    the task's second, frozen model (a reference copy, a teacher), if any."""
    batches = list(batches)
    zero = torch.zeros((), device=engine.device)
    totals = {"ce": zero.clone(), "cl": zero.clone()}  # on the device: no sync per micro-batch
    fused = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    fused = fused if isinstance(fused, PerParameter) else None
    if fused is not None and (len(batches) > 1 or update.max_grad_norm > 0):
        raise FrugalError(
            "the optimizer in backward updates each weight from one micro-batch's gradient, "
            "unclipped: run the step as one micro-batch with max_grad_norm 0"
        )
    with fused.in_backward() if fused is not None else contextlib.nullcontext():
        _accumulate(LossInputs(model, update.loss, extra, update, totals), batches, engine)
    marks.phase("opt")
    if fused is not None:
        norm = fused.grad_norm(engine.device)
    elif update.max_grad_norm > 0:
        norm = engine.clip_grad_norm_(params, update.max_grad_norm)
    else:
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else zero
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    ce, cl = totals.pop("ce"), totals.pop("cl")
    return Sums(ce, cl, norm, totals)


def _accumulate(m: LossInputs, batches: list[dict[str, torch.Tensor]], engine: Engine) -> None:
    """Forward and backward of each micro-batch, the gradients summed; the task's summed
    loss added to `m.totals["ce"]`, its other sums (the contrastive term's) by name."""
    update, model, totals = m.scales, m.model, m.totals
    assert isinstance(update, UpdateRule)
    for i, b in enumerate(batches, start=1):
        marks.micro_step(i)
        marks.phase("fwd")
        b = {k: v.to(engine.device, non_blocking=True) for k, v in b.items()}
        last = i == len(batches)
        sync = contextlib.nullcontext() if last or update.reduce_each else engine.no_sync(model)
        with sync:
            with engine.autocast():
                total, ce_sum = update.task.micro_loss(m, b)
            marks.phase("bwd_head")
            engine.backward(total)
        totals["ce"] += ce_sum.detach()
        del total, ce_sum, b
