"""`frugal costs add|import|report|showback|advise|quality|export|sync`: other spend on the books,
billing exports in, reports, advice and chargebacks out (frugal.ledger.report, .advise,
.focus)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from frugal import DISTRIBUTION
from frugal.cli import console, print_json
from frugal.cli.options import JSON_HELP, argument, number, option_set, takes
from frugal.errors import FrugalError
from frugal.files import check_target, replacing, write_text_atomic
from frugal.formats import usd
from frugal.ledger.tags import parse_tags, resolve
from frugal.step.job import installed_version

app = typer.Typer(
    help="Other spend, billing imports (FOCUS), reports, showback and exports.",
    no_args_is_help=True,
)


def _alerts(led: Any, tags: dict[str, str] | None = None) -> None:
    """The budget thresholds new spend crossed (of the budgets `tags` fall in, or all)."""
    from frugal.ledger.budgets import check_alerts
    from frugal.ledger.notify import announce

    err = Console(stderr=True)
    announce(check_alerts(led, tags), lambda text: err.print(text, highlight=False))


@option_set
class AddOptions:
    """The options of `frugal costs add`, in the order `--help` shows them."""

    amount: float = argument("USD spent, e.g. 12.50.", gt=0)
    kind: str = typer.Option("other", help="What it was: storage, notebook, inference, ...")
    description: str = typer.Option("", help="A few words on it.")
    resource_id: str = typer.Option("", help="The machine or resource it paid for.")
    provider: str = typer.Option("", help="Who billed it, e.g. aws or runpod.")
    at: str | None = typer.Option(None, help="When: ISO date or time, UTC \\[default: now].")
    gpu_hours: float = number(0.0, "GPU-hours it bought, if any.", ge=0)
    model: str | None = typer.Option(
        None,
        help="The model it served (with --kind serving): a run id or output directory for a "
        "model frugal trained, else a hub id; `costs lifetime MODEL` sums it with its training.",
    )
    tag: list[str] | None = typer.Option(
        None, help="Ledger tag key=value (project, team, env, ...); repeat for more."
    )
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)


@app.command("add")
@takes(AddOptions)
def add(ctx: typer.Context, o: AddOptions) -> None:
    """Put a cost that is not a `frugal train` run on the books."""
    from frugal.ledger.periods import parse_instant
    from frugal.ledger.store import Ledger

    if not o.kind.strip() or len(o.kind) > 50:
        raise FrugalError(f"--kind {o.kind!r}: name it in 1 to 50 characters, e.g. storage")
    when = parse_instant(o.at, "--at") if o.at else None
    tags = resolve(list(o.tag or []))
    led = Ledger()
    served = None
    if o.model is not None:
        from frugal.ledger.lifetime import served as find

        served = find(led, o.model)
        tags |= served.tags
    cid = led.add_cost(
        o.amount,
        o.kind.strip(),
        o.description[:500],
        o.resource_id[:300],
        at=when,
        tags=tags,
        provider=o.provider[:50],
        gpu_hours=o.gpu_hours,
    )
    _alerts(led, tags)
    if o.json_out:
        print_json({"cost_id": cid, "amount_usd": o.amount, "kind": o.kind, "tags": tags})
        return
    scope = ", ".join(f"{k}={v}" for k, v in tags.items())
    of = f" of {served.name}" if served else ""
    console().print(escape(f"cost {cid}: ${o.amount:,.2f} {o.kind}{of} on the books · {scope}"))


@app.command("lifetime")
def lifetime_(
    model: str = typer.Argument(
        ..., help="A run id or output directory (a model frugal trained), or a hub id."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """A model's training and serving on the books: GPU-hours and dollars, from its first
    run to its latest serving bill."""
    from frugal.ledger.lifetime import lifetime
    from frugal.ledger.store import Ledger

    life = lifetime(Ledger(), model)
    if json_out:
        print_json(life.to_json())
        return
    runs = f" (run {', '.join(r[:8] for r in life.model.runs)})" if life.model.runs else ""
    t = Table(title=escape(f"{life.model.name}{runs}: its lifetime on the books"))
    for c in ("part", "entries", "from", "to", "GPU-h", "spend"):
        t.add_column(c, justify="left" if c in ("part", "from", "to") else "right")
    for i, p in enumerate(life.parts):
        t.add_row(
            escape(p.what),
            str(p.entries),
            _day(p.first),
            _day(p.last),
            f"{p.gpu_hours:,.1f}",
            usd(p.usd),
            end_section=i == len(life.parts) - 1,
        )
    t.add_row("total", "", "", "", f"{life.gpu_hours:,.1f}", usd(life.usd))
    console().print(t)


@app.command("import")
def import_(
    file: str = typer.Argument(
        ..., help="A FOCUS CSV billing export, or a frugal backup (costs export --format jsonl)."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Import a FOCUS billing export (matched to runs) or a frugal backup; twice adds nothing."""
    from frugal.ledger.exchange import import_file
    from frugal.ledger.store import Ledger

    led = Ledger()
    r = import_file(led, file)
    _alerts(led)
    if json_out:
        print_json(r.to_json())
        return
    added = ", ".join(f"{n} {t}" for t, n in r.added.items() if n) or "nothing"
    skipped = sum(r.skipped.values())
    what = "rows" if r.format == "billing" else "records"
    line = f"{r.file} ({r.format}): {r.rows} {what} · added {added} · {skipped} already there"
    if r.format == "billing":
        line += f" · ${r.added_usd:,.2f} added"
        matched = ", ".join(
            f"{n} {'attributed by tags' if rule == 'tags' else 'by ' + rule.replace('_', ' ')}"
            for rule, n in r.matched.items()
        )
        line += f" · matched to runs: {matched or 'none'}, {r.unmatched} not"
    con = console()
    con.print(escape(line))
    if r.matched:
        con.print(
            f"matched rows billed ${r.matched_billed_usd:,.2f}; those runs metered "
            f"${r.matched_runs_usd:,.2f} (reports count the runs')"
        )


