"""The run config: one YAML schema that `frugal plan --write` produces and `frugal train`
consumes. Plain data validated by pydantic; unknown keys are rejected with a did-you-mean,
and `key=value` overrides (dotted paths, YAML values) apply before validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from frugal.durations import Hours, Minutes
from frugal.errors import FrugalError
from frugal.files import write_text_atomic
from frugal.names import closest
from frugal.step.job import TrainJob
from frugal.step.tasks import TASKS
from frugal.validation import model_at, problem

Schedule = Literal["cosine", "linear", "constant"]  # the learning rate after warm-up


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DataConfig(Strict):
    path: str | None = Field(None, description="JSONL, CSV, Parquet file or saved HF dataset")
    tokens: int | None = Field(None, ge=1, description="training tokens per epoch, when known")
    epochs: float = Field(1.0, gt=0, le=1e6, description="passes over the data")
    format: Literal["auto", "text", "prompt_completion", "chat"] = Field(
        "auto", description="row format: text, prompt/completion or chat messages"
    )
    val_path: str | None = Field(None, description="validation file (else a split of path)")
    val_ratio: float = Field(0.05, ge=0, lt=0.5, description="share held out for validation")


Logger = Literal["jsonl", "tensorboard", "mlflow", "wandb"]


def _default_loggers() -> list[Logger]:
    return ["jsonl", "tensorboard"]


class TrainingConfig(Strict):
    effective_batch: int = Field(
        16, ge=1, le=1_048_576, description="sequences per optimizer step, all GPUs"
    )
    learning_rate: float = Field(2e-4, gt=0, description="peak learning rate")
    schedule: Schedule = Field("cosine", description="decay after warmup")
    warmup_ratio: float = Field(0.03, ge=0, lt=1, description="share of steps spent warming up")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, ge=0, description="gradient clipping (0: off)")
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps")
    max_time_min: Minutes = Field(
        None, description="stop after this long: minutes, or a duration such as 2h or 1h30m"
    )
    eval_every: int = Field(50, ge=0, description="evaluate every N steps (0: at the end)")
    early_stopping_patience: int | None = Field(
        None, ge=1, description="stop after N evaluations without improvement"
    )
    best_metric: Literal["eval_loss", "accuracy", "macro_f1"] = Field(
        "eval_loss",
        description="what the best checkpoint and early stopping follow: the evaluation loss, "
        "or a classifier's accuracy or macro-F1",
    )
    class_weights: Literal["none", "balanced"] = Field(
        "none",
        description="a classifier's loss per class: equal, or balanced (n / (classes x the "
        "class's count), so a rare class weighs as much as a common one)",
    )
    save_every_min: Minutes = Field(
        None,
        description="checkpoint interval: minutes, or a duration such as 1h (default: the "
        "plan's Young/Daly interval)",
    )
    keep_checkpoints: int = Field(
        2, ge=1, description="newest checkpoints kept (best/ holds the best weights)"
    )
    auto_micro_batch: bool = Field(
        True, description="on CUDA, start from the estimator's largest fitting micro-batch"
    )
    seed: int = Field(
        42, ge=0, le=2**32 - 1, description="seed of weights init, data order and dropout"
    )
    contrastive_weight: float = Field(1.0, ge=0, description="weight of the contrastive term")
    contrastive_margin: float = Field(0.5, ge=0, le=2, description="SimCTG margin rho")
    beta: float | None = Field(
        None,
        gt=0,
        le=100,
        description="preference tuning's beta: how far the policy may move from the "
        "reference (DPO, IPO, KTO; ORPO's weight of its odds-ratio term; SimPO's reward "
        "scale); default: the method's paper (0.1; SimPO 2.0)",
    )
    simpo_gamma: float | None = Field(
        None, ge=0, le=100, description="SimPO's target reward margin gamma (default: beta / 2)"
    )
    kto_desirable_weight: float = Field(
        1.0, gt=0, le=100, description="KTO's weight of a desirable row's loss (lambda_D)"
    )
    kto_undesirable_weight: float = Field(
        1.0, gt=0, le=100, description="KTO's weight of an undesirable row's loss (lambda_U)"
    )
    distill_alpha: float = Field(
        0.5,
        ge=0,
        le=1,
        description="distillation: the teacher's soft targets' weight (the labels' is 1 - it)",
    )
    distill_temperature: float = Field(
        2.0, gt=0, le=100, description="distillation: the softmax temperature T of both models"
    )
    max_hours: Hours = Field(
        None,
        description="stop cleanly, with a checkpoint, before the run's hours, all sessions, "
        "cross this: hours, or a duration such as 90m",
    )
    idle_stop_min: Minutes = Field(
        30.0,
        description="a step running this long: stop with a checkpoint once it returns, or "
        "end a hung run on the ledger after twice as long (minutes, or a duration)",
    )
    heartbeat_min: Minutes = Field(
        1.0, description="how often the run reports its progress and spend to the ledger"
    )
    peer_timeout_min: Minutes = Field(
        10.0,
        description="in a run of several processes, how long one waits for the others at a "
        "step's exchange before it stops, resumable, as if they were gone (minutes, or a "
        "duration)",
    )
    log_every: int = Field(1, ge=1, description="log metrics every N steps")
    loggers: list[Logger] = Field(default_factory=_default_loggers, description="metric sinks")
    merge: bool = Field(False, description="also save the LoRA adapter merged into the model")


class PlanConfig(Strict):
    """Where and how the plan runs, and what it was predicted to cost."""

    provider: str
    instance: str
    region: str = ""
    gpu: str
    gpus: int = Field(1, ge=1)
    nodes: int = Field(1, ge=1)
    spot: bool = False
    price_per_hour_usd: float = Field(ge=0)
    checkpoint_interval_min: float | None = Field(None, ge=0)
    est_hours: float = Field(ge=0)
    est_cost_usd: float = Field(ge=0)
    tokens_per_s: float = Field(ge=0)
    peak_reserved_gib: float = Field(ge=0)
    ledger_id: int | None = None  # the plan's record on the books, when it was recorded


class RunConfig(Strict):
    model: str = Field(..., description="local model dir, or a hub id in the local HF cache")
    tokenizer: str | None = Field(None, description="tokenizer dir (default: the model's)")
    init: Literal["pretrained", "random"] = Field(
        "pretrained", description="load the model's weights, or start from random weights"
    )
    job: TrainJob = Field(default_factory=lambda: TrainJob.model_validate({}))
    data: DataConfig = Field(default_factory=lambda: DataConfig.model_validate({}))
    training: TrainingConfig = Field(default_factory=lambda: TrainingConfig.model_validate({}))
    plan: PlanConfig | None = None
    budget_usd: float | None = Field(
        None, gt=0, description="stop cleanly before spending this many USD"
    )
    price_per_hour_usd: float | None = Field(
        None, ge=0, description="hourly price of the machine (default: the plan's)"
    )
    output_dir: str = Field("runs/frugal", description="where checkpoints, logs and outputs go")
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="ledger tags of the run (project, team, env, free ones); --tag adds more",
    )

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        per_step = self.job.batch * self.job.gpus
        if self.training.effective_batch % per_step:
            raise ValueError(
                f"training.effective_batch {self.training.effective_batch} is not a multiple "
                f"of job.batch x job.gpus = {per_step}"
            )
        job = self.job
        if job.optimizer_in_backward and self.training.effective_batch != job.batch:
            raise ValueError(
                "job.optimizer_in_backward runs each step as one micro-batch: set job.batch "
                f"to training.effective_batch ({self.training.effective_batch})"
            )
        if job.optimizer_in_backward and self.training.max_grad_norm > 0:
            raise ValueError(
                "job.optimizer_in_backward applies each gradient before the global norm is "
                "known: set training.max_grad_norm=0 (no clipping)"
            )
        if job.sharding in ("zero2", "zero3"):
            raise ValueError(
                f"job.sharding={job.sharding}: frugal train shards with PyTorch FSDP, not "
                "DeepSpeed; use job.sharding=fsdp (ZeRO-3's equivalent) or ddp"
            )
        if job.sharding == "fsdp" and job.gpus > 1 and job.method == "qlora":
            raise ValueError(
                "QLoRA with FSDP is not supported by frugal train: use job.sharding=ddp "
                "(the 4-bit model on every GPU), or job.method=lora with fsdp"
            )
        self._task_settings()
        if job.sharding == "fsdp" and job.gpus > 1 and self.training.merge:
            raise ValueError(
                "training.merge with fsdp would gather the whole model in one process: set "
                "training.merge=false and merge the saved adapter with PEFT after training"
            )
        return self

    def _task_settings(self) -> None:
        """A training setting only another task reads (a classifier's metrics and class
        weights) is refused away from its default."""
        for task in TASKS.values():
            if task.name == self.job.task:
                continue
            for name in task.training_fields:
                value, default = getattr(self.training, name), TrainingConfig.model_fields[name]
                if value != default.default:
                    raise ValueError(
                        f"training.{name}={value} is for job.task={task.name}: set "
                        f"job.task={task.name}, or {name}={default.default}"
                    )

    @property
    def hourly_usd(self) -> float | None:
        if self.price_per_hour_usd is not None:
            return self.price_per_hour_usd
        return self.plan.price_per_hour_usd if self.plan else None

    def to_yaml(self) -> str:

        header = "# frugal run config: `frugal train` reads this file (one schema with plan)\n"
        return header + yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def write(self, path: str | Path) -> None:

        write_text_atomic(path, self.to_yaml())


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted `key=value` pairs (values parsed as YAML: 1e-4, true, [a, b]) into `data`."""

    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise FrugalError(f"override {item!r}: write key=value, e.g. training.max_steps=100")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        _set(data, key.strip(), value, what=f"override {item!r}")
    return data


