"""What one training step looks like: the settings that decide its memory and FLOPs.

`TrainJob` is plain, serializable data. Its field descriptions are the CLI's help text, and
the run config of `frugal train` embeds the same model, so there is one schema.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from frugal.errors import FrugalError
from frugal.models.specs import experts_per_token
from frugal.step.tasks import TASKS, task_of
from frugal.step.tasks.distill import TOP_K
from frugal.validation import RANGE_ERRORS, problem

Method = Literal["full", "lora", "qlora"]
Precision = Literal["bf16-mixed", "fp16-mixed", "bf16-true", "fp32"]
Optimizer = Literal["adamw", "adamw-8bit", "paged-adamw-8bit", "sgd", "adafactor"]
Attention = Literal["sdpa", "eager"]
Sharding = Literal["ddp", "fsdp", "zero2", "zero3"]
Loss = Literal["ce", "ce+contrastive"]
# the names of `tasks.TASKS` (a test holds them)
Task = Literal["causal", "classification", "preference", "distill"]
PreferenceMethod = Literal["dpo", "ipo", "orpo", "simpo", "kto"]
Reference = Literal["auto", "precomputed"]
TeacherLogits = Literal["online", "precomputed"]

LORA_FIELDS = ("lora_r", "lora_alpha", "lora_targets", "lora_dropout")
FIXED_4BIT_INPUT = "0.43.2"  # the first bitsandbytes whose 4-bit matmul drops its input
# the largest counts a step may name: beyond them no GPU holds it, and the search over them
# would take hours (a micro-batch, an accumulation, a rank, a number of loss chunks)
MOST = 65_536
MOST_SEQ = 16_777_216  # 16M tokens: past the longest context any model offers (10M)
MOST_GPUS = 65_536
# 256 chunks keep one chunk's logits under 0.4 GB even for 128K tokens of a 128K vocabulary;
# more only add ops (the estimate simulates each chunk: 1,024 of them take two minutes)
MOST_CHUNKS = 256


def _version(text: str) -> Any:

    try:
        return Version(text)
    except InvalidVersion:
        raise ValueError(
            f"--bitsandbytes {text!r} is not a version: give one like 0.45.0"
        ) from None


@cache
def installed_version(package: str) -> str | None:
    """The installed distribution's version, or None (read once per process)."""

    try:
        return version(package)
    except PackageNotFoundError:
        return None


