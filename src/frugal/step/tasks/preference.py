"""Preference tuning: the policy learns to prefer a chosen completion of a prompt over a
rejected one (DPO, IPO, ORPO, SimPO), or a desirable completion over an undesirable one
(KTO's unpaired rows), in the one step the estimate simulates.

A micro-batch of b pairs is 2b padded rows: the b chosen sequences (prompt + completion),
then the b rejected ones (for KTO: the b rows, then the b mismatched rows that estimate
its KL term, each row's prompt with the next row's completion). `labels` mark the
completion's tokens; the policy's log-probability of a completion is the sum of its
tokens' log-probabilities (`sequence_logps`).

The reference model, where the method has one (DPO, IPO, KTO), is by `job.reference`:
- `auto`: the policy itself with its adapter off (LoRA and QLoRA: no second copy of the
  weights), or, for full fine-tuning, a frozen copy in the compute dtype (`reference`);
- `precomputed`: its log-probabilities of every row, computed in one pass before training
  and carried by the batch (`ref_logps`): no copy and no reference forward in the step.
ORPO and SimPO have none.

Losses, per pair, with w the chosen and l the rejected completion, log pi summed over the
completion's tokens, mean-log pi its average, and h = log pi(w) - log pi_ref(w) -
(log pi(l) - log pi_ref(l)):
- DPO (Rafailov et al. 2023, arXiv:2305.18290, eq. 7): -log sigma(beta h).
- IPO (Azar et al. 2023, arXiv:2310.12036, eq. 17): (h - 1 / (2 beta))^2, with h of the
  average token log-probabilities, as TRL's `ipo` loss computes it.
- SimPO (Meng et al. 2024, arXiv:2405.14734, eq. 6): -log sigma(beta (mean-log pi(w) -
  mean-log pi(l)) - gamma); no reference.
- ORPO (Hong et al. 2024, arXiv:2403.07691, eq. 6-7): -mean-log pi(w) - beta log sigma(
  log odds(w) - log odds(l)), odds(y) = p / (1 - p) with p = exp(mean-log pi(y)); the
  supervised term is each pair's own mean over its chosen tokens; no reference.
- KTO (Ethayarajh et al. 2024, arXiv:2402.01306, eq. 8): r = log pi(y) - log pi_ref(y),
  z = max(0, mean over the micro-batch's mismatched rows of their r), not differentiated;
  a desirable row: lambda_D (1 - sigma(beta (r - z))), an undesirable one:
  lambda_U (1 - sigma(beta (z - r))).
The step's loss is the sum over pairs (KTO: rows) divided by their number (`count`).
Implicit rewards are beta (log pi - log pi_ref) (SimPO and ORPO: beta mean-log pi); the
trainer reports their mean for chosen and rejected, the margin and the share of pairs
whose chosen reward is higher.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from frugal.step.tasks.base import (
    ExtraModel,
    JobFields,
    Loss,
    LossInputs,
    Output,
    Pass,
    Rule,
    Task,
    given_settings,
)

if TYPE_CHECKING:
    import torch

STATS = ("chosen_reward", "rejected_reward", "correct", "kl", "desirable")  # summed per step
PREFERENCE_METRICS = (  # what `Preference.metrics` makes of them
    "preference_accuracy",
    "reward_margin",
    "reward_chosen",
    "reward_rejected",
    "reward_desirable",
    "reward_undesirable",
    "kl",
)


@dataclass(frozen=True)
class Logps:
    """A micro-batch's log-probabilities of its completions, chosen rows first, then the
    rejected ones (KTO: its rows, then the mismatched ones): the policy's summed (`sum`)
    over each completion's `n` tokens and their average (`mean`), and the reference's
    summed (`ref`; None for a method without one)."""

    sum: torch.Tensor
    n: torch.Tensor
    ref: Any

    @property
    def half(self) -> int:
        return int(self.sum.shape[0] // 2)

    @cached_property
    def mean(self) -> torch.Tensor:
        return self.sum / self.n.clamp(min=1)


class Method:
    """A preference method (the module doc's formulas): whether its rows are pairs, whether
    it reads a reference model, its paper's beta (as TRL sets it), and its loss."""

    name: ClassVar[str]
    beta: ClassVar[float] = 0.1
    paired: ClassVar[bool] = True  # chosen and rejected pairs (KTO: unpaired rows)
    reference_free: ClassVar[bool] = False

    def gamma(self, beta: float) -> float:
        """Its target reward margin's default (SimPO's; the others have none)."""
        return 0.0

    def losses(
        self, lp: Logps, loss: PreferenceLoss, b: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Each pair's loss, and the micro-batch's reward sums by name (`STATS`)."""
        lp.mean  # noqa: B018 (first: the step computes it before any method's terms)
        per, reward = self.scores(lp, loss)
        chosen, rejected = reward.detach()[: lp.half], reward.detach()[lp.half :]
        return per, {
            "chosen_reward": chosen.sum(),
            "rejected_reward": rejected.sum(),
            "correct": (chosen > rejected).sum().to(chosen.dtype),
        }

    def scores(self, lp: Logps, loss: PreferenceLoss) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's loss and each row's implicit reward."""
        raise NotImplementedError


class DPO(Method):
    name = "dpo"

    def scores(self, lp: Logps, loss: PreferenceLoss) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.nn.functional as F

        h = lp.sum - lp.ref
        per = -F.logsigmoid(loss.beta * (h[: lp.half] - h[lp.half :]))
        return per, loss.beta * (lp.sum - lp.ref)


class IPO(Method):
    name = "ipo"

    def scores(self, lp: Logps, loss: PreferenceLoss) -> tuple[torch.Tensor, torch.Tensor]:
        h = lp.mean - lp.ref / lp.n.clamp(min=1)  # of the average token log-probabilities
        per = (h[: lp.half] - h[lp.half :] - 1 / (2 * loss.beta)) ** 2
        return per, loss.beta * (lp.sum - lp.ref)


class SimPO(Method):
    name = "simpo"
    beta = 2.0  # its Llama-3 and Mistral base recipes
    reference_free = True

    def gamma(self, beta: float) -> float:
        return beta / 2  # as its recipes set it

    def scores(self, lp: Logps, loss: PreferenceLoss) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.nn.functional as F

        reward = loss.beta * lp.mean
        return -F.logsigmoid(reward[: lp.half] - reward[lp.half :] - loss.gamma), reward


class ORPO(Method):
    name = "orpo"
    reference_free = True

    def scores(self, lp: Logps, loss: PreferenceLoss) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.nn.functional as F

        reward = loss.beta * lp.mean
        odds = lp.mean - _log1mexp(lp.mean)  # log odds of the average token probability
        per = -lp.mean[: lp.half] - loss.beta * F.logsigmoid(odds[: lp.half] - odds[lp.half :])
        return per, reward


class KTO(Method):
    name = "kto"
    paired = False

    def losses(
        self, lp: Logps, loss: PreferenceLoss, b: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Each row's loss against the KL estimate of the mismatched rows (eq. 8)."""
        import torch

        good = b["desirable"].bool()
        r = lp.sum[: lp.half] - lp.ref[: lp.half]
        z = (lp.sum[lp.half :] - lp.ref[lp.half :]).detach().mean().clamp(min=0)  # the KL
        sig = torch.sigmoid(loss.beta * torch.where(good, r - z, z - r))
        weight = torch.where(good, loss.desirable_weight, loss.undesirable_weight)
        reward = loss.beta * r.detach()
        return weight * (1 - sig), {
            "chosen_reward": torch.where(good, reward, 0.0).sum(),
            "rejected_reward": torch.where(good, 0.0, reward).sum(),
            "kl": z * lp.half,
            "desirable": good.sum().to(reward.dtype),
        }


METHODS: dict[str, Method] = {m.name: m for m in (DPO(), IPO(), ORPO(), SimPO(), KTO())}


@dataclass(frozen=True)
class PreferenceLoss(Loss):
    """Preference tuning's loss: its `method` at `beta` (SimPO's `gamma`, KTO's weights of
    desirable and undesirable rows), against the reference `reference` says: none, the
    model with its adapter off, a frozen copy (the step's extra model), or precomputed
    log-probabilities the batch carries (`ref_logps`)."""

    method: Method = METHODS["dpo"]
    beta: float = 0.1
    gamma: float = 0.0
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    reference: str = "adapter-off"


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed log-probability of its labelled tokens (position t predicts
    labels[t + 1], as in `loss.causal_lm_loss`), in fp32, and how many tokens it summed."""
    import torch.nn.functional as F

    from frugal.step.loss import IGNORE

    rows, width, vocab = logits.shape
    target = F.pad(labels[:, 1:], (0, 1), value=IGNORE)
    nll = F.cross_entropy(
        logits.reshape(-1, vocab).float(),
        target.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    return -nll.view(rows, width).sum(-1), (target != IGNORE).sum(-1)


def policy_logps(model: Any, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    from frugal.step.forward import forward

    return sequence_logps(forward(model, b).logits, b["labels"])


def reference_logps(m: LossInputs, b: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The reference model's log-probabilities of the rows, by the loss's `reference`:
    none, carried by the batch (precomputed), from the frozen copy, or from the policy with
    its adapter off; never differentiated."""
    import torch

    loss: PreferenceLoss = m.loss
    if loss.reference == "none":
        return None
    if loss.reference == "precomputed":
        return b["ref_logps"]
    with torch.no_grad():
        if loss.reference == "copy":
            return policy_logps(m.extra, b)[0]
        inner = getattr(m.model, "module", m.model)  # DDP
        with inner.disable_adapter():
            return policy_logps(inner, b)[0]


class Preference(Task):
    name = "preference"
    what = "causal language model"
    auto_class = "AutoModelForCausalLM"
    auto_mapping = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
    peft_task_type = "CAUSAL_LM"
    fields: ClassVar[tuple[str, ...]] = ("preference", "reference")
    training_fields: ClassVar[tuple[str, ...]] = (
        "beta",
        "simpo_gamma",
        "kto_desirable_weight",
        "kto_undesirable_weight",
    )
    packs = False
    rows = "pairs"
    chunked_loss = False  # each sequence's log-probability from whole logits
    sequences_per_row = 2  # chosen and rejected (KTO: the row and its mismatched one)
    shards = False  # the reference's forward is not run under FSDP yet

    def check(self, job: JobFields) -> None:
        if job.loss != "ce":
            raise ValueError(
                "--loss ce+contrastive is a next-token loss: preference tuning's loss is its "
                "method's (--loss ce)"
            )
        if job.loss_chunks:
            raise ValueError(
                "--loss-chunks: preference tuning reads each sequence's log-probability from "
                "whole logits: use --loss-chunks 0"
            )
        if job.reference == "precomputed" and METHODS[job.preference].reference_free:
            raise ValueError(
                f"--reference precomputed: {job.preference.upper()} has no reference model: "
                "drop --reference"
            )

    def mode(self, job: JobFields) -> str:
        """Where the reference comes from, decided here alone (the loss, the extra model,
        the pass and the notes read it): none, adapter-off, copy or precomputed."""
        if METHODS[job.preference].reference_free:
            return "none"
        if job.reference == "precomputed":
            return "precomputed"
        return "copy" if job.method == "full" else "adapter-off"

    def loss(self, job: JobFields, given: Mapping[str, Any]) -> PreferenceLoss:
        """The method's beta and gamma where the run config gives none."""
        method = METHODS[job.preference]
        beta = given.get("beta") or method.beta
        gamma = given.get("simpo_gamma")
        weights = given_settings(
            given,
            desirable_weight="kto_desirable_weight",
            undesirable_weight="kto_undesirable_weight",
        )
        return PreferenceLoss(
            method,
            beta,
            method.gamma(beta) if gamma is None else gamma,
            reference=self.mode(job),
            **weights,
        )

    def extra_model(self, job: JobFields) -> ExtraModel | None:
        """A full fine-tune's reference: a frozen copy of the policy as built."""
        return ExtraModel("copy") if self.mode(job) == "copy" else None

    def example(self, job: JobFields, rows: int, seq: int) -> dict[str, torch.Tensor]:
        import torch

        from frugal.step.batch import layout

        z = torch.zeros((2 * rows, seq), dtype=torch.long)
        b = layout(z, z.clone(), z.clone(), z.clone(), False)
        if not METHODS[job.preference].paired:  # KTO's
            b["desirable"] = torch.zeros(rows, dtype=torch.long)
        return b

    def passes(self, job: JobFields) -> tuple[ReferencePass, ...]:
        return (ReferencePass(),) if self.mode(job) == "precomputed" else ()

    def micro_loss(
        self, m: LossInputs, b: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        per, stats = pair_losses(m, b)
        for k, v in stats.items():
            m.totals[k] = m.totals[k] + v if k in m.totals else v
        s = per.sum()
        return s * m.scale(), s

    def count(self, b: dict[str, torch.Tensor], loss: Loss) -> float:
        """Its pairs (KTO: its rows): half the sequences."""
        return float(b["input_ids"].shape[0] // 2)

    def eval_sums(self, m: LossInputs, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss, the pairs, and the rewards' sums (`STATS`)."""
        import torch

        per, stats = pair_losses(m, b)
        sums = [per.sum(), torch.tensor(b["input_ids"].shape[0] // 2)]
        sums += [stats.get(k, torch.zeros(())) for k in STATS]
        return torch.stack([v.detach().double().cpu() for v in sums])

    eval_names = STATS
    headline_metrics = PREFERENCE_METRICS

    def metrics(self, sums: dict[str, float], count: float) -> dict[str, float]:
        """What the trainer logs of a step's or an evaluation's reward sums: the mean reward
        of the chosen (KTO: desirable) and rejected (undesirable) completions, their margin,
        the share of pairs the policy prefers as the data does (KTO: the KL estimate)."""
        if sums.get("desirable"):  # KTO: unpaired rows
            good, bad = sums["desirable"], max(count - sums["desirable"], 0.0)
            chosen = sums["chosen_reward"] / max(good, 1.0)
            rejected = sums["rejected_reward"] / max(bad, 1.0)
            return {
                "reward_desirable": chosen,
                "reward_undesirable": rejected,
                "reward_margin": chosen - rejected,
                "kl": sums["kl"] / max(count, 1.0),
            }
        n = max(count, 1.0)
        chosen, rejected = sums["chosen_reward"] / n, sums["rejected_reward"] / n
        return {
            "reward_chosen": chosen,
            "reward_rejected": rejected,
            "reward_margin": chosen - rejected,
            "preference_accuracy": sums["correct"] / n,
        }

    def headline(self, job: JobFields) -> str | None:
        return f"{job.preference.upper()}, reference {self.mode(job)}"

    def note(self, job: JobFields, vocab_size: int) -> str | None:
        """What the reference costs, and what would be cheaper."""
        mode = self.mode(job)
        if mode == "none":
            return (
                f"{job.preference.upper()} has no reference model: one forward of the "
                "chosen and rejected sequences a step"
            )
        if mode == "copy":
            return (
                "the reference is a frozen copy of the model in the compute dtype (in "
                "frozen_weights) and one more forward a step; --reference precomputed "
                "drops both for one forward pass over the data before training"
            )
        if mode == "adapter-off":
            return (
                "the reference is the model with its adapter off: no second copy of the "
                "weights, one more forward a step; --reference precomputed drops that "
                "forward for one pass over the data before training (cheaper from the "
                "second epoch on)"
            )
        return (
            "reference log-probabilities computed in one forward pass over the data "
            "before training: no copy and no reference forward in the step"
        )

    def upfront(self, job: JobFields) -> dict[str, Any] | None:
        return {"reference": "precomputed"} if self.mode(job) in ("copy", "adapter-off") else None

    def upfront_why(self, job: JobFields) -> str:
        if self.mode(job) == "copy":
            return "the reference's frozen copy leaves memory and its forward leaves every step"
        return "the reference's forward (the model with its adapter off) leaves every step"

    def settings(self, method: str, params: int) -> dict[str, Rule]:
        """Zephyr's DPO recipe (Tunstall et al. 2023, arXiv:2310.16944): 5e-7 for full
        fine-tuning; adapters 10x full's rate, as for supervised tuning."""
        every: dict[str, Rule] = {
            "schedule": ("linear", "linear decay after warm-up, as Zephyr's DPO", "zephyr"),
            "warmup_ratio": (0.1, "10% of the steps warm up", "zephyr"),
            "effective_batch": (32, "32 pairs a step", "zephyr"),
            "epochs": (1.0, "one pass: preference tuning over-fits its pairs in a few", "zephyr"),
        }
        if method == "full":
            return {"learning_rate": (5e-7, "Zephyr's full DPO rate", "zephyr"), **every}
        return {
            "lora_targets": ("all-linear", "adapters on every linear layer", "qlora"),
            "lora_r": (16, "rank 16, as the supervised recipe", "qlora"),
            "lora_alpha": (32, "fixed at 32", "regret"),
            "lora_dropout": (
                0.0,
                "no dropout, which keeps a copy of each adapted layer's input in memory",
                "frugal",
            ),
            "learning_rate": (5e-6, "about 10x the full rate for adapters", "regret"),
            **every,
        }


class ReferencePass(Pass):
    """The reference's log-probabilities of every row's two sequences (`ref_logps`), by
    the policy as built, its adapter off (a full fine-tune's: the weights before
    training), in fp32."""

    name = "reference"
    outputs = (Output("ref_logps", "float32"),)

    def context(self, model: Any) -> Any:
        off = getattr(model, "disable_adapter", None)
        return off() if off is not None else contextlib.nullcontext()

    def compute(self, model: Any, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        import torch

        logp = policy_logps(model, b)[0].double()
        half = logp.shape[0] // 2
        return {"ref_logps": torch.stack([logp[:half], logp[half:]], dim=1)}


def pair_losses(
    m: LossInputs, b: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Each pair's (KTO: row's) loss, and the micro-batch's reward sums by name (`STATS`)."""
    loss: PreferenceLoss = m.loss
    ref = reference_logps(m, b)
    logp, n = policy_logps(m.model, b)
    return loss.method.losses(Logps(logp, n, ref), loss, b)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate near 0 and far from it (Maechler 2012)."""
    import torch

    x = x.clamp(max=-1e-6)
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))
