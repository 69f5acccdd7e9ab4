"""A model's life in service, each way to get there compared over a horizon (`frugal
lifecycle`): serve the large model as it is, train a smaller one (fine-tune or distil) and
serve that, or call a hosted API that serves the large model.

Each way has its training dollars (once, before serving: `frugal plan`'s plan of the job),
its serving dollars a month (a self-hosted deployment, `serve.plan`'s cheapest, is billed
every hour of the month; an API bills the month's tokens), and from them:

    total            = training x trainings + serving a month x months
    $ per million    = total / (requests a month x months) x 1e6
    GPU-hours        = training's x trainings + the deployment's GPUs x hours a month x months

where a model trained again every K months (`retrain_every`) is trained 1 + (months - 1) // K
times over the horizon (once: K = 0).

A trained way pays for itself against a way that serves for more a month after
training / (their monthly difference) months (`pays_back_months`). Where a way's quality
is known (the books' evaluations, or given), the frontier is the ways no other beats on
both dollars per million predictions and quality (one of the two strictly): the ways a
cost-minded choice picks from (the guidance frugal follows: plot cost per prediction
against quality and pick from the Pareto frontier).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class Way:
    """One way to serve the load: what serves it, and what it costs."""

    name: str  # "serve meta-llama/Llama-3.1-8B as it is"
    model: str  # the model that answers
    serving: str  # the deployment or the API
    training_usd: float = 0.0
    training_gpu_h: float = 0.0
    serving_usd_month: float = 0.0
    serving_gpu_h_month: float = 0.0  # an API: none of yours
    quality: float | None = None
    quality_from: str = ""  # a run on the books, or --quality


@dataclass(frozen=True)
class Lifecycle:
    ways: list[Way]
    months: int
    requests_per_month: float
    metric: str  # what quality is: "loss on the labels", "accuracy"
    higher_is_better: bool
    retrain_every: int = 0  # months between trainings (0: trained once)

    @property
    def trainings(self) -> int:
        return 1 + (self.months - 1) // self.retrain_every if self.retrain_every else 1

    def total_usd(self, w: Way) -> float:
        return w.training_usd * self.trainings + w.serving_usd_month * self.months

    def gpu_hours(self, w: Way) -> float:
        return w.training_gpu_h * self.trainings + w.serving_gpu_h_month * self.months

    def usd_per_million(self, w: Way) -> float:
        return self.total_usd(w) / max(self.requests_per_month * self.months, 1e-9) * 1e6

    @property
    def cheapest(self) -> Way:
        return min(self.ways, key=self.total_usd)

    def _better(self, a: Way, b: Way) -> bool:
        """`a` does at least as well as `b` on both, strictly on one."""
        assert a.quality is not None and b.quality is not None
        qa, qb = (a.quality, b.quality) if self.higher_is_better else (-a.quality, -b.quality)
        ca, cb = self.usd_per_million(a), self.usd_per_million(b)
        return qa >= qb and ca <= cb and (qa > qb or ca < cb)

    @cached_property  # asked once per way by the JSON and the table
    def frontier(self) -> list[Way]:
        """The ways of known quality no other way beats, cheapest first."""
        known = [w for w in self.ways if w.quality is not None]
        front = [w for w in known if not any(self._better(o, w) for o in known if o is not w)]
        return sorted(front, key=self.usd_per_million)

    def pays_back_months(self, trained: Way, other: Way) -> float | None:
        """Months of serving after which `trained` has cost less than `other` in all (None:
        never, its serving costs as much a month or more); of its first training."""
        saved = other.serving_usd_month - trained.serving_usd_month
        extra = trained.training_usd - other.training_usd
        if saved <= 0:
            return None
        return max(extra, 0.0) / saved

    def way_json(self, w: Way) -> dict[str, Any]:
        return {
            "name": w.name, "model": w.model, "serving": w.serving,
            "training_usd": round(w.training_usd, 2),  # one training; `trainings` of them
            "training_gpu_hours": round(w.training_gpu_h, 2),
            "serving_usd_per_month": round(w.serving_usd_month, 2),
            "total_usd": round(self.total_usd(w), 2),
            "usd_per_million_predictions": round(self.usd_per_million(w), 4),
            "gpu_hours": round(self.gpu_hours(w), 1),
            "quality": w.quality, "quality_from": w.quality_from or None,
            "on_frontier": w in self.frontier,
        }  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "months": self.months,
            "trainings": self.trainings,
            "requests_per_month": round(self.requests_per_month),
            "quality_metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "ways": [self.way_json(w) for w in self.ways],
            "cheapest": self.cheapest.name,
            "frontier": [w.name for w in self.frontier],
        }
