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

from frugal.errors import FrugalError
from frugal.formats import usd
from frugal.ledger.lifetime import served
from frugal.ledger.quality import MODEL_METRICS, Measured, measured
from frugal.ledger.spool import attempt
from frugal.serve import compare
from frugal.serve.plan import HOURS_PER_MONTH, Option, ServePlan

DAYS_PER_MONTH = 30.44


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
class Training:
    """The smaller model's training, as `frugal plan` planned it."""

    usd: float
    gpu_hours: float
    hours: float
    label: str  # the plan's set-up, as the plan names it
    method: str
    distilled: bool  # from a teacher's soft targets (else fine-tuned on labels)
    plan_id: int | None = None  # the plan on the books


@dataclass(frozen=True)
class Quality:
    """A way's quality: a metric's value (None: unknown), and where it came from."""

    value: float | None = None
    source: str = ""  # "run 1a2b3c4d on the books", "--quality"


@dataclass(frozen=True)
class Lifecycle:
    ways: list[Way]
    months: int
    requests_per_month: float
    metric: str  # what quality is: "loss on the labels", "accuracy"
    higher_is_better: bool
    retrain_every: int = 0  # months between trainings (0: trained once)
    trained: int = 1  # the index of the way that trains a model (the others serve one as is)
    training: Training | None = None  # its training

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
            "name": w.name,
            "model": w.model,
            "serving": w.serving,
            "training_usd": round(w.training_usd, 2),  # one training; `trainings` of them
            "training_gpu_hours": round(w.training_gpu_h, 2),
            "serving_usd_per_month": round(w.serving_usd_month, 2),
            "total_usd": round(self.total_usd(w), 2),
            "usd_per_million_predictions": round(self.usd_per_million(w), 4),
            "gpu_hours": round(self.gpu_hours(w), 1),
            "quality": w.quality,
            "quality_from": w.quality_from or None,
            "on_frontier": w in self.frontier,
        }

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

    def notes(self) -> list[str]:
        """When training pays for itself against each other way, what is known of their
        quality, and where the figures come from."""
        train = self.ways[self.trained]
        out = [self._payback(train, other) for other in self.ways if other is not train]
        known = sum(w.quality is not None for w in self.ways)
        plan = self.training.plan_id if self.training else None
        if not known:
            out.append(
                "no quality on the books for these models: train and evaluate them "
                "(frugal train), or give --quality large=VALUE and trained=VALUE"
            )
        elif known < len(self.ways):
            out.append(
                f"the frontier is of the ways whose quality is known ({known} of "
                f"{len(self.ways)}); give the others' with --quality"
            )
        out.append(
            "serving: each model's cheapest deployment for the load (frugal serve "
            "plan), billed every hour of the month; training: frugal plan's plan (plan "
            f"{plan or 'not recorded'})"
        )
        return out

    def _payback(self, train: Way, other: Way) -> str:
        m = self.pays_back_months(train, other)
        if m is None:
            return (
                f"training never pays back against {other.name}: its serving costs "
                f"{usd(other.serving_usd_month)} a month, no more than the trained "
                f"model's {usd(train.serving_usd_month)}"
            )
        if self.retrain_every and m > self.retrain_every:
            return (
                f"each training costs more than the {self.retrain_every} months of "
                f"serving it saves against {other.name}"
            )
        when = f"{m:,.1f} months" if m >= 1 else f"{m * DAYS_PER_MONTH:,.1f} days"
        return f"training pays for itself against {other.name} after {when} of serving"


def lifecycle_of(
    large: ServePlan,
    small: ServePlan,
    training: Training,
    quality: tuple[Quality, Quality],
    metric: str,
    months: int,
    retrain_every: int = 0,
) -> Lifecycle:
    """The large model served as it is (`large`, its cheapest deployment), the smaller one
    trained (`training`) and served (`small`), and the cheapest API serving the large
    model, over `months` of the load; `quality`: the large model's and the trained one's,
    read as `metric` (a key of MODEL_METRICS)."""
    q_large, q_trained = quality
    how = "distilled" if training.distilled else "fine-tuned"
    ways = [
        _self_hosted(f"{_short(large.ask.spec.id)} as it is", large.best, q_large),
        _self_hosted(
            f"{_short(small.ask.spec.id)} {how}, {training.method}", small.best, q_trained, training
        ),
    ]
    apis = compare.apis(large)
    if apis:
        a = apis[0]
        ways.append(
            Way(
                f"{_short(large.ask.spec.id)} by API, {a['provider']}",
                large.ask.spec.id,
                f"{a['provider']} {a['api_model']}",
                serving_usd_month=a["usd_per_month"],
                quality=q_large.value,
                quality_from=q_large.source,
            )
        )
    _, label, higher = MODEL_METRICS[metric]
    requests = large.ask.billed_rate * 3600 * HOURS_PER_MONTH
    return Lifecycle(
        ways, months, requests, label, higher, retrain_every, trained=1, training=training
    )


def _short(model: str) -> str:
    """A model's name without its owner (the table's; the lines below it say the whole)."""
    return model.rstrip("/").rsplit("/", 1)[-1]


def _self_hosted(
    name: str, best: Option, quality: Quality, training: Training | None = None
) -> Way:
    gpus = best.instances * best.offer.gpus
    return Way(
        name,
        best.cap.d.spec.id,
        best.label(),
        training.usd if training else 0.0,
        training.gpu_hours if training else 0.0,
        best.usd_per_month,
        gpus * HOURS_PER_MONTH,
        quality.value,
        quality.source,
    )


def qualities(
    metric: str, large: str, model: str, task: str, data: str | None, given: dict[str, float]
) -> tuple[Quality, Quality]:
    """The large model's and the trained one's quality: given (`large`, `trained`), or the
    books' newest finished run that made the large model (a directory frugal trained) or
    trained the job (the same model, task and data)."""

    def books(led: Any) -> tuple[Measured | None, Measured | None]:
        try:
            runs = served(led, large).runs
        except FrugalError:
            runs = ()
        big = measured(led, metric, runs=runs) if runs else None
        return big, measured(led, metric, model=model, task=task, data=data)

    found, _ = attempt(books)
    seen = dict(zip(("large", "trained"), found or (None, None), strict=True))
    out = []
    for key in ("large", "trained"):
        m = seen[key]
        if key in given:
            out.append(Quality(given[key], "--quality"))
        else:
            out.append(Quality(m.value, f"run {m.run_id[:8]} on the books") if m else Quality())
    return out[0], out[1]
