"""Distillation: a student learns a teacher's next-token distribution (its soft targets)
mixed with the labels, on causal rows (Hinton, Vinyals and Dean 2015, "Distilling the
Knowledge in a Neural Network", arXiv:1503.02531).

Each trained token's loss, with z_t and z_s the teacher's and the student's logits, T the
temperature and alpha the soft targets' weight:

    alpha T^2 KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - alpha) CE(z_s, label)

The T^2 keeps the soft targets' gradients at the scale of the labels' as T changes (the
paper's section 2). A step sums it over its trained tokens and divides by their count, as
the causal loss does. The teacher (`job.teacher`: a bundled id or a directory with its
weights) runs forward only, without gradients, in the compute dtype, and its tokenizer must
be the student's: its logits are read token for token.

With `job.teacher_logits: precomputed`, the teacher runs once before training, over every
training and validation row, and keeps each token's `teacher_top_k` largest logits (their
token ids as int32, the logits as fp16: 6 bytes each) in the output directory; the step
reads them from the batch (`teacher_ids`, `teacher_logits`) and holds no teacher. The soft
targets are then the teacher's distribution renormalized over its top k, and the KL is
taken over those k tokens: exact at k = the vocabulary, biased towards the head of the
distribution below it (Anshumann et al. 2025, "Sparse Logit Sampling", arXiv:2503.16870).

The teacher is an `ExtraModel` the step's builder makes (`step.extra`: in the estimate, at
the depth that scales with the student's shallow copies); `min_depth` keeps that at one
layer or more. Its precomputed top k is a `TeacherPass`, run by `run.passes`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from frugal.errors import FrugalError
from frugal.models.specs import load_spec
from frugal.step.tasks.base import (
    ExtraModel,
    JobFields,
    Loss,
    LossInputs,
    Output,
    Pass,
    given_settings,
)
from frugal.step.tasks.causal import Causal

if TYPE_CHECKING:
    import torch

TOP_K = 64  # job.teacher_top_k's default
TOP_BYTES = 6  # a precomputed logit on disk: its token id (int32) and its value (fp16)


@cache
def teacher_config(name: str) -> dict[str, Any]:
    """The teacher's config (bundled, a local directory, or the hub's cache)."""
    try:
        return load_spec(name).config
    except FrugalError as e:
        raise FrugalError(f"--teacher {name}: {e}") from None


def same_vocabulary(student: dict[str, Any], teacher: str) -> None:
    """The teacher's logits are read token for token: its vocabulary must be the student's."""
    t = int(teacher_config(teacher)["vocab_size"])
    s = int(student["vocab_size"])
    if t != s:
        raise FrugalError(
            f"--teacher {teacher} has a vocabulary of {t:,} tokens and the student {s:,}: "
            "distillation reads the teacher's logits token for token: pick a teacher of the "
            "student's tokenizer (its family)"
        )


@dataclass(frozen=True)
class DistillLoss(Loss):
    """Distillation's loss (the module doc's): the soft targets' weight `alpha` (the labels'
    is 1 - alpha) and the softmax `temperature` of both models."""

    alpha: float = 0.5
    temperature: float = 2.0


def distill_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    labels: torch.Tensor,
    loss: DistillLoss,
    top_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed loss of the module doc over the trained tokens (labels unshifted, as
    `loss.causal_lm_loss` reads them), and the summed cross-entropy alone. `teacher`: its
    whole logits, or (with `top_ids`, their token ids) its top k of each token."""
    import torch.nn.functional as F

    from frugal.step.loss import IGNORE

    vocab, t = student.shape[-1], loss.temperature
    target = F.pad(labels[:, 1:], (0, 1), value=IGNORE).reshape(-1)
    s = student.reshape(-1, vocab).float()
    ce = F.cross_entropy(s, target, ignore_index=IGNORE, reduction="none")
    mine = F.log_softmax(s / t, -1)
    width = vocab if top_ids is None else top_ids.shape[-1]
    if top_ids is not None:  # the student's log-probabilities of the teacher's top k
        mine = mine.gather(-1, top_ids.reshape(-1, width))
    theirs = F.log_softmax(teacher.reshape(-1, width).float() / t, -1)
    soft = F.kl_div(mine, theirs, reduction="none", log_target=True).sum(-1)
    trained = target != IGNORE  # (cross-entropy is 0 there already; the soft term is not)
    per = loss.alpha * t * t * soft + (1 - loss.alpha) * ce
    return per.where(trained, 0.0).sum(), ce.sum()


