"""Next-token prediction through the LM head: chat, completion or plain text rows, packed
or padded; the loss is the summed token cross-entropy (plain, or chunked from the last
hidden states), plus SimCTG's contrastive term when configured.

torch and the step's modules are imported in the functions that run the step: the CLI
reads a task's rules without them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from frugal.step.tasks.base import JobFields, Loss, LossInputs, Rule, Task, given_settings

if TYPE_CHECKING:
    import torch

FULL_LARGE_B = 10e9  # Alpaca's recipe changes between its 7B and 13B models
LARGE_B = 20e9  # QLoRA's between its 13B and 33B models


@dataclass(frozen=True)
class TokenLoss(Loss):
    """A causal LM's loss: the summed token cross-entropy, computed from the last hidden
    states in `chunks` chunks of tokens when set (`chunked_ce`: the whole logits tensor
    never exists), plus SimCTG's contrastive term at `weight` and `margin` when
    `contrastive`."""

    chunks: int = 0
    contrastive: bool = False
    weight: float = 1.0
    margin: float = 0.5


def lm_example(rows: int, seq: int, packed: bool) -> dict[str, torch.Tensor]:
    """A micro-batch of token rows, its labels the tokens themselves."""
    import torch

    from frugal.step.batch import layout

    z = torch.zeros((rows, seq), dtype=torch.long)
    return layout(z, z.clone(), z.clone(), z.clone(), packed)


def token_ce(
    model: Any, b: dict[str, torch.Tensor], loss: TokenLoss
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The forward and its summed cross-entropy (plain, or chunked from the hidden states);
    with the contrastive term, also the last hidden states."""
    import torch

    from frugal.step.batch import model_inputs
    from frugal.step.chunked_ce import chunked_linear_cross_entropy
    from frugal.step.forward import forward, last_hidden, lm_head
    from frugal.step.loss import causal_lm_loss

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


class Causal(Task):
    name = "causal"
    what = "causal language model"
    auto_class = "AutoModelForCausalLM"
    auto_mapping = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
    peft_task_type = "CAUSAL_LM"
    rank_grows_with_data = True

    def example(self, job: JobFields, rows: int, seq: int) -> dict[str, torch.Tensor]:
        return lm_example(rows, seq, job.packing)

    def loss(self, job: JobFields, given: Mapping[str, Any]) -> Loss:
        named = given_settings(given, weight="contrastive_weight", margin="contrastive_margin")
        return TokenLoss(job.loss_chunks, job.loss == "ce+contrastive", **named)

    def micro_loss(
        self, m: LossInputs, b: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from frugal.step.loss import contrastive_loss

        loss: TokenLoss = m.loss
        hidden, ce_sum = token_ce(m.model, b, loss)
        total = ce_sum * m.scale()
        if hidden is not None:
            cl_sum, _ = contrastive_loss(hidden, b["labels"], b["segment_ids"], loss.margin)
            total = total + cl_sum * (m.scale("cl") * loss.weight)
            m.totals["cl"] += cl_sum.detach()
        return total, ce_sum

    def count(self, b: dict[str, torch.Tensor], loss: Loss) -> float:
        """Its predicted tokens."""
        from frugal.step.loss import IGNORE

        return float((b["labels"][:, 1:] != IGNORE).sum())

    def eval_sums(self, m: LossInputs, b: dict[str, torch.Tensor]) -> torch.Tensor:
        import torch

        from frugal.step.forward import forward
        from frugal.step.loss import causal_lm_loss

        s, n = causal_lm_loss(forward(m.model, b).logits, b["labels"])
        return torch.stack([s.double(), n.double()])

    def settings(self, method: str, params: int) -> dict[str, Rule]:
        """QLoRA's recipe for adapters, Alpaca's and Llama 2's for full fine-tuning."""
        size = f"{params / 1e9:.1f}B parameters"
        if method == "full":
            large = params > FULL_LARGE_B
            return {
                "learning_rate": (
                    1e-5 if large else 2e-5,
                    f"full fine-tuning of {size}: {'13B' if large else '7B'}-class rate",
                    "alpaca",
                ),
                "schedule": ("cosine", "cosine decay after warm-up", "alpaca"),
                "warmup_ratio": (0.03, "3% of the steps warm up", "alpaca"),
                "effective_batch": (
                    16,
                    "16 sequences a step, as the adapters' recipe, so "
                    "methods compare step for step (Llama 2's SFT took 64)",
                    "qlora",
                ),
            }
        large = params > LARGE_B
        return {
            "lora_targets": (
                "all-linear",
                "adapters on every linear layer, the MLP's too: needed to match full fine-tuning",
                "qlora",
            ),
            "lora_r": (
                16,
                "the rank mattered little once every linear layer had adapters; "
                "16 keeps the adapter and its optimizer state small",
                "qlora",
            ),
            "lora_alpha": (
                32,
                "fixed at 32, the best learning rate hardly moves with the rank",
                "regret",
            ),
            "lora_dropout": (
                0.0,
                "no dropout, which keeps a copy of each adapted layer's "
                "input in memory (QLoRA used 0.1 up to 13B, 0.05 above)",
                "frugal",
            ),
            "learning_rate": (
                1e-4 if large else 2e-4,
                f"adapters on {size}: about 10x full "
                f"fine-tuning's rate, QLoRA's "
                f"{'from 33B' if large else 'to 13B'}",
                "qlora",
            ),
            "schedule": ("cosine", "cosine decay after warm-up", "alpaca"),
            "warmup_ratio": (0.03, "3% of the steps warm up", "qlora"),
            "effective_batch": (16, "16 sequences a step (4 x 4)", "qlora"),
        }