def _set(data: dict[str, Any], key: str, value: Any, what: str) -> None:
    """Set dotted `key` in `data`, creating missing (or empty) sections on the way."""
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise FrugalError(f"{what}: {part} is not a section")
        node = child
    node[leaf] = value


MOVED = {"data.packing": "job.packing", "training.loss": "job.loss"}  # keys of older configs


def validate_run_config(data: Any, where: str) -> RunConfig:
    if not isinstance(data, dict):
        raise FrugalError(f"{where}: a run config is a YAML mapping (see `frugal plan --write`)")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:  # the first problem, on one line, naming the key
        loc, kind, msg = problem(e, RunConfig)
        key = ".".join(str(x) for x in loc)
        if kind == "extra_forbidden" and key in MOVED:
            msg = f"moved to {MOVED[key]} (it shapes the step the estimate sizes)"
        elif kind == "extra_forbidden":
            section = model_at(RunConfig, loc)
            hint = closest(str(loc[-1]), section.model_fields) if section else []
            msg = "unknown key" + (f"; did you mean {', '.join(hint)}?" if hint else "")
        raise FrugalError(f"{where}: {key}: {msg}" if key else f"{where}: {msg}") from None


def load_run_config(
    path: str | Path, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> RunConfig:
    """The config at `path` with `key=value` overrides (YAML values) and `values` (dotted
    keys, taken as they are: command-line flags such as --output-dir) applied."""

    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise FrugalError(f"cannot read run config {path}: {e.strerror or e}") from None
    try:
        data: Any = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise FrugalError(
            f"{path}: not UTF-8 text (byte {e.start:,} is 0x{raw[e.start]:02x}): save the run "
            "config as UTF-8 YAML (frugal plan --write makes one)"
        ) from None
    except (yaml.YAMLError, RecursionError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise FrugalError(
            f"{path}: not valid YAML{at} ({problem}): fix the file, or write a new one with "
            "frugal plan --write"
        ) from None
    if overrides or values:
        data = apply_overrides(data if isinstance(data, dict) else {}, overrides or [])
        for key, value in (values or {}).items():
            _set(data, key, value, what=key)
    return validate_run_config(data, str(path))
