"""A jobs file (`frugal plan --jobs JOBS.yaml`) planned as one bill: read and check the jobs,
plan each alone on every offer, pack them onto shared VMs (`jobs`), time the spot VMs.

    defaults:                 # optional: merged into every job
      method: lora
      data: local             # where datasets are: local | hub | PROVIDER:REGION
    jobs:
      - name: lr-1e-4
        model: meta-llama/Llama-3.1-8B
        tokens: 20M           # or dataset: path/to/train.jsonl (+ epochs)
        deadline: 24h         # from now; none = whenever
        tags: {project: sweep}
        overrides: [training.learning_rate=1e-4]   # into its run config
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from frugal.counts import parse_count
from frugal.data.count import count_tokens
from frugal.durations import Hours
from frugal.errors import FrugalError
from frugal.hardware.offers import Offer
from frugal.models.specs import load_spec
from frugal.plan.constraints import Constraints
from frugal.plan.jobs import JobQuote, Packing, pack, time_spot
from frugal.plan.plans import Infeasible
from frugal.plan.reasons import data_reason
from frugal.plan.search import search
from frugal.plan.timing import PricePoint
from frugal.plan.transfer import measure_gb, parse_location
from frugal.step.job import Method, make_job
from frugal.validation import problem

BYTES_PER_TOKEN = 4.0  # a dataset known only by its tokens: ~4 bytes of JSONL text per token


def _count(v: Any) -> Any:
    """20M, 1.5B, 2e7 as a number (None stays None)."""
    return v if v is None else parse_count(v)


class JobSpec(BaseModel):
    """One fine-tune of the jobs file."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model: str
    method: Method = "lora"
    tokens: Annotated[float | None, BeforeValidator(_count)] = Field(None, gt=0)
    dataset: str | None = None
    epochs: float = Field(1.0, gt=0)
    seq: int = Field(2048, ge=16)
    lora_r: int | None = Field(None, ge=1)
    deadline: Hours = None
    data: str = "local"
    data_gb: float | None = Field(None, gt=0)  # the data's size where the file is not here
    tags: dict[str, str] = Field(default_factory=dict)
    overrides: list[str] = Field(default_factory=list)  # key=value into its run config


class JobsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    defaults: dict[str, Any] = Field(default_factory=dict)
    jobs: list[dict[str, Any]] = Field(min_length=1)


def read_jobs(path: str) -> list[JobSpec]:
    """The jobs of a jobs file, defaults merged; errors name the job and field to fix."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise FrugalError(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise FrugalError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    try:
        f = JobsFile.model_validate(raw)
    except ValidationError as e:
        loc, _, msg = problem(e, JobsFile)
        where = ".".join(str(x) for x in loc) or "the file"
        raise FrugalError(f"{path}: {where}: {msg} (see `frugal plan --help`)") from None
    out = []
    for i, job in enumerate(f.jobs):
        merged = {**f.defaults, **job}
        try:
            spec = JobSpec.model_validate(merged)
        except ValidationError as e:
            loc, _, msg = problem(e, JobSpec)
            name = merged.get("name", f"jobs[{i}]")
            raise FrugalError(f"{path}: job {name}: {'.'.join(map(str, loc))}: {msg}") from None
        if (spec.tokens is None) == (spec.dataset is None):
            raise FrugalError(f"{path}: job {spec.name}: give tokens or dataset (one of them)")
        try:
            parse_location(spec.data)
        except FrugalError as e:
            raise FrugalError(f"{path}: job {spec.name}: data: {e}") from None
        out.append(spec)
    names = [j.name for j in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise FrugalError(f"{path}: two jobs are named {dup!r}: give each its own name")
    return out


@dataclass(frozen=True)
class Planned:
    job: JobSpec
    tokens: float  # all epochs
    per_epoch: float
    size_gb: float  # the dataset's size
    size_note: str


def _size(job: JobSpec, per_epoch: float) -> tuple[float, str]:
    if job.dataset:
        return measure_gb(job.dataset), f"{job.dataset} measured"
    if job.data_gb:
        return job.data_gb, "given (data_gb)"
    return per_epoch * BYTES_PER_TOKEN / 1e9, f"estimated at {BYTES_PER_TOKEN:g} B per token"


def _alone(p: Planned, offers: list[Offer], spot: str, memo: dict[Any, Any]) -> list[Any]:
    """Every single-machine plan of the job alone, no deadline, its data's moves priced by
    the search (jobs that differ only in name, deadline or overrides share one search)."""
    job = p.job
    key = (job.model, job.method, job.seq, job.lora_r, p.tokens, job.data, p.size_gb)
    if key not in memo:
        base = make_job(method=job.method, seq=job.seq, lora_r=job.lora_r)
        k = Constraints.build(
            tokens=p.tokens, methods=(job.method,), spot=spot, data=job.data, data_gb=p.size_gb
        )
        try:
            memo[key] = [
                x for x in search(load_spec(job.model), base, offers, k).plans if x.nodes == 1
            ]
        except Infeasible:
            memo[key] = []
    return list(memo[key])


def runs_of(p: Planned, offers: list[Offer], spot: str, memo: dict[Any, Any]) -> list[JobQuote]:
    """The job alone on every single-machine offer, on-demand and spot, with its data."""
    job, model = p.job, load_spec(p.job.model).id
    dataset = job.dataset or f"{job.name} (tokens)"
    return [
        JobQuote(job.name, model, dataset, job.deadline, plan)
        for plan in _alone(p, offers, spot, memo)
    ]


def plan_jobs(
    jobs: list[JobSpec],
    offers: list[Offer],
    history: list[PricePoint] | None,
    now: datetime,
    spot: str = "auto",
) -> tuple[Packing, list[Planned], list[str]]:
    """The packing of `jobs` on `offers`, spot VMs timed by `history`; notes say what was
    assumed and which jobs have no plan."""
    planned, notes = [], []
    by_job: dict[str, list[JobQuote]] = {}
    memo: dict[Any, Any] = {}
    for job in jobs:
        if job.dataset:
            tc = count_tokens(job.dataset, job.model, job.seq)
            per_epoch = float(tc.tokens)
            if cut := tc.stats.cut(job.seq, "seq"):
                notes.append(f"{job.name}: {cut}")
        else:
            per_epoch = float(job.tokens or 0)
        size, how = _size(job, per_epoch)
        p = Planned(job, per_epoch * job.epochs, per_epoch, size, how)
        planned.append(p)
        by_job[job.name] = runs_of(p, offers, spot, memo)
    packing = pack(by_job)
    missing = [j.name for j in jobs if j.name not in packing.alone]
    if missing:
        raise FrugalError(
            f"no offer runs {', '.join(missing)} by its deadline: give it a later deadline, "
            "or check --providers"
        )
    notes += _data_reasons(by_job, packing)
    notes += time_spot(packing.vms, history, now)
    return packing, planned, notes


def _data_reasons(by_job: dict[str, list[JobQuote]], packing: Packing) -> list[str]:
    """Where moving a job's data changed its offer: the dollars on each side."""
    out = []
    for name, chosen in packing.alone.items():
        ok = [r.plan for r in by_job[name] if r.deadline_h is None or r.plan.hours <= r.deadline_h]
        why = data_reason(chosen.plan, ok)
        if why:
            out.append(f"{name}: {why}")
    return out
