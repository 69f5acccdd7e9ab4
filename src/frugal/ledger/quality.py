"""Quality beside cost: what each run of one task bought, for the runs of a scope of tags
(a `--jobs` sweep's, or any runs sharing a tag).

Each run's quality is the best evaluation loss it reached (lower is better), beside its
dollars and hours. A run is on the **frontier** when no other run reached a loss as low
or lower for as few dollars or fewer (one of the two strictly): the runs a cost-minded
choice picks from. The runs are **ranked** frontier first, then each group by its loss
and then its dollars; a run that reached no evaluation (stopped before its first) is
listed apart and never ranked; dry runs are left out.

**Which setting moved it**: for each setting that differs between the ranked runs (the
model, the method, the LoRA rank, the learning rate, the effective batch, the epochs),
the best loss reached with each of its values; the gap between the best and the worst of
those is how far that setting moved the loss over these runs. It is a comparison of what
was run, not a controlled experiment: where two settings changed together across the
runs, a note says their effects cannot be told apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from frugal.ledger.budgets import tagged
from frugal.ledger.schema import RunRecord
from frugal.ledger.store import Ledger

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
    frontier: bool = False
    rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "rank": self.rank, "frontier": self.frontier,
                "best_eval_loss": self.best_eval_loss, "cost_usd": round(self.cost_usd, 4),
                "hours": round(self.hours, 4), "outcome": self.outcome,
                "settings": self.settings}  # fmt: skip


@dataclass
class Effect:
    """How far one setting moved the best loss over the runs: its values' best losses."""

    setting: str
    best_by_value: list[tuple[Any, float, int]]  # value, best loss with it, runs
    moved: float  # the worst value's best loss less the best value's

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting, "moved": round(self.moved, 6),
                "by_value": [{"value": v, "best_eval_loss": loss, "runs": n}
                             for v, loss, n in self.best_by_value]}  # fmt: skip


@dataclass
class QualityReport:
    scope: dict[str, str]
    runs: list[RunQuality]  # ranked first, then those without an evaluation
    effects: list[Effect]  # the settings that moved the loss most first
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "runs": [r.to_json() for r in self.runs],
                "effects": [e.to_json() for e in self.effects], "notes": self.notes}  # fmt: skip


def quality(led: Ledger, scope: Mapping[str, str]) -> QualityReport:
    """The runs of `scope` (every run when empty), dry runs aside, as the module says."""
    with led.session() as s:
        rows = s.scalars(
            select(RunRecord)
            .where(RunRecord.dry_run.is_(False), *tagged("run", RunRecord.id, dict(scope)))
            .order_by(RunRecord.started_at, RunRecord.id)
        ).all()
        runs = [_of(r) for r in rows]
    ranked = _ranked([r for r in runs if r.best_eval_loss is not None])
    unranked = [r for r in runs if r.best_eval_loss is None]
    effects, notes = _effects(ranked)
    if unranked:
        notes.append(f"{len(unranked)} run(s) reached no evaluation: listed, not ranked")
    if not runs:
        notes.append("no runs in this scope on the books")
    return QualityReport(dict(scope), ranked + unranked, effects, notes)


def _of(r: RunRecord) -> RunQuality:
    config, actual = r.config or {}, r.actual or {}
    settings = {}
    for name, path in SETTINGS.items():
        value: Any = config
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        settings[name] = value
    if settings["method"] == "full":
        settings["lora_r"] = None  # no adapters: the rank does not apply
    loss = actual.get("best_eval_loss")
    return RunQuality(r.id, settings, None if loss is None else float(loss), r.cost_usd,
                      r.hours, r.outcome or "running")  # fmt: skip


def _ranked(runs: list[RunQuality]) -> list[RunQuality]:
    """The runs marked on the frontier or not and numbered: frontier first, then by loss
    and dollars."""
    for r in runs:
        assert r.best_eval_loss is not None
        r.frontier = not any(
            o is not r and o.best_eval_loss is not None
            and o.best_eval_loss <= r.best_eval_loss and o.cost_usd <= r.cost_usd
            and (o.best_eval_loss < r.best_eval_loss or o.cost_usd < r.cost_usd)
            for o in runs
        )  # fmt: skip
    order = sorted(runs, key=lambda r: (not r.frontier, r.best_eval_loss, r.cost_usd))
    for i, r in enumerate(order, start=1):
        r.rank = i
    return order


def _effects(runs: list[RunQuality]) -> tuple[list[Effect], list[str]]:
    """Each varied setting's best loss by value, the largest gap first; a note for the
    settings that always changed together."""
    varied = [n for n in SETTINGS if len({_key(r.settings[n]) for r in runs}) > 1]
    effects = []
    for name in varied:
        best: dict[str, tuple[Any, float, int]] = {}
        for r in runs:
            assert r.best_eval_loss is not None
            v = r.settings[name]
            _, loss, n = best.get(_key(v), (v, float("inf"), 0))
            best[_key(v)] = (v, min(loss, r.best_eval_loss), n + 1)
        by_value = sorted(best.values(), key=lambda x: x[1])
        effects.append(Effect(name, by_value, by_value[-1][1] - by_value[0][1]))
    effects.sort(key=lambda e: -e.moved)

    def values(*names: str) -> set[tuple[str, ...]]:
        return {tuple(_key(r.settings[n]) for n in names) for r in runs}

    # two settings changed together when each value of one goes with one value of the other
    notes = [f"{a} and {b} changed together: their effects cannot be told apart"
             for i, a in enumerate(varied) for b in varied[i + 1 :]
             if len(values(a, b)) == len(values(a)) == len(values(b))]  # fmt: skip
    return effects, notes


def _key(value: Any) -> str:
    return repr(value)