class TeacherPass(Pass):
    """The teacher's top `k` logits of every token (`teacher_ids`, `teacher_logits`: the
    token ids as int32 and the logits as fp16, `TOP_BYTES` each), the teacher forward only
    in the compute dtype, as the step would run it online."""

    name = "teacher"

    def __init__(self, teacher: ExtraModel, k: int) -> None:
        self.model, self.k = teacher, k
        self.outputs = (Output("teacher_ids", "int32", k), Output("teacher_logits", "float16", k))

    def key(self) -> dict[str, Any]:
        assert self.model is not None
        return {"teacher": self.model.source, "config": self.model.config, "k": self.k}

    def compute(self, model: Any, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from frugal.step.forward import forward

        top = forward(model, b).logits.float().topk(self.k, dim=-1)
        return {"teacher_ids": top.indices.int(), "teacher_logits": top.values.half()}


class Distill(Causal):
    name = "distill"
    fields: ClassVar[tuple[str, ...]] = ("teacher", "teacher_logits", "teacher_top_k")
    training_fields: ClassVar[tuple[str, ...]] = ("distill_alpha", "distill_temperature")
    chunked_loss = False  # the soft targets read whole logits
    shards = False  # the teacher's forward is not run sharded yet
    eval_names: ClassVar[tuple[str, ...]] = ("label_loss",)
    headline_metrics: ClassVar[tuple[str, ...]] = ("label_loss",)

    def check(self, job: JobFields) -> None:
        if not job.teacher:
            raise ValueError(
                "--task distill needs --teacher MODEL: a bundled id or a directory with its "
                "weights, of the student's tokenizer"
            )
        if job.loss != "ce":
            raise ValueError(
                "--loss ce+contrastive is not mixed with distillation's soft targets: use --loss ce"
            )
        if job.loss_chunks:
            raise ValueError(
                "--loss-chunks: distillation reads the student's and the teacher's whole "
                "logits: use --loss-chunks 0"
            )
        if job.teacher_logits == "online" and job.teacher_top_k != TOP_K:
            raise ValueError(
                "--teacher-top-k is how many precomputed teacher logits are kept: add "
                "--teacher-logits precomputed, or drop --teacher-top-k"
            )

    def passes(self, job: JobFields) -> tuple[TeacherPass, ...]:
        if job.teacher_logits != "precomputed":
            return ()
        return (TeacherPass(self.teacher(job), job.teacher_top_k),)

    def check_model(self, job: JobFields, config: dict[str, Any]) -> None:
        """The teacher's vocabulary is the student's, and holds the top k kept of it."""
        assert job.teacher
        same_vocabulary(config, job.teacher)
        vocab = int(teacher_config(job.teacher)["vocab_size"])
        if job.teacher_logits == "precomputed" and job.teacher_top_k > vocab:
            raise FrugalError(
                f"--teacher-top-k {job.teacher_top_k}: the teacher's vocabulary is "
                f"{vocab:,} tokens: give that many or fewer"
            )

    def teacher(self, job: JobFields) -> ExtraModel:
        """The teacher, as the step's builder makes it (a causal LM, forward only)."""
        assert job.teacher
        return ExtraModel("checkpoint", job.teacher, teacher_config(job.teacher), "teacher")

    def extra_model(self, job: JobFields) -> ExtraModel | None:
        """The teacher, where the step runs it (none where its logits were precomputed:
        the pass before training runs it instead)."""
        return None if job.teacher_logits == "precomputed" else self.teacher(job)

    def loss(self, job: JobFields, given: Mapping[str, Any]) -> Loss:
        named = given_settings(given, alpha="distill_alpha", temperature="distill_temperature")
        return DistillLoss(**named)

    def min_depth(self, job: JobFields, layers: int) -> int:
        assert job.teacher
        if job.teacher_logits == "precomputed":
            return 1
        return max(1, layers - int(teacher_config(job.teacher)["num_hidden_layers"]) + 1)

    def profile_extra(self, job: JobFields) -> dict[str, Any]:
        """The teacher by its config (a local directory's may change under its name), where
        the step runs it."""
        assert job.teacher
        if job.teacher_logits == "precomputed":
            return {}
        blob = json.dumps(teacher_config(job.teacher), sort_keys=True).encode()
        return {"teacher": hashlib.sha256(blob).hexdigest()[:16]}

    def micro_loss(
        self, m: LossInputs, b: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s, _ = self._sums(m, b)
        return s * m.scale(), s

    def eval_sums(self, m: LossInputs, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss, its tokens, and the labels' cross-entropy alone (`label_loss`: the
        student's loss as a causal LM's, comparable with one trained on labels alone)."""
        import torch

        from frugal.step.loss import IGNORE

        s, ce = self._sums(m, b)
        n = (b["labels"][:, 1:] != IGNORE).sum()
        return torch.stack([s.double(), n.double(), ce.double()]).cpu()

    def metrics(self, sums: dict[str, float], count: float) -> dict[str, float]:
        if "label_loss" not in sums:
            return {}
        return {"label_loss": sums["label_loss"] / max(count, 1.0)}

    @staticmethod
    def _sums(m: LossInputs, b: dict[str, torch.Tensor]) -> tuple[Any, Any]:
        import torch

        from frugal.step.forward import forward

        if "teacher_ids" in b:  # precomputed: the teacher's top k of each token
            top = b["teacher_logits"], b["labels"], m.loss, b["teacher_ids"]
            return distill_loss(forward(m.model, b).logits, *top)
        with torch.no_grad():  # first: its activations are gone before the student's
            teacher = forward(m.extra, b).logits
        return distill_loss(forward(m.model, b).logits, teacher, b["labels"], m.loss)

    def note(self, job: JobFields, vocab_size: int) -> str | None:
        if job.teacher_logits == "precomputed":
            return (
                f"the teacher {job.teacher}'s top {job.teacher_top_k} logits of every token "
                f"come from one pass before training, on disk ({TOP_BYTES} bytes each): no "
                "teacher in the step"
            )
        return (
            f"the teacher {job.teacher} runs forward only, in the compute dtype (in "
            "frozen_weights), and its logits are held beside the student's for the loss; "
            "--teacher-logits precomputed moves its forward into one pass before training"
        )

    def upfront(self, job: JobFields) -> dict[str, Any] | None:
        return {"teacher_logits": "precomputed"} if job.teacher_logits == "online" else None

    def upfront_why(self, job: JobFields) -> str:
        return (
            f"the teacher's weights leave memory and its forward leaves every step; its top "
            f"{job.teacher_top_k} logits of every token are kept on disk"
        )

    def headline(self, job: JobFields) -> str | None:
        return f"distilled from {job.teacher}"
