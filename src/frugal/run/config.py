"""The run config: one YAML schema that `frugal plan --write` produces and `frugal train`
consumes. Plain data validated by pydantic; unknown keys are rejected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from frugal.estimate.job import TrainJob


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(Strict):
    path: str | None = Field(None, description="JSONL, CSV, Parquet file or saved HF dataset")
    tokens: int | None = Field(None, description="training tokens per epoch, when known")
    epochs: float = Field(1.0, description="passes over the data")


class TrainingConfig(Strict):
    effective_batch: int = Field(16, description="sequences per optimizer step, all GPUs")
    learning_rate: float = Field(2e-4, description="peak learning rate")
    schedule: str = Field("cosine", description="cosine or linear decay after warmup")
    warmup_ratio: float = Field(0.03, description="share of steps spent warming up")
    max_grad_norm: float = Field(1.0, description="gradient clipping")


class PlanConfig(Strict):
    """Where and how the plan runs, and what it was predicted to cost."""

    provider: str
    instance: str
    region: str = ""
    gpu: str
    gpus: int = 1
    nodes: int = 1
    spot: bool = False
    price_per_hour_usd: float
    checkpoint_interval_min: float | None = None
    est_hours: float
    est_cost_usd: float
    tokens_per_s: float
    peak_reserved_gib: float


class RunConfig(Strict):
    model: str = Field(..., description="bundled hub id, local dir or config.json")
    job: TrainJob
    data: DataConfig = Field(default_factory=lambda: DataConfig.model_validate({}))
    training: TrainingConfig = Field(default_factory=lambda: TrainingConfig.model_validate({}))
    plan: PlanConfig | None = None
    budget_usd: float | None = Field(None, description="stop cleanly before spending this")
    output_dir: str = "runs/frugal"

    def to_yaml(self) -> str:
        import yaml

        header = "# frugal run config: `frugal train` reads this file (one schema with plan)\n"
        return header + yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def write(self, path: str | Path) -> None:
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(self.to_yaml())
        tmp.replace(p)


def load_run_config(path: str | Path) -> RunConfig:
    import yaml

    from frugal.errors import FrugalError

    try:
        data: Any = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise FrugalError(f"cannot read run config {path}: {e}") from None
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:  # the first problem, on one line
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise FrugalError(f"{path}: {loc}: {err.get('msg')}") from None


def to_run_config(
    model: str, plan: Any, k: Any, dataset: str | None, tokens_per_epoch: float, epochs: float
) -> RunConfig:
    """The run config of a plan (a search.Plan and its Constraints)."""
    p = plan.to_json()
    return RunConfig(
        model=model,
        job=plan.job,
        data=DataConfig.model_validate(
            {"path": dataset, "tokens": int(tokens_per_epoch), "epochs": epochs}
        ),
        training=TrainingConfig.model_validate({"effective_batch": k.effective_batch}),
        plan=PlanConfig.model_validate({f: p[f] for f in PlanConfig.model_fields}),
        budget_usd=k.budget_usd,
    )