class TrainJob(BaseModel):
    """One training step of one model: task, method, precision, optimizer, shapes, batch
    layout, loss and parallelism."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    task: Task = Field(
        "causal",
        description="causal: next-token prediction through the LM head; classification: "
        "one label per text (rows of text or text_a/text_b, and label) from a new head on the "
        "last token, no logits over the vocabulary; preference: a chosen completion over a "
        "rejected one (rows of prompt, chosen, rejected; KTO: prompt, completion, label); "
        "distill: a causal LM learning a --teacher's soft targets with its labels",
    )
    num_labels: int = Field(
        2, ge=2, le=MOST, description="classes of a classification task (its head's outputs)"
    )
    preference: PreferenceMethod = Field(
        "dpo",
        description="preference tuning's method: dpo, ipo, orpo or simpo (pairs), or kto "
        "(unpaired desirable and undesirable rows)",
    )
    reference: Reference = Field(
        "auto",
        description="preference tuning's reference model: auto (LoRA/QLoRA: the model with "
        "its adapter off; full: a frozen copy; ORPO and SimPO: none) or precomputed (its "
        "log-probabilities from one pass before training: no copy, no reference forward)",
    )
    teacher: str | None = Field(
        None,
        description="distillation's teacher: a bundled id or a directory with its weights, "
        "of the student's tokenizer",
    )
    teacher_logits: TeacherLogits = Field(
        "online",
        description="distillation's soft targets: online (the teacher in memory, its forward "
        "in every step) or precomputed (its top --teacher-top-k logits of every token from "
        "one pass before training, on disk: no teacher in the step)",
    )
    teacher_top_k: int = Field(
        TOP_K,
        ge=1,
        le=MOST,
        description="precomputed teacher logits: how many of each token's largest are kept "
        "(the soft targets are the teacher's distribution over them, renormalized)",
    )

    method: Method = Field("lora", description="full fine-tuning, LoRA, or QLoRA (4-bit NF4 base)")
    precision: Precision = Field(
        "bf16-mixed",
        description="bf16-mixed/fp16-mixed: fp32 trainable weights with autocast; "
        "bf16-true: everything in bf16; fp32: no autocast",
    )
    optimizer: Optimizer = Field("adamw", description="optimizer whose state is counted")
    optimizer_in_backward: bool = Field(
        False,
        description="update each weight as soon as its gradient is complete, then free the "
        "gradient (one GPU, no accumulation, no clipping, no fp16 loss scaling)",
    )
    lora_r: int = Field(16, ge=1, le=MOST, description="LoRA rank")
    lora_alpha: int | None = Field(
        None, gt=0, le=MOST, description="LoRA alpha (default: 2 x rank)"
    )
    lora_targets: str = Field(
        "all-linear", description="module names, comma separated, or all-linear"
    )
    lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="LoRA dropout (adds a copy of each input)"
    )
    batch: int = Field(
        1, ge=1, le=MOST, description="micro-batch size (sequences per GPU per step)"
    )
    seq: int = Field(2048, ge=1, le=MOST_SEQ, description="sequence length in tokens")
    grad_accum: int = Field(1, ge=1, le=MOST, description="gradient accumulation steps")
    grad_checkpointing: bool = Field(True, description="recompute activations in backward")
    offload_activations: bool = Field(
        False,
        description="keep each checkpointed layer's input in host memory until backward "
        "(needs gradient checkpointing; costs two host-link copies of them per step)",
    )
    attention: Attention = Field("sdpa", description="attention kernel: sdpa (flash) or eager")
    packing: bool = Field(
        True,
        description="pack samples into full rows (a block-diagonal mask keeps them apart); "
        "off: one sample per row, padded (always, for a classifier)",
    )
    loss: Loss = Field(
        "ce", description="training loss: cross-entropy, or with SimCTG's contrastive term"
    )
    loss_chunks: int = Field(
        0,
        ge=0,
        le=MOST_CHUNKS,
        description="compute the cross-entropy from the last hidden states in this many "
        "chunks of tokens, never holding the whole logits tensor (exact); 0: the plain loss",
    )
    gpus: int = Field(1, ge=1, le=MOST_GPUS, description="number of GPUs")
    sharding: Sharding = Field("ddp", description="how state is split across GPUs")
    bitsandbytes: str | None = Field(
        None,
        description="bitsandbytes version a QLoRA run uses (before 0.43.2, each 4-bit layer "
        "also kept its input for backward); default: the installed one, else the newest",
    )

    @model_validator(mode="before")
    @classmethod
    def _unpacked_rows(cls, data: Any) -> Any:
        """A task whose rows are not packed (a classifier's: its label is the row's)."""
        if isinstance(data, dict) and data.get("task") in TASKS and not TASKS[data["task"]].packs:
            data = {**data, "packing": False}
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainJob:
        task = task_of(self.task)
        for other in TASKS.values():  # a setting only another task reads: a mistake
            given = [
                f
                for f in other.fields
                if f in self.model_fields_set
                and other is not task
                and getattr(self, f) != type(self).model_fields[f].default
            ]
            if given:
                raise ValueError(
                    f"{_flag(given[0])} is for --task {other.name}: drop it, or give --task "
                    f"{other.name}"
                )
        task.check(self)
        if not task.shards and self.sharding in ("fsdp", "zero3"):
            raise ValueError(
                f"--task {self.task} is not run under sharded weights yet: use --sharding ddp "
                "or zero2"
            )
        if self.bitsandbytes is not None:
            _version(self.bitsandbytes)
        if self.loss_chunks > self.batch * self.seq:
            raise ValueError(
                f"--loss-chunks {self.loss_chunks} is more chunks than the "
                f"{self.batch * self.seq:,} tokens of a micro-batch: give at most that (16 "
                "is plenty)"
            )
        if self.loss_chunks and self.sharding in ("fsdp", "zero3"):
            raise ValueError(
                "--loss-chunks reads the LM head's whole weight: use --sharding ddp or zero2"
            )
        if self.offload_activations and self.sharding in ("fsdp", "zero3"):
            raise ValueError(
                "--offload-activations is not run under sharded weights yet: "
                "use --sharding ddp or zero2"
            )
        if self.offload_activations and not self.grad_checkpointing:
            raise ValueError(
                "--offload-activations offloads the checkpointed layers' inputs: "
                "turn on --grad-checkpointing"
            )
        if self.optimizer_in_backward:
            why = in_backward_refusal(self.gpus, self.grad_accum, self.precision)
            if why:
                raise ValueError(why)
        if self.method != "full" and not self.target_modules:
            raise ValueError("--lora-targets is empty: give module names or all-linear")
        return self

    def task_settings(self) -> dict[str, Any]:
        """The task and the fields only it reads (a classifier's classes)."""
        return {"task": self.task, **{f: getattr(self, f) for f in task_of(self.task).fields}}

    @property
    def alpha(self) -> int:
        return self.lora_alpha if self.lora_alpha is not None else 2 * self.lora_r

    def expert_rank(self, config: dict[str, Any]) -> int:
        """LoRA rank of each routed expert's adapter: the job's rank divided by the experts a
        token meets (LoRA Without Regret, Schulman et al. 2025: "the rank of each equal to
        the total rank divided by the number of active experts", which keeps the ratio of
        adapter to weight parameters of the MoE layers that of the others)."""
        return max(1, self.lora_r // experts_per_token(config))

    @property
    def target_modules(self) -> str | list[str]:
        t = self.lora_targets.strip()
        if t in ("all-linear", "all_linear"):
            return "all-linear"
        return [m.strip() for m in t.split(",") if m.strip()]

    def lora_config(self, modules: list[str], parameters: list[str], ranks: dict[str, int]) -> Any:
        """The peft LoraConfig of this job, one for the simulation and the trainer, on the
        linear layers `modules` and the fused expert weights `parameters` (each at its rank
        in `ranks`: `step.moe.adapter_targets`)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_r,
            lora_alpha=self.alpha,
            target_modules=modules,
            target_parameters=parameters or None,
            rank_pattern={re.escape(name): r for name, r in ranks.items()},
            lora_dropout=self.lora_dropout,
            task_type=task_of(self.task).peft_task_type,
        )

    @property
    def keeps_4bit_input(self) -> bool:
        """Whether each 4-bit layer holds its input until backward.

        bitsandbytes kept the input A of `MatMul4Bit` on the autograd context although a
        frozen weight never needs it, until PR #1270 (released in 0.43.2, July 2024). It is
        a context attribute, not a saved tensor, so checkpointing does not free it either.
        """
        if self.method != "qlora":
            return False
        v = self.bitsandbytes or installed_version("bitsandbytes")
        return v is not None and _version(v) < _version(FIXED_4BIT_INPUT)

    @property
    def compute_dtype(self) -> str:
        return {"bf16-mixed": "bf16", "bf16-true": "bf16", "fp16-mixed": "fp16"}.get(
            self.precision, "fp32"
        )

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all GPUs (micro-batch x seq x accum x GPUs)."""
        return self.batch * self.seq * self.grad_accum * self.gpus

    def profile_key(self) -> dict[str, object]:
        """The settings a memory profile depends on (not batch, seq or parallelism; the paged
        8-bit optimizer's state is the 8-bit one's; LoRA's alpha as the number it resolves to:
        None is 2 x rank, the same adapters as the rank's double written out).
        Accumulation only matters as 1 or more: the simulation runs min(grad_accum, 2)
        micro-steps, since from the second on, every micro-step holds the same buffers.
        A task's own fields count only in its jobs (a causal job has no head of classes)."""
        others = {f for t in TASKS.values() if t.name != self.task for f in t.fields}
        key = self.model_dump(exclude={"batch", "seq", "gpus", "sharding", "bitsandbytes", *others})
        key["lora_alpha"] = self.alpha
        key["keeps_4bit_input"] = self.keeps_4bit_input
        if self.optimizer == "paged-adamw-8bit":  # the same state, in unified memory
            key["optimizer"] = "adamw-8bit"
        key["grad_accum"] = min(self.grad_accum, 2)
        key.update(task_of(self.task).profile_extra(self))
        return key


def in_backward_refusal(gpus: int, grad_accum: int, precision: str) -> str | None:
    """Why the optimizer in backward cannot run a step of this layout, or None: it needs each
    weight's gradient final as it arrives, so it can be applied at once."""
    if gpus > 1:
        return (
            "--optimizer-in-backward updates each weight before the GPUs could average its "
            "gradient: use --gpus 1"
        )
    if grad_accum > 1:
        return (
            "--optimizer-in-backward updates each weight from one micro-batch's gradient: "
            "use --grad-accum 1 (a larger --batch for the same step)"
        )
    if precision == "fp16-mixed":
        return (
            "--optimizer-in-backward cannot skip a step whose fp16 gradients overflowed: "
            "use --precision bf16-mixed"
        )
    return None


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def make_job(**kwargs: Any) -> TrainJob:
    """Build a TrainJob, turning validation errors into one line that names the flag."""
    given_lora = [k for k in LORA_FIELDS if kwargs.get(k) is not None]
    if kwargs.get("method") == "full" and given_lora:
        raise FrugalError(
            f"{_flag(given_lora[0])} applies to --method lora or qlora, not full: "
            "drop it or pick a LoRA method"
        )
    try:
        return TrainJob(**{k: v for k, v in kwargs.items() if v is not None})
    except ValidationError as e:
        loc, kind, msg = problem(e, TrainJob)
        flag = _flag(str(loc[0])) if loc else ""
        if kind in RANGE_ERRORS:  # "--batch 0: give a whole number of 1 or more"
            msg = f"{flag} {msg}"
        elif flag not in msg:
            msg = f"{flag}: {msg}"
        raise FrugalError(msg) from e
