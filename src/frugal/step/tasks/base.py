"""What a training task supplies to the one step: the trainer, the estimator and the planner
ask a `Task` (`tasks.task_of(job.task)`) and never compare task names.

A task is its model's head (the transformers class and PEFT's task type), the TrainJob
fields only it reads, its rules for the job, the micro-batch it trains on (`example`: the
estimate's, with the keys, dtypes and shapes `frugal train` collates), its loss settings
as its own record with their defaults (`loss`, a `Loss`), its loss as a `(sum, count)` pair
(`micro_loss`, reading `LossInputs`), the width of its logits, what it evaluates, the second
model it reads as a description (`extra_model`, an `ExtraModel` the step's builder makes),
the passes it runs before training (`passes`: each a `Pass`, which `run.passes` runs), and
its default training settings with their sources (`plan.hyper` names the sources). Its rows
are read in `data` (`step` sits below it), one reader per task in the trainer's and
planner's tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np

if TYPE_CHECKING:  # torch is imported where a step runs: the CLI reads a task without it
    import torch

Rule = tuple[Any, str, str]  # a setting's value, why, and its source (a key of plan.hyper)
Depth = tuple[int, int]  # a shallow copy's layers, and the whole model's


@dataclass(frozen=True)
class Loss:
    """A task's loss settings: each task's own frozen record (`Task.loss`) subclasses this,
    with the settings its loss reads and their defaults."""


@dataclass(frozen=True)
class ExtraModel:
    """A second, frozen model a task reads, as the task describes it (`Task.extra_model`,
    a pass's `model`); the step's builder makes it (`step.extra`), from real
    weights for `frugal train` and on the meta device at a shallow depth for the estimate.

    `copy`: a frozen copy of the trained model as built (a full fine-tune's reference).
    `checkpoint`: another causal LM, `source` (a bundled id or a directory with its
    weights) of `config`, run forward only (a distillation's teacher: its `role`, the job
    field that names it)."""

    kind: Literal["copy", "checkpoint"]
    source: str = ""
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    role: str = "reference"


@dataclass(frozen=True)
class Output:
    """One array a pass writes, one entry per row, and the batch key it is carried under:
    per token (`width` values of each of a row's `seq` tokens: a teacher's top k) or, with
    `width` 0, one value per sequence of the row (a preference pair's two log-probabilities,
    carried as the batch lays out its sequences: every chosen one, then every rejected)."""

    name: str
    dtype: str  # numpy's name: int32, float16, float32
    width: int = 0

    def row_shape(self, seq: int, sequences: int) -> tuple[int, ...]:
        return (seq, self.width) if self.width else (sequences,)

    def bytes_per_token(self) -> float:
        """On disk, per token of data (a per-sequence value: none worth pricing)."""
        return float(self.width * np.dtype(self.dtype).itemsize)

    def carried(self, a: np.ndarray, width: int) -> torch.Tensor:
        """The batch's tensor of its rows' entries `a` (rows first), `width` tokens long: a
        token id widened to int64, a value to fp32, as the estimate's `example` holds them."""
        import torch

        if self.width:
            t = torch.from_numpy(np.ascontiguousarray(a[:, :width]))
            return t.long() if not t.is_floating_point() else t.float()
        return torch.from_numpy(np.ascontiguousarray(a.T)).reshape(-1).float()

    def example(self, rows: int, seq: int, sequences: int) -> torch.Tensor:
        """What a batch of `rows` carries of it (values irrelevant), for the estimate."""
        import torch

        if self.width:
            integer = np.dtype(self.dtype).kind in "iu"
            return torch.zeros((rows, seq, self.width), dtype=torch.long if integer else None)
        return torch.zeros(rows * sequences)


class Pass:
    """A phase a task runs outside its steps, once before training: one forward of a model
    over every training and validation row, whose results (`outputs`) the batches then
    carry, so that the step holds neither that model nor its forward. `run.passes` runs
    every task's passes the one same way: under a key of the rows and `key`, in the output
    directory, shared out over the processes, written whole or not at all, checksummed,
    checked before a step reads them, and read again by a resumed run.

    `model`: the model it runs, made by the step's builder for the pass and freed after it
    (a teacher); None: the trained model as built, before training (`context` may change
    it, as a reference turns the adapter off)."""

    name: ClassVar[str]  # names its files and what the run's notes say
    outputs: tuple[Output, ...] = ()
    model: ExtraModel | None = None

    def key(self) -> dict[str, Any]:
        """What its results depend on besides the rows and the compute dtype."""
        return {}

    def context(self, model: Any) -> Any:
        """Entered around each micro-batch's `compute`."""
        return contextlib.nullcontext()

    def compute(self, model: Any, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A micro-batch's results by output name, one entry per row (per token: as wide as
        the batch)."""
        raise NotImplementedError

    def disk_bytes(self, tokens: float) -> float:
        """What it writes for `tokens` tokens of data, kept through training."""
        return tokens * sum(o.bytes_per_token() for o in self.outputs)


@dataclass
class LossInputs:
    """What a task's loss reads besides its micro-batch: the trained model, the task's loss
    settings (`loss`, its own record), its second model (`extra`: a reference copy, a
    teacher; None where it has none), how a micro-batch's sums become its share of the
    step's loss (`scales`; None in evaluation) and the step's other sums by name (`totals`:
    a contrastive term's, rewards), to which a micro-batch adds its own."""

    model: Any
    loss: Any
    extra: Any = None
    scales: Scales | None = None
    totals: dict[str, torch.Tensor] = field(default_factory=dict)

    def scale(self, which: str = "ce") -> float:
        """The scale of a micro-batch's summed `ce` (the task's loss) or `cl` term."""
        assert self.scales is not None, "a training step's loss needs its scales"
        return self.scales.ce_scale if which == "ce" else self.scales.cl_scale


def given_settings(given: Mapping[str, Any], **names: str) -> dict[str, Any]:
    """A loss record's fields from the run config's settings `given`: each field named by
    the setting it comes from, left to its default where the setting is missing or None."""
    return {f: given[name] for f, name in names.items() if given.get(name) is not None}


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

    def loss(self, job: JobFields, given: Mapping[str, Any]) -> Loss:
        """The task's loss settings for `job`: its own record, from the run config's
        training settings `given` by name (missing or None: the task's default; the
        estimate gives none)."""
        raise NotImplementedError

    def micro_loss(
        self, m: LossInputs, b: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch's forward and its loss: (its scaled share of the step's loss, to
        backpropagate; its summed main loss). Other sums (a contrastive term, rewards) are
        added to `m.totals` by name."""
        raise NotImplementedError

    def count(self, b: dict[str, torch.Tensor], loss: Loss) -> float:
        """What a micro-batch's summed loss is divided by (its share of the step's count)."""
        raise NotImplementedError

    def eval_sums(self, m: LossInputs, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """One validation micro-batch: [summed loss, count, the task's metric sums...]."""
        raise NotImplementedError

    def eval_width(self, classes: int) -> int:
        """How many metric sums `eval_sums` gives after the loss and count."""
        return len(self.eval_names)

    def metrics(self, sums: dict[str, float], count: float) -> dict[str, float]:
        """What the trainer logs of a step's other sums (`micro_loss`'s `totals`, summed
        over processes), `count` the step's."""
        return {}

    def check_model(self, job: JobFields, config: dict[str, Any]) -> None:
        """Raise FrugalError (naming the fix) for a job this task cannot run on the model of
        `config` (a teacher of another vocabulary)."""

    def extra_model(self, job: JobFields) -> ExtraModel | None:
        """The second, frozen model the step reads, if any, made before training by the
        step's builder (`step.model.build_extra`)."""
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

    def passes(self, job: JobFields) -> tuple[Pass, ...]:
        """The passes `job` runs before training (`Pass`): what they compute, their key and
        what the batches carry of them; `run.passes` runs them."""
        return ()

    def batch_example(self, job: JobFields, rows: int, seq: int) -> dict[str, torch.Tensor]:
        """The estimate's micro-batch: the task's `example` and what it carries of its
        passes."""
        b = self.example(job, rows, seq)
        for p in self.passes(job):
            for o in p.outputs:
                b[o.name] = o.example(rows, seq, self.sequences_per_row)
        return b

    def settings(self, method: str, params: int) -> dict[str, Rule]:
        """The training settings frugal chooses for `method` on a model of `params`."""
        raise NotImplementedError
