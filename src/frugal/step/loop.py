"""One optimizer step over a process's micro-batches: the code `frugal train` runs and the
estimate simulates.

For each micro-batch: forward under the engine's autocast, the loss (`loss.py`: summed
token cross-entropy, plus the contrastive term when configured) scaled to its share of the
step, backward (gradients reduced after the last micro-batch under DDP, after each under
FSDP). Then gradient clipping (or just the norm), the optimizer update and
`zero_grad(set_to_none=True)`, which frees the gradients before the next forward. With the
optimizer in backward (`optim.PerParameter`), each weight is updated during the backward as
its gradient completes, and the step after it has nothing left to update.

The engine is accelerate's `Accelerator` in `frugal train` (loss scaling for fp16, DDP's
no_sync) and `PlainEngine` in the estimate: the same autocast, backward and clipping on
one process. The marks (`marks.py`) tell a watching memory tracker where the step is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from frugal.errors import FrugalError
from frugal.step import marks
from frugal.step.batch import model_inputs
from frugal.step.chunked_ce import chunked_linear_cross_entropy
from frugal.step.job import TrainJob
from frugal.step.loss import causal_lm_loss, classification_loss, contrastive_loss
from frugal.step.optim import PerParameter

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


@dataclass(frozen=True)
class Loss:
    """The training loss: cross-entropy, plus SimCTG's contrastive term when `contrastive`;
    with `chunks`, the cross-entropy is computed from the last hidden states in that many
    chunks of tokens (`chunked_ce`), so the whole logits tensor never exists. A classifier's
    (`classify`) is the cross-entropy over its classes, weighted by `class_weights` if any."""

    contrastive: bool = False
    weight: float = 1.0
    margin: float = 0.5
    chunks: int = 0
    classify: bool = False
    class_weights: tuple[float, ...] = ()

    @classmethod
    def of(
        cls, job: TrainJob, weight: float = 1.0, margin: float = 0.5,
        class_weights: tuple[float, ...] = (),
    ) -> Loss:  # fmt: skip
        """The job's loss (the trainer and the estimator build it here)."""
        classify = job.task == "classification"
        return cls(job.loss == "ce+contrastive", weight, margin, job.loss_chunks, classify,
                   class_weights)  # fmt: skip


def lm_head(model: Any) -> Any:
    """The LM head module under DDP's and PEFT's wrappers."""
    inner = getattr(model, "module", model)  # DDP
    head = inner.get_output_embeddings()
    if head is None:
        raise FrugalError("--loss-chunks needs a model with an LM head")
    cap = getattr(getattr(inner, "config", None), "final_logit_softcapping", None)
    if cap:
        raise FrugalError(
            f"--loss-chunks: this model soft-caps its logits ({cap:g}), which the chunked loss "
            "does not: use --loss-chunks 0"
        )
    return head


@contextlib.contextmanager
def last_hidden(model: Any, wanted: bool = True) -> Iterator[list[torch.Tensor]]:
    """Collects the decoder's output (the last hidden states, after the final norm) of the
    forward run inside. A hook rather than `output_hidden_states`, whose tuple would hold
    every layer's input on the device until the loss is computed."""
    box: list[torch.Tensor] = []
    if not wanted:
        yield box
        return
    decoder = getattr(model, "module", model).get_decoder()  # under DDP's and PEFT's wrappers
    if decoder.get_output_embeddings() is not None:  # the LM itself (Llama 4's): its body
        decoder = decoder.model
    hook = decoder.register_forward_hook(lambda m, args, out: box.append(out[0]))
    try:
        yield box
    finally:
        hook.remove()


def ce_of(
    model: Any, b: dict[str, torch.Tensor], loss: Loss
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The forward and its summed cross-entropy (plain, or chunked from the hidden states);
    with the contrastive term, also the last hidden states."""
    if loss.classify:
        weight = torch.tensor(loss.class_weights) if loss.class_weights else None
        return None, classification_loss(forward(model, b).logits, b["labels"], weight)[0]
    with last_hidden(model, bool(loss.chunks or loss.contrastive)) as box:
        if not loss.chunks:
            ce = causal_lm_loss(forward(model, b).logits, b["labels"])[0]
        else:
            head = lm_head(model)
            # no position's logits from the model itself (an empty index): the loss makes
            # its own, chunk by chunk
            none = torch.empty(0, dtype=torch.long, device=b["labels"].device)
            model(**model_inputs(b), use_cache=False, logits_to_keep=none)
    hidden = box[0] if box else None
    if loss.chunks:
        assert hidden is not None
        per = -(-hidden.shape[0] * hidden.shape[1] // loss.chunks)  # tokens per chunk
        ce, _ = chunked_linear_cross_entropy(hidden, head.weight, b["labels"], per, head.bias)
    return (hidden if loss.contrastive else None), ce


@dataclass
class Sums:
    """What one process's micro-batches gave: summed (unscaled) losses and the norm."""

    ce: torch.Tensor
    cl: torch.Tensor
    grad_norm: torch.Tensor


def forward(model: Any, batch: dict[str, torch.Tensor]) -> Any:
    return model(**model_inputs(batch), use_cache=False)


@dataclass(frozen=True)
class UpdateRule:
    """How one optimizer step turns its micro-batches into an update.

    `ce_scale` and `cl_scale` turn each micro-batch's summed losses into its share of the
    step's loss (1 / the step's token or segment count, times the process count under
    data parallelism, whose reduction averages). `max_grad_norm`: clipping (0: none).
    `reduce_each`: FSDP reduce-scatters the gradients after every micro-batch; DDP
    all-reduces once, after the last."""

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
) -> Sums:
    """Accumulate the micro-batches' gradients, clip, update, free the gradients."""
    batches = list(batches)
    zero = torch.zeros((), device=engine.device)
    ce_total, cl_total = zero.clone(), zero.clone()  # on the device: no sync per micro-batch
    fused = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    fused = fused if isinstance(fused, PerParameter) else None
    if fused is not None and (len(batches) > 1 or update.max_grad_norm > 0):
        raise FrugalError(
            "the optimizer in backward updates each weight from one micro-batch's gradient, "
            "unclipped: run the step as one micro-batch with max_grad_norm 0"
        )
    with fused.in_backward() if fused is not None else contextlib.nullcontext():
        _accumulate(model, batches, engine, update, (ce_total, cl_total))
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
    return Sums(ce_total, cl_total, norm)


def _accumulate(
    model: Any, batches: list[dict[str, torch.Tensor]], engine: Engine, update: UpdateRule,
    totals: tuple[torch.Tensor, torch.Tensor],
) -> None:  # fmt: skip
    """Forward and backward of each micro-batch, the gradients summed; the summed
    cross-entropy and contrastive losses added to `totals`."""
    loss = update.loss
    ce_total, cl_total = totals
    for i, b in enumerate(batches, start=1):
        marks.micro_step(i)
        marks.phase("fwd")
        b = {k: v.to(engine.device, non_blocking=True) for k, v in b.items()}
        last = i == len(batches)
        sync = contextlib.nullcontext() if last or update.reduce_each else engine.no_sync(model)
        with sync:
            with engine.autocast():
                hidden, ce_sum = ce_of(model, b, loss)
                total = ce_sum * update.ce_scale
                if hidden is not None:
                    cl_sum, _ = contrastive_loss(hidden, b["labels"], b["segment_ids"], loss.margin)
                    total = total + cl_sum * (update.cl_scale * loss.weight)
                    cl_total += cl_sum.detach()
            del hidden
            marks.phase("bwd_head")
            engine.backward(total)
        ce_total += ce_sum.detach()
        del total, ce_sum, b
