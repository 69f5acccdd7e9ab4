"""Quality beside cost: what each run of one task bought, for the runs of a scope of tags
(a `--jobs` sweep's, or any runs sharing a tag).

Each run's quality is a metric at its best evaluation, beside its dollars and hours: the
evaluation loss (lower is better), or a classifier's accuracy or macro-F1 (higher is
better; `frugal train` records them at the best step). A run is on the **frontier** when
no other run did as well or better for as few dollars or fewer (one of the two strictly):
the runs a cost-minded choice picks from. The runs are **ranked** frontier first, then
each group by its metric and then its dollars; a run without the metric (stopped before
its first evaluation, or not a classifier) is listed apart and never ranked; dry runs are
left out.

**Comparable runs only**: a metric compares runs of one task on one dataset (a sentiment
classifier's eval loss of 0.14 says nothing against a language model's 2.39, nor a loss on
one validation set against one on another). The runs are grouped by their task and their
data file; frontier, ranks and effects are each group's own, and every run says its group.

**Which setting moved it**: for each setting that differs between the ranked runs (the
model, the method, the LoRA rank, the learning rate, the effective batch, the epochs),
the best metric reached with each of its values; the gap between the best and the worst of
those is how far that setting moved it over these runs. It is a comparison of what
was run, not a controlled experiment: where two settings changed together across the
runs, a note says their effects cannot be told apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from frugal.errors import FrugalError
from frugal.ledger.budgets import tagged
from frugal.ledger.schema import RunRecord
from frugal.ledger.store import Ledger

# a metric: where a run's end keeps it, what it is called, and whether higher is better
METRICS = {
    "eval_loss": ("best_eval_loss", "loss", False),
    "accuracy": ("accuracy", "accuracy", True),
    "macro_f1": ("macro_f1", "macro-F1", True),
}
# a setting of a run: where the run config keeps it
SETTINGS = {
    "model": ("model",),
    "method": ("job", "method"),
    "lora_r": ("job", "lora_r"),
    "learning_rate": ("training", "learning_rate"),
    "effective_batch": ("training", "effective_batch"),
    "epochs": ("data", "epochs"),
}


@dataclass
class RunQuality:
    """One run: what it reached and what it cost."""

    run_id: str
    settings: dict[str, Any]
    best_eval_loss: float | None
    cost_usd: float
    hours: float
    outcome: str
    value: float | None = None  # the report's metric at the run's best evaluation
    frontier: bool = False
    rank: int | None = None  # within its group
    group: str = ""  # its task on its data: only runs of one group are compared

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "group": self.group,
            "rank": self.rank,
            "frontier": self.frontier,
            "value": self.value,
            "best_eval_loss": self.best_eval_loss,
            "cost_usd": round(self.cost_usd, 4),
            "hours": round(self.hours, 4),
            "outcome": self.outcome,
            "settings": self.settings,
        }


@dataclass
class Effect:
    """How far one setting moved the metric over the runs: its values' best."""

    setting: str
    best_by_value: list[tuple[Any, float, int]]  # value, best metric with it, runs
    moved: float  # the gap between the best value's best and the worst value's
    group: str = ""  # the runs it was measured over

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "group": self.group,
            "moved": round(self.moved, 6),
            "by_value": [
                {"value": v, "best": best, "runs": n} for v, best, n in self.best_by_value
            ],
        }


@dataclass
class QualityReport:
    scope: dict[str, str]
    metric: str  # a key of METRICS
    runs: list[RunQuality]  # ranked first, then those without the metric
    effects: list[Effect]  # the settings that moved the metric most first
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return METRICS[self.metric][1]

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "metric": self.metric,
            "label": self.label,
            "higher_is_better": METRICS[self.metric][2],
            "runs": [r.to_json() for r in self.runs],
            "effects": [e.to_json() for e in self.effects],
            "notes": self.notes,
        }


def quality(led: Ledger, scope: Mapping[str, str], metric: str = "eval_loss") -> QualityReport:
    """The runs of `scope` (every run when empty), dry runs aside, by `metric` (a key of
    METRICS), as the module says."""
    if metric not in METRICS:
        raise FrugalError(f"metric {metric!r}: use {', '.join(METRICS)}")
    key, _, higher = METRICS[metric]
    with led.session() as s:
        rows = s.scalars(
            select(RunRecord)
            .where(RunRecord.dry_run.is_(False), *tagged("run", RunRecord.id, dict(scope)))
            .order_by(RunRecord.started_at, RunRecord.id)
        ).all()
        runs = [_of(r, key) for r in rows]
    sign = -1.0 if higher else 1.0  # scores: lower is better
    groups = list(dict.fromkeys(r.group for r in runs))  # in the order first run
    ranked, effects, notes = [], [], []
    for g in groups:
        mine = _ranked([r for r in runs if r.group == g and r.value is not None], sign)
        got, said = _effects(mine, sign)
        ranked += mine
        effects += [Effect(e.setting, e.best_by_value, e.moved, g) for e in got]
        notes += [f"{g}: {n}" if len(groups) > 1 else n for n in said]
    effects.sort(key=lambda e: -e.moved)
    if len(groups) > 1:
        notes.insert(
            0,
            f"runs of {len(groups)} tasks or datasets ({'; '.join(groups)}): "
            "ranked and compared within each, never across",
        )
    unranked = [r for r in runs if r.value is None]
    if unranked:
        notes.append(
            f"{len(unranked)} run(s) have no {METRICS[metric][1]} (no evaluation "
            "reached, or not a classifier): listed, not ranked"
        )
    if not runs:
        notes.append("no runs in this scope on the books")
    return QualityReport(dict(scope), metric, ranked + unranked, effects, notes)


