"""The training settings a plan chooses, each with a one-line reason and its source.

LoRA's rank, alpha, dropout and target modules, the learning rate, its schedule and warm-
up, the epochs and the effective batch follow from the model's size, the method, the task
(each task's recipes are in its module, `step/tasks/`, citing the sources below) and the
data's size. A setting the user gave is kept and shown as theirs. The rules repeat what
published recipes used; none of them is a claim that a setting trains a better model than
another (docs/train.md, "Settings").

Sources:
- `qlora`: Dettmers et al. 2023, QLoRA (arXiv:2305.14314), and its Guanaco scripts
  (github.com/artidoro/qlora, scripts/finetune_guanaco_{7b,65b}.sh): adapters on every
  linear layer, r 64, alpha 16, dropout 0.1 up to 13B and 0.05 from 33B, learning rate
  2e-4 up to 13B and 1e-4 from 33B, 3% warm-up, 4 x 4 = 16 sequences a step. It found the
  rank mattered little once every linear layer had adapters.
- `regret`: Schulman et al. 2025, "LoRA Without Regret" (Thinking Machines): LoRA's best
  learning rate is about 10x full fine-tuning's; adapters belong on the MLP layers too;
  with alpha fixed at 32 the best learning rate hardly moves with the rank; a dataset
  larger than the adapter's capacity is where a small rank falls behind.
- `alpaca`: Taori et al. 2023, Stanford Alpaca (github.com/tatsu-lab/stanford_alpaca):
  full fine-tuning of LLaMA-7B at 2e-5 (13B: 1e-5), cosine decay after 3% warm-up,
  3 epochs over 52K examples.
- `llama2`: Touvron et al. 2023, Llama 2 (arXiv:2307.09288) section 3.1: supervised
  fine-tuning at 2e-5, cosine, 64 sequences a step.

What shapes the step (the adapters, the effective batch, the epochs) does not depend on
which method is compared, so a plan that compares methods prices each on the same steps;
the learning rate and its schedule follow the method the plan recommends.
- `bert`: Devlin et al. 2019, BERT (arXiv:1810.04805) appendix A.3: classification
  fine-tuning at 2e-5 to 5e-5, 16 or 32 examples a step, 2 to 4 epochs.
- `lora`: Hu et al. 2021, LoRA (arXiv:2106.09685), and github.com/microsoft/LoRA
  examples/NLU/roberta_large_sst2.sh: sentiment classification with r 8, alpha 16,
  learning rate 4e-4, 6% warm-up.
- `zephyr`: Tunstall et al. 2023, Zephyr (arXiv:2310.16944) and its alignment-handbook
  recipe: full DPO of Mistral-7B at 5e-7, linear decay after 10% warm-up, 32 pairs a
  step, beta 0.1 (their appendix tried 1 to 3 epochs; 1 is the handbook's).
- `frugal`: frugal's own rule, from what it costs (said in the reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frugal.estimate.closed_form import model_params
from frugal.models.specs import experts_per_token, is_moe_config, routed_experts
from frugal.step.tasks import task_of
from frugal.step.tasks.base import Rule

SOURCES = {  # as an answer names them; the full references: this docstring, docs/train.md
    "qlora": "QLoRA",
    "regret": "LoRA Without Regret",
    "alpaca": "Stanford Alpaca",
    "llama2": "Llama 2",
    "bert": "BERT",
    "lora": "LoRA",
    "zephyr": "Zephyr",
    "frugal": "frugal",
}
# where each setting lives in the run config
WHERE = {
    "lora_r": "job",
    "lora_alpha": "job",
    "lora_dropout": "job",
    "lora_targets": "job",
    "learning_rate": "training",
    "schedule": "training",
    "warmup_ratio": "training",
    "effective_batch": "training",
    "epochs": "data",
}
SMALL_DATA_TOKENS = 20e6  # below: a few passes, as Alpaca's 52K examples had
LARGE_DATA_TOKENS = 1e9  # above: beyond what a rank-16 adapter was shown to hold
MIN_STEPS_PER_EPOCH = 8


@dataclass(frozen=True)
class Choice:
    """One training setting: its value, why, and whose it is."""

    name: str  # as the run config names it under `WHERE[name]`
    value: Any
    reason: str  # why frugal chose its value (for a value of yours: why it would have)
    source: str  # a key of SOURCES
    yours: bool = False  # given by the user: kept as it is
    ours: Any = None  # what frugal would have chosen, where the user gave the value

    @property
    def line(self) -> str:
        where = f"{WHERE[self.name]}.{self.name} {_shown(self.value)}"
        why = f"{self.reason} [{SOURCES[self.source]}]"
        if self.yours:
            return f"{where}: yours (frugal would choose {_shown(self.ours)}: {why})"
        return f"{where}: {why}"

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": f"{WHERE[self.name]}.{self.name}",
            "value": self.value,
            "reason": self.reason,
            "source": SOURCES[self.source],
            "yours": self.yours,
            **({"frugal_would_choose": self.ours} if self.yours else {}),
        }


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def choose(
    config: dict[str, Any],
    method: str,
    task: str,
    tokens: float,
    seq: int,
    given: dict[str, Any],
) -> list[Choice]:
    """The settings of a fine-tune of the model of `config` with `method` ("full", "lora",
    "qlora") on `tokens` tokens an epoch in sequences of `seq`; `given`: the user's
    settings by name (None: not given)."""
    params = model_params(config)
    rules = task_of(task).settings(method, params)  # the task's recipes (`step/tasks/`)
    if "lora_targets" in rules and is_moe_config(config):
        rules["lora_targets"] = _moe_targets(config, method, given)
    if "epochs" not in rules:
        rules["epochs"] = _epochs(tokens)
    chosen: dict[str, Choice] = {}
    for name, (value, reason, source) in rules.items():
        chosen[name] = Choice(name, value, reason, source)
    if (
        method != "full"
        and task_of(task).rank_grows_with_data
        and tokens * _value(chosen, given, "epochs") > (LARGE_DATA_TOKENS)
    ):
        chosen["lora_r"] = Choice(
            "lora_r",
            64,
            "a dataset this large can outgrow a rank-16 adapter; rank 64 as QLoRA trained",
            "regret",
        )
    chosen["effective_batch"] = _batch(chosen["effective_batch"], tokens, seq, task)
    return [
        Choice(c.name, given[c.name], c.reason, c.source, yours=True, ours=c.value)
        if given.get(c.name) is not None
        else c
        for c in chosen.values()
    ]


def _value(chosen: dict[str, Choice], given: dict[str, Any], name: str) -> Any:
    return given[name] if given.get(name) is not None else chosen[name].value


def _moe_targets(config: dict[str, Any], method: str, given: dict[str, Any]) -> Rule:
    """A MoE model's adapters: every linear layer and every routed expert, each expert's at
    the rank over the experts a token meets (LoRA Without Regret's MoE runs); QLoRA keeps
    the experts in 4 bits, where PEFT cannot add them."""
    k, n = experts_per_token(config), routed_experts(config)
    if method == "lora" and given.get("lora_dropout"):
        return (
            "all-linear",
            f"adapters on every linear layer; the {n} routed experts get "
            "none: PEFT's adapters on them take no dropout (--lora-dropout 0 adds them)",
            "frugal",
        )
    if method == "qlora":
        return (
            "all-linear",
            f"adapters on every linear layer; the {n} routed experts stay "
            "frozen in 4 bits, where PEFT cannot add adapters (--method lora adapts them)",
            "frugal",
        )
    rank = given.get("lora_r") or 16
    return (
        "all-linear",
        f"adapters on every linear layer and each of the {n} routed experts, "
        f"at rank {max(1, rank // k)} each (the rank over the {k} experts a token meets): "
        "adapters on the MLP, experts included, are what match full fine-tuning; "
        "q_proj,k_proj,v_proj,o_proj is cheaper, attention only",
        "regret",
    )


def _epochs(tokens: float) -> Rule:
    if tokens < SMALL_DATA_TOKENS:
        return (
            3.0,
            f"a small dataset ({tokens / 1e6:.3g}M tokens): 3 passes, as Alpaca made "
            "over its 52K examples",
            "alpaca",
        )
    return (
        1.0,
        "one pass: a dataset this size is seen once (each pass costs as much again, "
        "and no source here says a second pays)",
        "frugal",
    )


def _batch(c: Choice, tokens: float, seq: int, task: str) -> Choice:
    """The recipe's batch, halved until an epoch has at least 8 optimizer steps."""
    sequences = max(1.0, tokens / seq)
    batch = int(c.value)
    while batch > 1 and sequences / batch < MIN_STEPS_PER_EPOCH:
        batch //= 2
    if batch == c.value:
        return c
    rows = f"{sequences:,.0f} {task_of(task).rows}"
    return Choice(
        c.name,
        batch,
        f"{c.value} halved to {batch}: an epoch of {rows} still takes "
        f"{MIN_STEPS_PER_EPOCH} steps or more",
        "frugal",
    )
