"""`frugal calibrate`: the estimator's constants fitted to the runs on the books
(frugal.ledger.calibrate)."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from frugal.calibration import MAX_HOLDOUT
from frugal.cli import console, print_json
from frugal.cli.options import JSON_HELP, number

NAMES = {"tokens_per_s": "tokens/s", "peak_reserved_gib": "peak reserved"}


def calibrate(
    holdout: float = number(
        0.25,
        "Share of runs held back to check the fit (0 to 0.5; 0: no check).",
        ge=0,
        le=MAX_HOLDOUT,
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Show the fitted constants; do not write the file."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Fit the estimator's speed and memory constants to the runs on the books and write
    them to the calibration file that estimate, plan and train read."""
    from frugal.ledger.calibrate import calibrate_ledger
    from frugal.ledger.store import Ledger

    cal = calibrate_ledger(Ledger(), holdout, write=not dry_run)
    if json_out:
        print_json(cal.to_json())
        return
    con = console()
    con.print(
        f"[bold]calibrated on {cal.fit_runs} runs[/], {cal.held_back_runs} held back "
        f"(of {cal.runs} with measured figures)"
    )
    for name, e in cal.held_back.items():
        if e.before_pct is not None and e.after_pct is not None:
            con.print(
                f"  held-back {NAMES[name]} error (median abs): {e.before_pct:.1f}% -> "
                f"[bold]{e.after_pct:.1f}%[/] on {e.runs} runs"
            )
    if cal.changes:
        t = Table(title="constants")
        for col in ("where", "constant", "old", "new", "runs"):
            t.add_column(col, justify="right" if col in ("old", "new", "runs") else "left")
        for c in cal.changes:
            t.add_row(escape(c.where), c.key, f"{c.old:g}", f"{c.new:g}", str(c.runs))
        con.print(t)
    for what, n in cal.skipped.items():
        con.print(f"[dim]skipped {n} runs: {escape(what)}[/]")
    for note in cal.notes:
        con.print(f"[dim]note: {escape(note)}[/]")
    if cal.wrote:
        con.print(f"wrote {escape(cal.path)} (estimate, plan and train read it)")
    elif dry_run and cal.changes:
        con.print(f"--dry-run: {escape(cal.path)} not written")
