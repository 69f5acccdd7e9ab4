"""Run one model's training steps on tensors without data and record what they allocate.

The step is `frugal train`'s own (`frugal.step`): the model from `build_model` on the meta
device (no weights), reduced to a few layers, with the job's real PEFT adapters (and the
4-bit stand-in for QLoRA), moved to phantoms (CPU tensors with meta bodies, `phantom.py`);
the optimizer from `make_optimizer`; the micro-batch from the job's task (`tasks/`); and
`loop.optimizer_step` with the trainer's loss.
A first, untracked step creates the optimizer state; each tracked step is then the steady
state (state exists, gradients were freed by `zero_grad`). Every op's live bytes per
category and each segment of the step are returned as a `Trace`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from frugal.estimate.optime import TracedOps
from frugal.estimate.phantom import PhantomMode, phantom_like
from frugal.estimate.tracker import StepTracker, tracking
from frugal.models.specs import is_moe_config
from frugal.step.extra import build_extra
from frugal.step.job import TrainJob
from frugal.step.loop import PlainEngine, UpdateRule, optimizer_step
from frugal.step.model import adapted, build_model, compute_dtype, count_params, cuda_kernels
from frugal.step.moe import inactive_params
from frugal.step.optim import make_optimizer
from frugal.step.tasks import task_of


@dataclass
class Trace:
    """What one simulated run allocated, op by op."""

    live: np.ndarray  # (ops + 1, categories) live bytes after each op
    segments: np.ndarray  # (ops + 1,) segment name of each op
    micro: np.ndarray  # (ops + 1,) micro-step of each op (1 or 2; 0 before the first)
    flops: dict[str, int]  # forward / backward / recompute FLOPs of one micro-step
    attn_flops: dict[str, int]  # the part of those in fused attention kernels
    op_ids: np.ndarray  # (ops + 1,) which aten op ran, to align runs of other shapes
    total_params: int  # parameters of the original (unquantized) model
    trainable_params: int
    lora_targets: list[str]
    active_params: int  # those a token meets (a MoE model's routed experts count k/E)
    attention: str  # the attention kernel the step ran (`step.model.attention_kernel`)
    ops: TracedOps  # the op table: each op's class, FLOPs, bytes, views before it


def dense_prefix(config: dict[str, Any]) -> int:
    """Dense layers a MoE model has before its first MoE layer (DeepSeek-V3: 3)."""
    if not is_moe_config(config):
        return 0
    return max(0, int(config.get("first_k_dense_replace") or 0))


def shallow_depths(config: dict[str, Any], offload: bool = False) -> tuple[int, int]:
    """The two depths the simulation runs: the shallowest that holds one layer of each
    kind (attention type; a dense prefix whole), and one more layer of the common kind,
    whose difference the profile extrapolates to the model's depth (`profile.py`)."""
    n = int(config["num_hidden_layers"])
    types = config.get("layer_types")
    k = dense_prefix(config) + (len(set(types)) if types else 1)
    if offload:
        # the decoder holds the embeddings' output (the first layer's input) through the
        # whole forward, so what offloading leaves on the device grows linearly from the
        # second layer on: fit the line there
        k += 1
    k = min(k, n)
    lo, hi = (k, k + 1) if k < n else (k - 1, k)
    return max(lo, 1), max(hi, 2)