@app.command("report")
def report(
    by: str = typer.Option(
        "project", help="project, team, model, gpu, provider, method, outcome or tag:NAME."
    ),
    period: str = typer.Option(
        "this-month",
        help="this-month, last-month, this-week, last-week, 7d, 30d, YYYY-MM, all, FROM..TO.",
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    csv_out: bool = typer.Option(False, "--csv", help="Print the groups as CSV."),
) -> None:
    """Spend by group, with the month-end projection and spend anomalies."""
    from frugal.ledger import report as rep
    from frugal.ledger.store import Ledger

    if json_out and csv_out:
        raise FrugalError("--json and --csv: choose one")
    r = rep.report(Ledger(), by=by, period=period, extras=not csv_out)
    if json_out:
        print_json(r.to_json())
    elif csv_out:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(rep.CSV_COLUMNS)
        w.writerows(rep.csv_row(g) for g in [*r.groups, r.totals])
    else:
        _render(r)


def _render(r: Any) -> None:
    con = console()
    p = r.period
    span = "all time" if p.start is None and p.end is None else f"{_day(p.start)} to {_day(p.end)}"
    t = Table(title=f"spend by {r.by}, {p.name} ({span}; runs by their start)")
    cols = (
        "group",
        "spend",
        "GPU-h",
        "tokens",
        "$/M tok",
        "runs",
        "done",
        "failed",
        "preempted",
        "lost",
        "est. err",
    )
    for c in cols:
        t.add_column(c, justify="left" if c == "group" else "right")
    for i, g in enumerate([*r.groups, r.totals]):
        o = g.outcomes
        err = g.est_error_median_abs_pct
        t.add_row(
            escape(g.name),
            usd(g.spend_usd),
            f"{g.gpu_hours:,.1f}",
            f"{g.tokens:,.0f}",
            "-" if g.usd_per_million_tokens is None else usd(g.usd_per_million_tokens),
            str(g.runs),
            str(o["completed"]),
            str(o["failed"]),
            str(o["preempted"]),
            usd(g.lost_usd),
            "-" if err is None else f"{err:.0f}%",
            end_section=i == len(r.groups) - 1,
        )
    con.print(t)
    con.print("[dim]est. err: median |actual/estimate - 1| of completed runs[/]")
    if r.projection:
        pr = r.projection
        con.print(f"[bold]month end ({pr.month}):[/] {usd(pr.projected_usd)} projected = {pr.how}")
    if r.anomalies:
        con.print("[bold]spend anomalies[/] (days above their trailing 14-day baseline):")
        for a in r.anomalies:
            con.print(
                f"  {a.day}: ${a.spend_usd:,.2f} vs a median of ${a.baseline_usd:,.2f} "
                f"(threshold ${a.threshold_usd:,.2f})"
            )
    else:
        con.print("no spend anomalies in the period")


def _day(t: Any) -> str:
    return "..." if t is None else f"{t:%Y-%m-%d %H:%M}"


@app.command("showback")
def showback(
    week: str = typer.Option("last", help="last, this, an ISO week (2026-W19) or a date in it."),
) -> None:
    """The weekly showback for team leads, in Markdown: spend by team, top runs, failures."""
    from frugal.ledger.showback import showback as make
    from frugal.ledger.store import Ledger

    sys.stdout.write(make(Ledger(), week).to_markdown())


@app.command("export")
def export(
    format_: str = typer.Option(
        "jsonl", "--format", help="jsonl (the whole ledger) or focus (a FOCUS chargeback CSV)."
    ),
    output: str | None = typer.Option(None, help="Write to this file \\[default: stdout]."),
    force: bool = typer.Option(False, "--force", help="Replace the --output file if it exists."),
) -> None:
    """Export the books: jsonl, the backup `frugal costs import` restores losslessly; focus,
    the chargeback in FOCUS 1.2 for FinOps tools (with --output, its FOCUS metadata beside
    it: FILE.focus-metadata.json)."""
    from frugal.ledger.exchange import FORMATS, write_export
    from frugal.ledger.focus import metadata
    from frugal.ledger.store import Ledger, now

    if format_ not in FORMATS:
        raise FrugalError(f"--format {format_!r}: use jsonl (the whole ledger) or focus (CSV)")
    meta = None
    if output is not None:
        check_target(output, "--output", force=force)
        if format_ == "focus":
            meta = Path(output).with_name(Path(output).stem + ".focus-metadata.json")
            check_target(meta, "--output", force=force)
    led = Ledger()
    if output is None:
        write_export(led, format_, sys.stdout)
        return
    with replacing(output) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        n = write_export(led, format_, f)
    if meta is not None:
        version = installed_version(DISTRIBUTION) or "unknown"
        write_text_atomic(meta, json.dumps(metadata(now(), version), indent=1) + "\n")
    also = f"; FOCUS metadata in {meta}" if meta else ""
    console().print(f"wrote {n:,} rows to {output} ({format_}){also}")


@app.command("sync")
def sync(
    dirs: list[str] = typer.Argument(
        ..., help="Run output dirs, or dirs above them, holding ledger-spool.jsonl."
    ),
) -> None:
    """Send the records runs spooled while the ledger was down."""
    from frugal.ledger.spool import sync as send

    results = send([Path(d) for d in dirs])
    if any(r.sent for r in results):
        from frugal.ledger.store import Ledger

        _alerts(Ledger())
    con = console()
    if not results:
        con.print(f"nothing waits in {', '.join(dirs)}")
    for r in results:
        con.print(f"{r.spool}: sent {r.sent} records" + (f", {r.left} wait" if r.left else ""))
    left = [r for r in results if r.left]
    if left:
        raise FrugalError(
            f"the ledger is still down ({left[0].why}): {sum(r.left for r in left)} records "
            "wait; run frugal costs sync again once it is up"
        )


@app.command("advise")
def advise(
    period: str = typer.Option(
        "all", help="all, this-month, last-week, YYYY-MM, 30d, FROM..TO (as costs report)."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """What to change, from the books: each piece of advice with the dollars at stake."""
    from frugal.ledger.advise import advise_ledger
    from frugal.ledger.store import Ledger

    rep = advise_ledger(Ledger(), period)
    if json_out:
        print_json(rep.to_json())
        return
    con = console()
    con.print(f"[bold]{rep.runs} runs[/], ${rep.spend_usd:,.2f} spent · period: {rep.period}")
    if not rep.advice:
        con.print("no advice: nothing on the books to change")
        return
    t = Table(title="advice, largest first")
    for col in ("$ at stake", "rule", "runs", "change", "why"):
        t.add_column(col, justify="right" if col == "$ at stake" else "left")
    for a in rep.advice:
        ids = ", ".join(r[:8] for r in a.runs[:3]) + (" ..." if len(a.runs) > 3 else "")
        if a.plans:
            ids = ", ".join([*(f"plan {p}" for p in a.plans), *([ids] if ids else [])])
        t.add_row(f"${a.usd_at_stake:,.2f}", a.rule, ids, escape(a.change), escape(a.why))
    con.print(t)


@app.command("quality")
def quality_cmd(
    scope: list[str] | None = typer.Option(
        None, help="Runs with this tag key=value (a sweep's, a project's); repeat for more."
    ),
    metric: str = typer.Option(
        "eval_loss", help="What ranks them: eval_loss, or a classifier's accuracy or macro_f1."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Quality beside cost: each run's best eval loss (or a classifier's accuracy or
    macro-F1) against its dollars and hours, the quality-per-dollar frontier, and which
    setting moved it."""
    from frugal.ledger.quality import quality
    from frugal.ledger.store import Ledger

    rep = quality(Ledger(), parse_tags(scope or [], "--scope"), metric.replace("-", "_"))
    if json_out:
        print_json(rep.to_json())
        return
    con = console()
    t = Table(title="runs by quality per dollar (* on the frontier: nothing cheaper did better)")
    best = f"best {rep.label}"
    grouped = len({r.group for r in rep.runs}) > 1  # ranks are each group's own
    cols = ("rank", "run", best, "USD", "hours", "model", "method", "settings")
    for col in (*cols, *(("task on data",) if grouped else ())):
        t.add_column(col, justify="right" if col in ("rank", best, "USD", "hours") else "left")
    for r in rep.runs:
        loss = "-" if r.value is None else f"{r.value:.4f}"
        rank = "-" if r.rank is None else f"{r.rank}{' *' if r.frontier else ''}"
        rest = ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in r.settings.items()
            if k not in ("model", "method") and v is not None
        )
        t.add_row(
            rank,
            r.run_id[:8],
            loss,
            f"${r.cost_usd:,.4f}",
            f"{r.hours:.3f}",
            str(r.settings["model"]),
            str(r.settings["method"]),
            escape(rest),
            *((escape(r.group),) if grouped else ()),
        )
    con.print(t)
    for e in rep.effects:
        values = "; ".join(f"{v} -> {x:.4f} ({n} runs)" for v, x, n in e.best_by_value)
        among = f" ({e.group})" if grouped else ""
        con.print(
            escape(f"{e.setting} moved the best {rep.label} by {e.moved:.4f}{among}: {values}")
        )
    for n in rep.notes:
        con.print(f"[dim]note: {escape(n)}[/]")
