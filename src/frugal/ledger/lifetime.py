"""A model's life on the books: what training it and serving it cost, in dollars and
GPU-hours (`frugal costs lifetime MODEL`).

A served model is named as `frugal costs add --kind serving --model MODEL` names it:

- a model `frugal train` made: its run id, its output directory, or the `final` or `best`
  directory in it. The cost is tagged `run=<id>` (the run that trained it) and
  `model=<the run's model tag>` (its base model, as `costs report --by model` groups runs);
- any other model (a hub id served as it is): tagged `model=MODEL`.

Its lifetime is then the runs that trained it (every run with that output directory: a
run started again in the same directory is the same model's) and the costs tagged with
one of their ids, or, for a model no run made, the costs tagged with its name and no run.
A cost matched to a run from a bill is in that run's dollars already and is not counted
twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, String, cast, exists, select

from frugal.errors import FrugalError
from frugal.ledger.budgets import tagged
from frugal.ledger.schema import CostEntry, RunRecord, Tag
from frugal.ledger.store import Ledger, aware

MADE_IN = ("final", "best")  # what `frugal train` leaves in its output directory to serve
SERVING = "serving"  # the cost kind of serving a model


@dataclass(frozen=True)
class Served:
    """A model as the books know it: the runs that made it (none: a model served as it
    is), and the tags a cost of serving it carries."""

    name: str
    runs: tuple[str, ...]
    tags: dict[str, str]


def served(led: Ledger, name: str) -> Served:
    """`name` resolved: a run id, a run's output directory (or its final/best), or a
    model no run on these books made."""
    with led.session() as s:
        run = s.get(RunRecord, name)
        if run is None and _is_dir(p := Path(name).expanduser()):
            p = p.resolve()
            out = p.parent if p.name in MADE_IN else p
            run = s.scalars(
                select(RunRecord)
                .where(RunRecord.output_dir == str(out))
                .order_by(RunRecord.started_at.desc())
            ).first()
            if run is None:
                raise FrugalError(
                    f"--model {name}: no run on the books trained in {out}: give a run id, a "
                    "run's output directory, or a hub id"
                )
        if run is None:
            if len(name) > 300:
                raise FrugalError(f"--model: {len(name)} characters: name it in 300 or fewer")
            return Served(name, (), {"model": name})
        ids = s.scalars(select(RunRecord.id).where(RunRecord.output_dir == run.output_dir))
        runs = tuple(sorted(set(ids) | {run.id}))
        base = (
            s.scalar(
                select(Tag.value).where(Tag.kind == "run", Tag.ref == run.id, Tag.key == "model")
            )
            or run.model
        )
        return Served(run.output_dir or run.id, runs, {"model": base, "run": run.id})


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except OSError:  # a name too long to be a path
        return False


@dataclass
class Part:
    """Training or serving (or another kind of cost) of the model: entries, GPU-hours,
    dollars, and when."""

    what: str
    entries: int = 0
    gpu_hours: float = 0.0
    usd: float = 0.0
    first: datetime | None = None
    last: datetime | None = None

    def add(self, gpu_hours: float, usd: float, start: datetime, end: datetime) -> None:
        self.entries += 1
        self.gpu_hours += gpu_hours
        self.usd += usd
        start, end = aware(start), aware(end)
        self.first = start if self.first is None else min(self.first, start)
        self.last = end if self.last is None else max(self.last, end)

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "entries": self.entries,
            "gpu_hours": round(self.gpu_hours, 3),
            "usd": round(self.usd, 2),
            "first": self.first and self.first.isoformat(),
            "last": self.last and self.last.isoformat(),
        }


@dataclass
class Lifetime:
    model: Served
    parts: list[Part] = field(default_factory=list)  # training, serving, then other kinds

    @property
    def usd(self) -> float:
        return sum(p.usd for p in self.parts)

    @property
    def gpu_hours(self) -> float:
        return sum(p.gpu_hours for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "runs": list(self.model.runs),
            "parts": [p.to_json() for p in self.parts],
            "gpu_hours": round(self.gpu_hours, 3),
            "usd": round(self.usd, 2),
        }


def lifetime(led: Ledger, name: str) -> Lifetime:
    """What the model `name` (`served`) cost from its training to its latest serving."""
    model = served(led, name)
    out = Lifetime(model, [Part("training"), Part(SERVING)])
    with led.session() as s:
        for r in s.scalars(
            select(RunRecord).where(RunRecord.id.in_(model.runs), RunRecord.dry_run.is_(False))
        ):
            out.parts[0].add(r.gpu_hours, r.cost_usd, r.started_at, r.ended_at or r.heartbeat_at)
        ref = cast(CostEntry.id, String)
        mine: ColumnElement[bool]
        if model.runs:
            mine = exists().where(
                Tag.kind == "cost", Tag.ref == ref, Tag.key == "run", Tag.value.in_(model.runs)
            )
        else:
            has_run = exists().where(Tag.kind == "cost", Tag.ref == ref, Tag.key == "run")
            mine = tagged("cost", ref, model.tags)[0] & ~has_run
        costs = s.scalars(
            select(CostEntry).where(mine, CostEntry.run_id.is_(None)).order_by(CostEntry.at)
        )
        kinds = {p.what: p for p in out.parts}
        for c in costs:
            part = kinds.get(c.kind) or kinds.setdefault(c.kind, Part(c.kind))
            if part not in out.parts:
                out.parts.append(part)
            part.add(c.gpu_hours, c.amount_usd, c.at, c.period_end or c.at)
    if not model.runs and not any(p.entries for p in out.parts):
        raise FrugalError(
            f"{name}: nothing on the books trained or served it: give a run id or output "
            "directory, or put its serving on the books with frugal costs add --kind serving "
            f"--model {name}"
        )
    return out