def _of(r: RunRecord, metric_key: str) -> RunQuality:
    config, actual = r.config or {}, r.actual or {}
    settings = {}
    for name, path in SETTINGS.items():
        value: Any = config
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        settings[name] = value
    if settings["method"] == "full":
        settings["lora_r"] = None  # no adapters: the rank does not apply
    loss, value = actual.get("best_eval_loss"), actual.get(metric_key)
    task = (config.get("job") or {}).get("task") or "causal"
    data = (config.get("data") or {}).get("path") or "no data file"
    return RunQuality(
        r.id,
        settings,
        None if loss is None else float(loss),
        r.cost_usd,
        r.hours,
        r.outcome or "running",
        None if value is None else float(value),
        group=f"{task} on {data}",
    )


def _score(r: RunQuality, sign: float) -> float:
    assert r.value is not None
    return sign * r.value


def _ranked(runs: list[RunQuality], sign: float) -> list[RunQuality]:
    """The runs marked on the frontier or not and numbered: frontier first, then by their
    score (`sign` x the metric: lower is better) and dollars."""
    for r in runs:
        s = _score(r, sign)
        r.frontier = not any(
            o is not r
            and _score(o, sign) <= s
            and o.cost_usd <= r.cost_usd
            and (_score(o, sign) < s or o.cost_usd < r.cost_usd)
            for o in runs
        )
    order = sorted(runs, key=lambda r: (not r.frontier, _score(r, sign), r.cost_usd))
    for i, r in enumerate(order, start=1):
        r.rank = i
    return order


def _effects(runs: list[RunQuality], sign: float) -> tuple[list[Effect], list[str]]:
    """Each varied setting's best metric by value, the largest gap first; a note for the
    settings that always changed together."""
    varied = [n for n in SETTINGS if len({_key(r.settings[n]) for r in runs}) > 1]
    effects = []
    for name in varied:
        best: dict[str, tuple[Any, float, int]] = {}  # its best score, in sign x metric
        for r in runs:
            v = r.settings[name]
            _, score, n = best.get(_key(v), (v, float("inf"), 0))
            best[_key(v)] = (v, min(score, _score(r, sign)), n + 1)
        by_score = sorted(best.values(), key=lambda x: x[1])
        by_value = [(v, sign * score, n) for v, score, n in by_score]
        effects.append(Effect(name, by_value, by_score[-1][1] - by_score[0][1]))
    effects.sort(key=lambda e: -e.moved)

    def values(*names: str) -> set[tuple[str, ...]]:
        return {tuple(_key(r.settings[n]) for n in names) for r in runs}

    # two settings changed together when each value of one goes with one value of the other
    notes = [
        f"{a} and {b} changed together: their effects cannot be told apart"
        for i, a in enumerate(varied)
        for b in varied[i + 1 :]
        if len(values(a, b)) == len(values(a)) == len(values(b))
    ]
    return effects, notes


def _key(value: Any) -> str:
    return repr(value)


# what a model is measured by beside its cost (`frugal lifecycle`): its loss on held-out
# labels (a distilled student's `label_loss`, since its eval loss mixes in the teacher's
# soft targets; else the eval loss), or a classifier's accuracy or macro-F1; by the keys of
# a run's end where each is kept, the first found
MODEL_METRICS = {
    "loss": (("label_loss", "best_eval_loss"), "held-out loss on the labels", False),
    "accuracy": (("accuracy",), "accuracy", True),
    "macro_f1": (("macro_f1",), "macro-F1", True),
}


@dataclass(frozen=True)
class Measured:
    value: float
    run_id: str


def measured(
    led: Ledger,
    metric: str,
    *,
    runs: tuple[str, ...] = (),
    model: str | None = None,
    task: str = "causal",
    data: str | None = None,
) -> Measured | None:
    """The newest finished run's `metric` (a key of MODEL_METRICS): among `runs` (the runs
    that made a model), else among those that trained `model` for `task` (on `data`)."""
    keys = MODEL_METRICS[metric][0]
    with led.session() as s:
        rows = s.scalars(
            select(RunRecord)
            .where(RunRecord.dry_run.is_(False), RunRecord.outcome.is_not(None))
            .order_by(RunRecord.started_at.desc())
        ).all()
    for r in rows:
        config = r.config or {}
        if runs:
            if r.id not in runs:
                continue
        elif not (
            _same(config.get("model"), model)
            and ((config.get("job") or {}).get("task") or "causal") == task
            and (data is None or _same((config.get("data") or {}).get("path"), data))
        ):
            continue
        actual = r.actual or {}
        value = next((actual[k] for k in keys if actual.get(k) is not None), None)
        if value is not None:
            return Measured(float(value), r.id)
    return None


def _same(a: Any, b: Any) -> bool:
    """Two model or data names the same: as written, or one existing path."""
    if a is None or b is None:
        return False
    if str(a) == str(b):
        return True
    pa, pb = Path(str(a)).expanduser(), Path(str(b)).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()
