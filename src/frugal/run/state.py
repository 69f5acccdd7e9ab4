"""The training state a checkpoint saves and a resume restores, as one typed object.

Everything the loop carries across steps that is not a tensor lives here: the position
(step), the money and time already spent, the micro-batch after any OOM back-off, what the
checkpoint depends on (`run_key`), the best evaluation, the token and timing sums and the
diagnostics' windows. It is written as `state.json` in each checkpoint and read back whole:
a field that is missing, unknown or of the wrong type is an error naming the field, never
a silent default. `VERSION` changes whenever a field does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from frugal.errors import FrugalError

VERSION = 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FindingRecord(Strict):
    """A diagnostic finding, as the run summary and the checkpoint keep it."""

    kind: str
    step: int
    message: str


class TrainState(Strict):
    version: int
    step: int  # optimizer steps done: also the data position (a function of the step)
    spent_usd: float  # dollars before this session (the meter adds the session's own)
    elapsed_s: float
    micro_batch: int  # after any OOM back-off, kept across a restart
    world: int  # processes that wrote it (RNG streams are per process)
    run_key: dict[str, Any]  # what the weights, optimizer state and data position depend on
    best_eval: float | None  # the evaluation loss at the best step
    best_step: int | None
    # the best value of training.best_metric (the loss, or a classifier's metric), and the
    # classifier's metrics at that step
    best_score: float | None = None
    best_metrics: dict[str, float] = {}
    bad_evals: int  # evaluations since the best (early stopping)
    tokens: float  # trained tokens, all steps
    train_tokens: float  # trained tokens of steps after each session's first (warm-up)
    train_time_s: float  # and their seconds
    step_times: list[float]  # the last ten steps' seconds
    findings: list[FindingRecord]
    diagnostics: dict[str, Any] | None  # the diagnostics' windows

    @field_validator("version")
    @classmethod
    def _known(cls, v: int) -> int:
        if v != VERSION:
            raise ValueError(f"version {v}, this frugal reads version {VERSION}")
        return v

    @classmethod
    def fresh(cls, micro_batch: int, world: int, run_key: dict[str, Any]) -> TrainState:
        return cls(
            version=VERSION,
            step=0,
            spent_usd=0.0,
            elapsed_s=0.0,
            micro_batch=micro_batch,
            world=world,
            run_key=run_key,
            best_eval=None,
            best_step=None,
            bad_evals=0,
            tokens=0.0,
            train_tokens=0.0,
            train_time_s=0.0,
            step_times=[],
            findings=[],
            diagnostics=None,
        )

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    @classmethod
    def read(cls, path: Path) -> TrainState:
        """The state saved in checkpoint directory `path`."""
        file = path / "state.json"
        try:
            return cls.model_validate(json.loads(file.read_text()))
        except (OSError, ValueError) as e:
            if isinstance(e, ValidationError):
                err = e.errors()[0]
                where = ".".join(str(x) for x in err.get("loc", ())) or "state"
                why = f"{where}: {str(err.get('msg', '')).removeprefix('Value error, ')}"
            else:
                why = str(e)
            raise FrugalError(
                f"{file}: not a training state this frugal can resume ({why}): resume it "
                "with the frugal version that wrote it, or start again in a new output_dir"
            ) from None
