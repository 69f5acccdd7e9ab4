"""One label per text: rows of `text` (or `text_a`/`text_b`) and `label`, each padded to
its micro-batch's longest (never packed: the label is the row's); a new linear head of
`num_labels` outputs reads each row's last token that is not padding, so the step makes no
logits over the vocabulary. The loss is the cross-entropy over the classes, weighted per
class when asked; evaluation adds the confusion matrix (`data.labels.class_metrics`).
torch and the step's modules are imported where the step runs (as in `causal.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from frugal.step.tasks.base import JobFields, Loss, LossInputs, Rule, Task

if TYPE_CHECKING:
    import torch

EVERY_METHOD: dict[str, Rule] = {
    "schedule": ("linear", "linear decay after warm-up", "bert"),
    "warmup_ratio": (0.06, "6% of the steps warm up", "lora"),
    "effective_batch": (32, "32 examples a step", "bert"),
    "epochs": (3.0, "3 passes, the middle of BERT's 2 to 4", "bert"),
}


@dataclass(frozen=True)
class ClassLoss(Loss):
    """A classifier's loss: the cross-entropy over its classes, each class's rows weighted
    by `class_weights` (none: equally)."""

    class_weights: tuple[float, ...] = ()


class Classification(Task):
    name = "classification"
    what = "sequence classifier"
    auto_class = "AutoModelForSequenceClassification"
    auto_mapping = "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"
    # PEFT trains and saves the new head (`score`) whole, beside the adapters
    peft_task_type = "SEQ_CLS"
    fields: ClassVar[tuple[str, ...]] = ("num_labels",)
    training_fields: ClassVar[tuple[str, ...]] = ("best_metric", "class_weights")
    headline_metrics: ClassVar[tuple[str, ...]] = ("accuracy", "macro_f1")
    packs = False
    chunked_loss = False
    default_model = "meta-llama/Llama-3.2-1B"

    def check(self, job: JobFields) -> None:
        """What a classification step cannot be: a loss over next tokens."""
        if job.loss != "ce":
            raise ValueError(
                "--loss ce+contrastive is a next-token loss: a classifier's loss is its "
                "cross-entropy over classes (--loss ce)"
            )
        if job.loss_chunks:
            raise ValueError(
                "--loss-chunks splits the logits over the vocabulary, which a classifier does "
                "not make: use --loss-chunks 0"
            )

    def hf_config(self, d: dict[str, Any], job: JobFields) -> None:
        d["num_labels"] = job.num_labels
        for names in ("id2label", "label2id"):  # a causal model's, if any
            d.pop(names, None)
        # the head reads the last token that is not padding, found by the pad id (the
        # trainer sets its tokenizer's; without one, a micro-batch of 2 rows is refused)
        d["pad_token_id"] = d.get("pad_token_id") if d.get("pad_token_id") is not None else 0

    def pretrained_kwargs(self, job: JobFields, cfg: Any) -> dict[str, Any]:
        return {"num_labels": job.num_labels, "pad_token_id": cfg.pad_token_id}

    def logits_width(self, job: JobFields, config: dict[str, Any]) -> int:
        return job.num_labels

    def example(self, job: JobFields, rows: int, seq: int) -> dict[str, torch.Tensor]:
        import torch

        from frugal.step.batch import layout

        z = torch.zeros((rows, seq), dtype=torch.long)
        return layout(z, torch.zeros(rows, dtype=torch.long), z.clone(), z.clone(), False)

    def loss(self, job: JobFields, given: Mapping[str, Any]) -> ClassLoss:
        """`given["class_weights"]`: each class's weight, from the training rows (the run
        config's `balanced`); none: equal."""
        return ClassLoss(tuple(given.get("class_weights") or ()))

    def micro_loss(
        self, m: LossInputs, b: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        from frugal.step.forward import forward
        from frugal.step.loss import classification_loss

        loss: ClassLoss = m.loss
        weight = torch.tensor(loss.class_weights) if loss.class_weights else None
        ce_sum = classification_loss(forward(m.model, b).logits, b["labels"], weight)[0]
        return ce_sum * m.scale(), ce_sum

    def count(self, b: dict[str, torch.Tensor], loss: Loss) -> float:
        """Its rows, each weighted by its class's weight when weighted."""
        import torch

        assert isinstance(loss, ClassLoss)
        labels = b["labels"]
        if not loss.class_weights:
            return float(labels.numel())
        return float(torch.tensor(loss.class_weights)[labels].sum())

    def eval_sums(self, m: LossInputs, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The unweighted loss, its rows, and the confusion matrix [true][said] by row."""
        import torch

        from frugal.step.forward import forward
        from frugal.step.loss import classification_loss

        logits = forward(m.model, b).logits
        s, n = classification_loss(logits, b["labels"])
        k = logits.shape[-1]
        said = torch.bincount(b["labels"] * k + logits.argmax(-1), minlength=k * k)
        return torch.cat([torch.stack([s.double(), n.double()]), said.double()])

    def eval_width(self, classes: int) -> int:
        return classes * classes

    def headline(self, job: JobFields) -> str | None:
        return f"classifier of {job.num_labels} classes"

    def note(self, job: JobFields, vocab_size: int) -> str | None:
        """Why a classifier's step holds next to nothing for logits."""
        return (
            f"a classifier's head has {job.num_labels} outputs where the LM head has "
            f"{vocab_size:,}: no logits over the vocabulary, so logits and loss take almost "
            "nothing (a causal-LM step of the same batch holds them in fp32 for the loss)"
        )

    def settings(self, method: str, params: int) -> dict[str, Rule]:
        """BERT's fine-tuning grid, and LoRA's sentiment recipe for adapters."""
        if method == "full":
            return {
                "learning_rate": (2e-5, "the low end of BERT's classification grid", "bert"),
                **EVERY_METHOD,
            }
        return {
            "lora_targets": ("all-linear", "adapters on every linear layer", "qlora"),
            "lora_r": (8, "rank 8 for a sentiment classifier", "lora"),
            "lora_alpha": (16, "alpha 16 with rank 8", "lora"),
            "lora_dropout": (
                0.0,
                "no dropout, which keeps a copy of each adapted layer's input in memory",
                "frugal",
            ),
            "learning_rate": (4e-4, "4e-4 for adapters on a classifier", "lora"),
            **EVERY_METHOD,
        }
