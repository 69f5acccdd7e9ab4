"""The estimate API: an `EstimateRequest` in (a model, the step, where it must fit), an
`Estimate` out (`frugal.estimate.core`: per-GPU memory by component, FLOPs, the fit),
through `make_estimate`. `frugal estimate` parses its options into the request; the step's
settings are a `TrainJob`, checked there."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from frugal.errors import FrugalError
from frugal.estimate.core import Estimate, estimate
from frugal.hardware.gpus import find_gpu
from frugal.models.specs import load_spec
from frugal.step.job import TrainJob


class EstimateRequest(BaseModel):
    """What `frugal estimate MODEL` is asked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="a bundled hub id, a local dir or config.json")
    job: TrainJob = Field(
        default_factory=lambda: TrainJob.model_validate({}), description="the training step"
    )
    gpu: str | None = Field(None, description="GPU to check the fit on (see gpus.csv names)")
    gpu_memory: float | None = Field(
        None, gt=0, le=4096, allow_inf_nan=False, description="or: usable GPU memory in GiB"
    )


def make_estimate(request: EstimateRequest) -> Estimate:
    """The step's per-GPU peak memory and FLOPs, and its fit on the GPU asked for."""
    q = request
    if q.gpu is not None and q.gpu_memory is not None:
        raise FrugalError("give --gpu or --gpu-memory, not both")
    spec = load_spec(q.model)
    card = find_gpu(q.gpu, "--gpu-memory GIB") if q.gpu else None
    return estimate(spec, q.job, gpu=card, gpu_memory_gib=q.gpu_memory)
