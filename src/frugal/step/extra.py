"""The second, frozen model a task's step or pass reads, built from the task's description
(`tasks.base.ExtraModel`) the same way for `frugal train` (real weights) and the estimate
(on the meta device, at a shallow depth): a full fine-tune's reference (a copy of the
trained model as built) or a distillation's teacher (another causal LM, forward only).

In the estimate, another model is simulated beside the trained model's shallow copies: a
copy of n of the trained model's L layers reads one of n + L' - L of its L' layers, so that
extrapolating the copies to the trained model's depth gives it its own L' layers (its
weights, its forward's FLOPs and ops); its task's `min_depth` keeps that at one or more.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from frugal.errors import FrugalError
from frugal.step.job import TrainJob
from frugal.step.model import build_model
from frugal.step.tasks import task_of
from frugal.step.tasks.base import Depth, ExtraModel


def build_extra(model: Any, job: TrainJob, dtype: torch.dtype, depth: Depth | None = None) -> Any:
    """The task's second model (`Task.extra_model`), or None where it has none: the job is
    checked against the trained `model` first (`Task.check_model`); made before training,
    in `dtype`. `depth`: the estimate's shallow copy (its layers, and the whole model's)."""
    task = task_of(job.task)
    task.check_model(job, model.config.to_dict())
    want = task.extra_model(job)
    return None if want is None else build_frozen(want, model, job, dtype, depth)


def build_frozen(
    want: ExtraModel, model: Any, job: TrainJob, dtype: torch.dtype, depth: Depth | None = None
) -> Any:
    """`want`, frozen, in `dtype`, in eval mode: a copy of `model` as it is now, or another
    checkpoint's causal LM (its weights; on the meta device at `depth`, module doc)."""
    out = copy.deepcopy(model) if want.kind == "copy" else _checkpoint(want, job, dtype, depth)
    out = out.to(dtype)
    out.requires_grad_(False)
    return out.eval()


def _checkpoint(want: ExtraModel, job: TrainJob, dtype: torch.dtype, depth: Depth | None) -> Any:
    """Another causal LM as a forward-only model: all its weights in `dtype` (bf16 for a
    16-bit compute dtype, cast after), no adapters, no checkpointing, the job's attention."""
    precision = "fp32" if dtype == torch.float32 else "bf16-true"
    as_built = TrainJob.model_validate(
        {
            "method": "full",
            "precision": precision,
            "grad_checkpointing": False,
            "attention": job.attention,
        }
    )
    if depth is not None:
        n, whole = depth
        layers = n + int(want.config["num_hidden_layers"]) - whole
        return build_model(want.config, as_built, "meta", n_layers=layers)
    try:
        return build_model(want.config, as_built, "pretrained", path=want.source)
    except OSError:
        raise FrugalError(
            f"no weights for the {want.role} {want.source} offline: give a local directory "
            f"with its weights as job.{want.role}"
        ) from None
