"""What a training task supplies to the one step: the trainer, the estimator and the planner
ask a `Task` (`tasks.task_of(job.task)`) and never compare task names.

A task is its model's head (the transformers class and PEFT's task type), the TrainJob
fields only it reads, its rules for the job, the micro-batch it trains on (`example`: the
estimate's, with the keys, dtypes and shapes `frugal train` collates), its loss as a
`(sum, count)` pair, the width of its logits, what it evaluates, and its default training
settings with their sources (`plan.hyper` names the sources). Its rows are read in `data`
(`step` sits below it), one reader per task in the trainer's and planner's tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # torch is imported where a step runs: the CLI reads a task without it
    import torch

Rule = tuple[Any, str, str]  # a setting's value, why, and its source (a key of plan.hyper)
Depth = tuple[int, int]  # a shallow copy's layers, and the whole model's


@dataclass(frozen=True)
class Loss:
    """The training loss of a step: its task's (`task`, a name of `tasks.TASKS`), with the
    settings a task's loss reads. A causal LM's is the cross-entropy, plus SimCTG's
    contrastive term when `contrastive` (`weight`, `margin`); with `chunks`, the
    cross-entropy is computed from the last hidden states in that many chunks of tokens
    (`chunked_ce`), so the whole logits tensor never exists. A classifier's is the
    cross-entropy over its classes, weighted by `class_weights` if any. Preference tuning's
    is its `preference` method's with `beta` (SimPO's `gamma`, KTO's weights), against a
    full fine-tune's frozen copy as `extra_model` (None: the adapter off, precomputed
    log-probabilities in the batch, or no reference). Distillation's mixes the teacher's
    (`extra_model`) soft targets at `temperature` with the labels' cross-entropy by
    `alpha`."""

    contrastive: bool = False
    weight: float = 1.0
    margin: float = 0.5
    chunks: int = 0
    task: str = "causal"
    class_weights: tuple[float, ...] = ()
    preference: str = "dpo"
    beta: float = 0.1
    gamma: float = 0.0
    kto_desirable_weight: float = 1.0
    kto_undesirable_weight: float = 1.0
    alpha: float = 0.5
    temperature: float = 2.0
    extra_model: Any = field(default=None, compare=False, repr=False)


class JobFields(Protocol):
    """The TrainJob fields a task reads (`step.job.TrainJob` has them all)."""

    @property
    def task(self) -> str: ...
    @property
    def num_labels(self) -> int: ...
    @property
    def method(self) -> str: ...
    @property
    def loss(self) -> str: ...
    @property
    def loss_chunks(self) -> int: ...
    @property
    def packing(self) -> bool: ...
    @property
    def preference(self) -> str: ...
    @property
    def reference(self) -> str: ...
    @property
    def teacher(self) -> str | None: ...
    @property
    def teacher_logits(self) -> str: ...
    @property
    def teacher_top_k(self) -> int: ...
    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Any: ...


class Scales(Protocol):
    """How a micro-batch's sums become its share of the step's loss (`loop.UpdateRule`)."""

    @property
    def ce_scale(self) -> float: ...
    @property
    def cl_scale(self) -> float: ...


class Task:
    """A training task. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    what: ClassVar[str]  # "causal language model": what a refused config is not
    auto_class: ClassVar[str]  # transformers' Auto class of the model trained
    auto_mapping: ClassVar[str]  # its model types (transformers.models.auto.modeling_auto)
    peft_task_type: ClassVar[str]
    fields: ClassVar[tuple[str, ...]] = ()  # TrainJob fields no other task reads
    training_fields: ClassVar[tuple[str, ...]] = ()  # run config's training.* fields, alike
    packs: ClassVar[bool] = True  # rows may be packed (off: one sample per padded row)
    chunked_loss: ClassVar[bool] = True  # its loss may come in chunks (--loss-chunks)
    rank_grows_with_data: ClassVar[bool] = False  # a large dataset wants a larger LoRA rank
    default_model: ClassVar[str] = "meta-llama/Llama-3.1-8B"  # `frugal init`'s suggestion
    shards: ClassVar[bool] = True  # runs under sharded weights (FSDP, ZeRO-3)
    rows: ClassVar[str] = "sequences"  # what a row of its data is called
    sequences_per_row: ClassVar[int] = 1  # a row (what job.batch counts) is this many
    eval_names: ClassVar[tuple[str, ...]] = ()  # the metric sums `eval_sums` gives, by name
    headline_metrics: ClassVar[tuple[str, ...]] = ()  # its metrics that stand for a run
    upfront_holds_extra: ClassVar[bool] = False  # its pass (`upfront`) runs its extra model

    def check(self, job: JobFields) -> None:
        """Raise ValueError (naming the flag and the fix) for a job this task cannot run."""

    def hf_config(self, d: dict[str, Any], job: JobFields) -> None:
        """Edit the model's config dict (a copy) for this task's head, in place."""

    def pretrained_kwargs(self, job: JobFields, cfg: Any) -> dict[str, Any]:
        """What `from_pretrained` needs besides the weights' dtype and kernels."""
        return {}

    def logits_width(self, job: JobFields, config: dict[str, Any]) -> int:
        """The logits' last dimension (the estimate's categories tell logits by it)."""
        return int(config["vocab_size"])

    def example(self, job: JobFields, rows: int, seq: int) -> dict[str, torch.Tensor]:
        """A micro-batch of `rows` x `seq` in the layout `frugal train` collates (values
        irrelevant: the estimate runs it on tensors without data)."""
        raise NotImplementedError

    def micro_loss(
        self, model: Any, b: dict[str, torch.Tensor], loss: Loss, scales: Scales,
        totals: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """One micro-batch's forward and its loss: (its scaled share of the step's loss, to
        backpropagate; its summed main loss). Other sums (a contrastive term, rewards) are
        added to `totals` by name."""
        raise NotImplementedError

    def count(self, b: dict[str, torch.Tensor], class_weights: tuple[float, ...]) -> float:
        """What a micro-batch's summed loss is divided by (its share of the step's count)."""
        raise NotImplementedError

    def eval_sums(self, model: Any, b: dict[str, torch.Tensor], loss: Loss) -> torch.Tensor:
        """One validation micro-batch: [summed loss, count, the task's metric sums...]."""
        raise NotImplementedError

    def eval_width(self, classes: int) -> int:
        """How many metric sums `eval_sums` gives after the loss and count."""
        return len(self.eval_names)

    def metrics(self, sums: dict[str, float], count: float) -> dict[str, float]:
        """What the trainer logs of a step's other sums (`micro_loss`'s `totals`, summed
        over processes), `count` the step's."""
        return {}

    def extra_model(
        self, model: Any, job: JobFields, dtype: torch.dtype, depth: Depth | None = None
    ) -> Any:
        """A second, frozen model the step reads (None): made before training, in `dtype`;
        `depth`: the estimate's shallow copy of the trained model (its layers, and the
        whole model's), on the meta device."""
        return None

    def profile_extra(self, job: JobFields) -> dict[str, Any]:
        """What else the step's profile depends on (a teacher's config)."""
        return {}

    def min_depth(self, job: JobFields, layers: int) -> int:
        """The fewest layers a shallow copy of the trained model (of `layers`) may have
        for the estimate to simulate this task's step."""
        return 1

    def headline(self, job: JobFields) -> str | None:
        """How the estimate's first line names the step's task (none: a causal LM's)."""
        return None

    def note(self, job: JobFields, vocab_size: int) -> str | None:
        """What the estimate and the plan say of this task's step, if anything."""
        return None

    def upfront(self, job: JobFields) -> dict[str, Any] | None:
        """The job's settings that move work out of every step into one forward pass over
        the data before training (`plan.upfront` prices both ways), or None."""
        return None

    def upfront_why(self, job: JobFields) -> str:
        """What those settings save in each step."""
        return ""

    def upfront_disk_bytes(self, job: JobFields, tokens: float) -> float:
        """What that pass writes to disk for `tokens` tokens of data, kept through training
        (none worth pricing: a preference row's two log-probabilities)."""
        return 0.0

    def settings(self, method: str, params: int) -> dict[str, Rule]:
        """The training settings frugal chooses for `method` on a model of `params`."""
        raise NotImplementedError
