"""What the books measured, as the calibration and the advice read it: each run that
measured tokens/s or peak memory as a `Sample` (the estimator's inputs, the job it ran at
the micro-batch it used, its profile, and the measurements), with the estimator's
prediction for it under candidate constants; and which runs are held back to judge a fit.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from frugal import calibration
from frugal.errors import FrugalError
from frugal.estimate.core import get_profile, memory_at
from frugal.estimate.overheads import Overheads
from frugal.estimate.profile import Profile
from frugal.estimate.throughput import SpeedConstants, step_time
from frugal.hardware.gpus import GIB, GPU, lookup_gpu
from frugal.ledger.schema import RunRecord
from frugal.models.specs import load_spec
from frugal.step.job import TrainJob

METRICS = ("tokens_per_s", "peak_reserved_gib")


def _pos(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def run_job(r: RunRecord) -> TrainJob | None:
    """The job a run ran: its config's, at the micro-batch and accumulation it used."""
    raw = (r.config or {}).get("job")
    if not isinstance(raw, dict):
        return None
    try:
        job = TrainJob.model_validate(raw)
    except ValidationError:
        return None
    a = r.actual or {}
    micro, accum = _pos(a.get("micro_batch")), _pos(a.get("grad_accum"))
    update = {"batch": int(micro or job.batch), "grad_accum": int(accum or job.grad_accum)}
    return job.model_copy(update=update)


class Profiles:
    """Model specs and estimator profiles of recorded runs, each loaded once."""

    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}
        self._profiles: dict[tuple[str, str], Profile] = {}

    def get(self, model: str, job: TrainJob) -> Profile | str:
        """The run's profile, or why there is none."""
        try:
            if model not in self._specs:
                self._specs[model] = load_spec(model)
            spec = self._specs[model]
            key = (model, job.model_dump_json())
            if key not in self._profiles:
                self._profiles[key] = get_profile(spec, job, job.seq, "calibrating from a run")
        except FrugalError as e:
            return str(e)
        return self._profiles[key]


@dataclass
class Sample:
    """One run as the calibration sees it: the estimator's inputs and what was measured."""

    run_id: str
    method: str
    gpu: GPU | None
    job: TrainJob
    prof: Profile
    tps: float | None  # measured tokens/s (all GPUs), None without a catalog GPU
    reserved: float | None  # measured peak reserved, GiB per GPU
    allocated: float | None
    held_back: bool = False

    def speed(self, data: dict[str, Any]) -> float | None:
        """Predicted tokens/s with the calibration `data`."""
        if self.gpu is None:
            return None
        c = calibration.resolve(data, "speed", SpeedConstants, self.gpu.name, self.method)
        s = step_time(self.prof, self.job, self.gpu, c=c)
        return s.tokens_per_s if s else None

    def memory(self, data: dict[str, Any]) -> tuple[float, float]:
        """Predicted (peak allocated, peak reserved) in GiB with the calibration `data`."""
        ov = calibration.resolve(data, "memory", Overheads, None, self.method)
        m = memory_at(self.prof, self.job, self.job.batch, self.job.seq, ov)
        return m.peak_allocated / GIB, m.peak_reserved / GIB


def samples(
    runs: Iterable[RunRecord],
    profiles: Profiles | None = None,
) -> tuple[list[Sample], Counter[str]]:
    """The runs with a measured figure the estimator can be checked against, and why the
    others that measured something were left out."""
    profiles = profiles or Profiles()
    out, skipped = [], Counter[str]()
    for r in runs:
        a = r.actual or {}
        tps, res, alloc = (_pos(a.get(k)) for k in (*METRICS, "peak_allocated_gib"))
        if tps is None and res is None:
            continue
        gpu = lookup_gpu(r.gpu) if r.gpu else None
        if gpu is None:
            tps = None  # no step time without a catalog GPU
            if res is None:
                skipped["not on a catalog GPU"] += 1
                continue
        job = run_job(r)
        if job is None:
            skipped["no valid job in its config"] += 1
            continue
        got = profiles.get(r.model, job)
        if isinstance(got, str):
            skipped[f"model not loadable ({got})"] += 1
            continue
        s = Sample(r.id, job.method, gpu, job, got, tps, res, alloc)
        if tps is not None and s.speed({}) is None:
            s.tps = None  # the GPU cannot run the job's dtype
        if s.tps is None and s.reserved is None:
            skipped["no step time on its GPU"] += 1
            continue
        out.append(s)
    return out, skipped


def hold_back(items: list[Sample], share: float) -> None:
    """Mark round(share x n) runs (at least one when share > 0), the first by a hash of
    their ids: the same runs every time, whatever order the ledger returns."""
    n = max(1, round(share * len(items))) if share > 0 else 0
    ranked = sorted(items, key=lambda s: hashlib.sha256(s.run_id.encode()).hexdigest())
    for i, s in enumerate(ranked):
        s.held_back = i < n
