"""What a run was predicted to cost and need: the plan's figures from the run config, and on
CUDA the estimator's for the step that really runs (this GPU, this micro-batch). The run
summary puts them beside what happened; the guards use the step time before one is timed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from frugal.config import RunConfig
from frugal.estimate.core import get_profile, memory_at
from frugal.estimate.throughput import step_time
from frugal.hardware.gpus import lookup_gpu
from frugal.models.specs import load_spec


class Prediction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hours: float | None = None  # the plan's
    cost_usd: float | None = None
    gpu: str | None = None
    tokens_per_s: float | None = None  # the estimator's on CUDA, else the plan's
    peak_allocated_gib: float | None = None  # the estimator's, CUDA only
    peak_reserved_gib: float | None = None  # the estimator's on CUDA, else the plan's


def predict(cfg: RunConfig, micro: int, accum: int, device: str | None) -> Prediction:
    """The plan's prediction, refined by the estimator for `device` (a CUDA device name)."""
    pred = Prediction()
    if cfg.plan:
        p = cfg.plan
        pred = Prediction(
            hours=p.est_hours,
            cost_usd=p.est_cost_usd,
            tokens_per_s=p.tokens_per_s,
            peak_reserved_gib=p.peak_reserved_gib,
            gpu=p.gpu,
        )
    if device is None:
        return pred
    spec = load_spec(cfg.model)
    job = cfg.job.model_copy(update={"batch": micro, "grad_accum": accum})
    prof = get_profile(spec, job, job.seq, "the run's prediction")
    mem = memory_at(prof, job, job.batch, job.seq)
    pred.peak_allocated_gib = round(mem.peak_allocated / 2**30, 3)
    pred.peak_reserved_gib = round(mem.peak_reserved / 2**30, 3)
    gpu = lookup_gpu(device)
    speed = step_time(prof, job, gpu) if gpu else None
    if speed is not None:
        pred.tokens_per_s = round(speed.tokens_per_s, 1)
    return pred


def expected_step_s(cfg: RunConfig, prediction: Prediction) -> float:
    """A step's seconds before one is timed, for the budget and time guards; 0 when nothing
    predicts it (then only the first step is unguarded)."""
    if cfg.budget_usd is None and cfg.training.max_time_min is None:
        return 0.0  # no guard to feed
    tps = prediction.tokens_per_s
    return cfg.training.effective_batch * cfg.job.seq / tps if tps else 0.0
