"""`frugal budget set|list|rm`: money a scope of tags may spend per week, month or in total,
the thresholds that alert, and whether crossing it stops runs (frugal.ledger.budgets)."""

from __future__ import annotations

import typer
from rich.table import Table

from frugal.cli import console, print_json
from frugal.cli.options import JSON_HELP, number
from frugal.ledger.tags import parse_tags

app = typer.Typer(
    help="Budgets by tag scope: alerts at thresholds, and stops.", no_args_is_help=True
)


@app.command("set")
def set_(
    name: str = typer.Argument(..., help="The budget's name, e.g. nlp-monthly."),
    amount: float = number(..., "USD per period.", gt=0),
    period: str = typer.Option("month", help="week, month or total."),
    scope: list[str] | None = typer.Option(
        None, help="Tag key=value the spend must carry; repeat for more [default: all spend]."
    ),
    thresholds: str = typer.Option("50,75,90,100", help="Percents of the amount that alert."),
    action: str = typer.Option(
        "warn", help="warn (alerts only) or stop (runs in scope stop before crossing it)."
    ),
) -> None:
    """Create or change a budget."""
    from frugal.ledger.budgets import parse_thresholds, set_budget, statuses
    from frugal.ledger.store import Ledger

    led = Ledger()
    b = set_budget(
        led,
        name,
        amount,
        period,
        parse_tags(scope or [], "--scope"),
        parse_thresholds(thresholds),
        action,
    )
    st = next(s for s in statuses(led) if s.budget.name == b.name)
    console().print(
        f"budget {b.name}: ${b.amount_usd:,.2f} per {b.period} · {_scope(b.scope)} · "
        f"{b.action} · ${st.spent_usd:,.2f} spent so far ({st.used_pct:.0f}%)"
    )


@app.command("list")
def list_(json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Each budget with its spend this period."""
    from frugal.ledger.budgets import statuses
    from frugal.ledger.store import Ledger

    rows = statuses(Ledger())
    if json_out:
        print_json({"budgets": [s.to_json() for s in rows]})
        return
    if not rows:
        console().print("no budgets: add one with frugal budget set NAME --amount USD")
        return
    t = Table(title="budgets")
    for col in ("name", "scope", "period", "action", "amount", "spent", "left", "used"):
        t.add_column(col, justify="right" if col in ("amount", "spent", "left", "used") else "left")
    for s in rows:
        b = s.budget
        t.add_row(
            b.name,
            _scope(b.scope),
            b.period,
            b.action,
            f"${b.amount_usd:,.2f}",
            f"${s.spent_usd:,.2f}",
            f"${s.left_usd:,.2f}",
            f"{s.used_pct:.0f}%",
        )
    console().print(t)


@app.command("rm")
def rm(name: str = typer.Argument(..., help="The budget's name.")) -> None:
    """Remove a budget (and its alert history)."""
    from frugal.ledger.budgets import remove_budget
    from frugal.ledger.store import Ledger

    remove_budget(Ledger(), name)
    console().print(f"removed budget {name}")


def _scope(scope: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in scope.items()) or "all spend"
