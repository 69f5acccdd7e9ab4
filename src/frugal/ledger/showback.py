"""The weekly showback: each team's spend in a week against the week before, its costliest
runs and its failures, as Markdown for team leads (`frugal costs showback`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased

from frugal.formats import usd_cents
from frugal.ledger.periods import parse_week
from frugal.ledger.report import RUNNING, Group, Grouping, group_spend, label, totals, within
from frugal.ledger.schema import RunRecord, Tag
from frugal.ledger.store import Ledger

TOP_RUNS = 3  # a team's costliest runs shown


@dataclass
class TopRun:
    id: str
    model: str
    gpu: str
    gpus: int
    outcome: str
    hours: float
    cost_usd: float


@dataclass
class Showback:
    week_start: datetime
    teams: list[tuple[Group, Group]]  # (this week, the week before), by spend this week
    top: dict[str, list[TopRun]]
    total: Group
    total_before: Group

    def to_markdown(self) -> str:
        iso = self.week_start.isocalendar()
        lines = [
            f"# GPU spend by team: week of {self.week_start:%Y-%m-%d} ({iso.year}-W{iso.week:02d})",
            "",
            f"Total **{usd_cents(self.total.spend_usd)}**, "
            f"{_change(self.total.spend_usd, self.total_before.spend_usd)} vs the week before "
            f"({usd_cents(self.total_before.spend_usd)}) · {self.total.runs} runs · "
            f"{_failures(self.total)}.",
            "",
            "| team | spend | vs the week before | runs | failed | preempted | lost |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for g, before in self.teams:
            lines.append(
                f"| {g.name} | {usd_cents(g.spend_usd)} | "
                f"{_change(g.spend_usd, before.spend_usd)} | "
                f"{g.runs} | {g.outcomes['failed']} | {g.outcomes['preempted']} | "
                f"{usd_cents(g.lost_usd)} |"
            )
        if not self.teams:
            lines.append("| (no spend) | $0.00 | | 0 | 0 | 0 | $0.00 |")
        for g, _ in self.teams:
            lines += ["", f"## {g.name}", ""]
            runs = self.top.get(g.name, [])
            if runs:
                lines += [
                    "| top run | model | GPUs | outcome | hours | cost |",
                    "|---|---|---|---|---:|---:|",
                ]
                lines += [
                    f"| {r.id[:8]} | {r.model} | {r.gpus}x {r.gpu or '?'} | {r.outcome} | "
                    f"{r.hours:.2f} | {usd_cents(r.cost_usd)} |"
                    for r in runs
                ]
            else:
                lines.append("No runs; other costs only." if g.other_costs else "No spend.")
            lines += ["", f"Failures: {_failures(g)}."]
            if g.other_costs:
                lines[-1] += f" Other costs: {g.other_costs}, {usd_cents(g.other_usd)}."
        return "\n".join(lines) + "\n"


def showback(led: Ledger, week: str = "last", at: datetime | None = None) -> Showback:
    """Each team's spend in `week` against the week before, its top runs and failures."""
    w0 = parse_week(week, at)
    w1, before = w0 + timedelta(days=7), w0 - timedelta(days=7)
    team = Grouping("team", key="team")
    with led.session() as s:
        this = group_spend(s, team, w0, w1)
        prev = group_spend(s, team, before, w0)
        top = top_runs(s, "team", w0, w1, TOP_RUNS)
    names = sorted(this.keys() | prev.keys(), key=lambda n: (-this.get(n, Group(n)).spend_usd, n))
    teams = [(this.get(n, Group(n)), prev.get(n, Group(n))) for n in names]
    return Showback(w0, teams, top, totals(this.values()), totals(prev.values()))


def top_runs(
    s: Session, key: str, start: datetime, end: datetime, n: int
) -> dict[str, list[TopRun]]:
    """The `n` costliest runs started in [start, end) of each value of tag `key`."""
    t = aliased(Tag)
    rank = func.row_number().over(
        partition_by=t.value, order_by=(RunRecord.cost_usd.desc(), RunRecord.id)
    )
    inner = (
        select(
            t.value.label("g"),
            RunRecord.id,
            RunRecord.model,
            RunRecord.gpu,
            RunRecord.gpus,
            RunRecord.outcome,
            RunRecord.hours,
            RunRecord.cost_usd,
            rank.label("rank"),
        )
        .outerjoin(t, and_(t.kind == "run", t.ref == RunRecord.id, t.key == key))
        .where(*within(RunRecord.started_at, start, end))
        .subquery()
    )
    q = select(inner).where(inner.c.rank <= n).order_by(inner.c.g, inner.c.rank)
    out: dict[str, list[TopRun]] = {}
    for row in s.execute(q):
        out.setdefault(label(row.g), []).append(
            TopRun(
                row.id,
                row.model,
                row.gpu,
                row.gpus,
                row.outcome or RUNNING,
                row.hours,
                row.cost_usd,
            )
        )
    return out


def _change(now_usd: float, before_usd: float) -> str:
    diff = now_usd - before_usd
    sign = "+" if diff >= 0 else "-"
    pct = f" ({sign}{abs(diff) / before_usd:.0%})" if before_usd > 0 else " (new)"
    return f"{sign}${abs(diff):,.2f}{pct if diff or before_usd else ''}"


def _failures(g: Group) -> str:
    failed, preempted = g.outcomes["failed"], g.outcomes["preempted"]
    if not failed and not preempted:
        return "no failed or preempted runs"
    return f"{failed} failed, {preempted} preempted ({usd_cents(g.lost_usd)} lost)"