def simulate(
    config: dict[str, Any],
    job: TrainJob,
    n_layers: int,
    shapes: list[tuple[int, int]],
    tensors: Literal["phantom", "fake"] = "phantom",
) -> list[Trace]:
    """One steady-state optimizer step of an `n_layers`-layer model per (batch, seq) shape.

    The model and optimizer are built once; the optimizer state is created before tracking
    (as after the first step), so each tracked step is what every later step allocates.
    `tensors`: phantoms (`phantom.py`), or torch's fake tensors, the reference they are
    tested against (the same trace, several times slower).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    use_phantom = tensors == "phantom"
    model = build_model(config, job, "meta", n_layers=n_layers)
    # a second model the task reads (a full fine-tune's frozen reference, a teacher), made
    # as the trainer makes it, before training
    whole = int(config["num_hidden_layers"])
    extra = build_extra(model, job, compute_dtype(job), (n_layers, whole))
    total, trainable = count_params(model)
    targets = adapted(model)
    active = total - inactive_params(model, config)
    attention = model.config._attn_implementation
    # the logits' last dimension: the vocabulary, or a classifier's classes
    vocab = task_of(job.task).logits_width(job, config)
    traces = []
    mode = PhantomMode() if use_phantom else FakeTensorMode(allow_non_fake_inputs=False)
    with cuda_kernels(), mode, warnings.catch_warnings(), _unvalidated_distributions():
        warnings.simplefilter("ignore")
        _materialize(model, use_phantom)
        if extra is not None:
            _materialize(extra, use_phantom)
        model.train()
        params, opt = _after_first_step(model, job)
        for batch, seq in shapes:
            t = _tracked_step(model, opt, params, job, (batch, seq), vocab, extra)
            traces.append(
                Trace(
                    live=t.timeline(),
                    segments=t.segments(),
                    micro=t.micro_steps(),
                    flops=dict(t.flops),
                    attn_flops=dict(t.attn_flops),
                    op_ids=np.array(t.op_ids),
                    total_params=total,
                    trainable_params=trainable,
                    lora_targets=targets,
                    active_params=active,
                    attention=attention,
                    ops=t.op_table(),
                )
            )
    return traces


def _after_first_step(model: nn.Module, job: TrainJob) -> tuple[list[nn.Parameter], Any]:
    """The trainable parameters and their optimizer, its state created as a first step
    creates it."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(
        job.optimizer, params, stand_in=True, in_backward=job.optimizer_in_backward
    )
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return params, opt


@contextlib.contextmanager
def _unvalidated_distributions() -> Iterator[None]:
    """torch.distributions without their argument checks, which read values (Gemma 3n's
    activation sparsity builds a Normal in forward): tensors without data have none."""
    was = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(was)


def _tracked_step(
    model: nn.Module,
    opt: Any,
    params: list[nn.Parameter],
    job: TrainJob,
    shape: tuple[int, int],
    vocab: int,
    extra: nn.Module | None = None,
) -> StepTracker:
    """The trainer's optimizer step on `shape` (batch, seq), every allocation tracked; two
    micro-batches where the job accumulates (the second is every later one). `extra`: the
    task's second model (its weights are frozen weights)."""
    tracker = StepTracker(vocab)
    task = task_of(job.task)
    micro = [task.batch_example(job, *shape)] * min(job.grad_accum, 2)
    clip = 0.0 if job.optimizer_in_backward else 1.0  # the optimizer in backward cannot clip
    engine = PlainEngine(job.precision)
    update = UpdateRule(task, task.loss(job, {}), 1.0, 1.0, clip)
    hooks = tracker.watch(model, opt) + (tracker.watch(extra) if extra is not None else [])
    try:
        with tracking(tracker):
            optimizer_step(model, opt, params, micro, engine, update, extra)
    finally:
        for h in hooks:
            h.remove()
    return tracker


def _materialize(model: nn.Module, use_phantom: bool) -> None:
    """Replace meta parameters and buffers with phantoms (or fake CPU tensors), keeping
    ties."""

    def empty(t: torch.Tensor) -> torch.Tensor:
        return phantom_like(t) if use_phantom else torch.empty(t.shape, dtype=t.dtype)

    done: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                done[id(p)] = nn.Parameter(empty(p), requires_grad=p.requires_grad)
            m._parameters[name] = done[id(p)]  # type: ignore[assignment]
        for name, b in list(m._buffers.items()):
            if b is None:
                continue
            if id(b) not in done:
                done[id(b)] = empty(b)
            m._buffers[name] = done[id(b)]
