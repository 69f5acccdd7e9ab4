"""What a run reports when it ends: `run_summary.json` (or `dry_run.json`), the return value
of `frugal.run.recipe.train`, and what `frugal train --json` prints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from frugal.run.predict import Prediction
from frugal.run.state import FindingRecord

Outcome = Literal["completed", "preempted", "budget-stopped", "idle-stopped", "failed"]


class Actual(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hours: float
    cost_usd: float
    tokens: int
    step_time_s: float | None  # the median of the last ten steps
    tokens_per_s: float | None  # over steps after each session's first (warm-up)
    peak_allocated_gib: float | None = None  # CUDA only
    peak_reserved_gib: float | None = None


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    outcome: Outcome
    reason: str
    resumable: bool  # stopped by a signal: `--resume auto` continues it
    interrupted: bool = False  # by a second Ctrl-C: stopped at once, no final save (exit 130)
    steps: int
    total_steps: int
    steps_this_session: int
    micro_batch: int
    grad_accum: int
    effective_batch: int
    tokens_per_step: int | None  # packed rows are full: effective batch x seq
    precision: str
    precision_reason: str
    predicted: Prediction
    actual: Actual
    budget_usd: float | None
    best_eval_loss: float | None
    best_step: int | None
    best_metrics: dict[str, float] = {}  # a classifier's, at the best step
    outputs: dict[str, str]  # "adapter" / "model" / "merged": directory
    diagnostics: list[FindingRecord]
    notes: list[str]

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)
