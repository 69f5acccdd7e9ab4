"""Numbers as frugal prints them (`frugal.formats`), and the concepts that have one home:
a second definition of any of them in `src/` is a test failure, not a review comment."""

from __future__ import annotations

import ast
from pathlib import Path

from frugal.counts import parse_count
from frugal.formats import as_count, si, usd, usd_cents

SRC = Path(__file__).resolve().parents[1] / "src" / "frugal"


def test_dollars_show_cents_or_fractions_below_a_dollar() -> None:
    assert [usd(x) for x in (1234.5, 1, 0, 0.0014, -2.5)] == [
        "$1,234.50", "$1.00", "$0.00", "$0.0014", "$-2.50"
    ]  # fmt: skip
    assert [usd_cents(x) for x in (1234.5, 0.0014, -3)] == ["$1,234.50", "$0.00", "-$3.00"]


def test_quantities_read_as_people_write_them() -> None:
    assert [si(x) for x in (3.2e15, 4.56e12, 7e9, 2e6, 512)] == [
        "3.2 P", "4.6 T", "7.0 G", "2.0 M", "512"
    ]  # fmt: skip
    assert [as_count(n) for n in (2e7, 1.5e9, 3e5, 999)] == ["20M", "1.5G", "300k", "999"]
    assert all(parse_count(as_count(n)) == n for n in (2e7, 1.5e9, 3e5, 999))


# each concept's one home: (function or class name, module under src/frugal)
HOMES = {
    "usd": "formats.py",
    "usd_cents": "formats.py",
    "_usd": None,  # never: use formats.usd or formats.usd_cents
    "si": "formats.py",
    "_si": None,
    "as_count": "formats.py",
    "parse_count": "counts.py",
    "parse_time": "times.py",
    "utc": "times.py",
    "node_network": "plan/constraints.py",
    "pareto": "plan/plans.py",
    "give_reasons": "plan/reasons.py",
    "closest_miss": "plan/reasons.py",
    "_price": None,  # three meant three things: Offer.hourly_usd, search._priced, a cell
    "Cells": "csvrows.py",  # a data row's typed cells, each error with file, line, column
    "_Where": None,
    "parse_period": "ledger/periods.py",
    "period_start": "ledger/periods.py",
    "Period": "ledger/periods.py",  # a report's span; a budget's is periods.BudgetPeriod
    "_iso": "ledger/periods.py",
    # names that said nothing of which one they were
    "Run": None,
    "TrainingRun": "run/steps.py",  # everything `frugal train` sets up
    "JobQuote": "plan/jobs.py",  # one job of a --jobs plan, priced on one offer
    "JobOnOffer": "ledger/schema.py",  # the columns a plan and a run share
    "Report": None,
    "SpendReport": "ledger/report.py",
    "AdviceReport": "ledger/advise.py",
    # a second carving: each concept in the module a newcomer looks in
    "Deployment": "serve/deployment.py",  # what `frugal serve` prices
    "Launch": "serve/emit.py",  # what a serving plan hands on to vLLM and SkyPilot
    "parse_skypilot": "hardware/price_files.py",  # a SkyPilot vms.csv read into offers
    "read_price_file": "hardware/price_files.py",
    "RunStart": "ledger/store.py",  # a run's record as the ledger and its spool keep it
    "Driving": "run/training_loop.py",  # how a run is driven: dry run, callback, clock
    "UpdateRule": "step/loop.py",  # how a step's micro-batches become one update
    "takes": "cli/options.py",  # a command's options as a dataclass
}


def test_each_concept_is_defined_in_one_place() -> None:
    found: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module level: methods are their class's
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in HOMES:
                found.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    for name, home in HOMES.items():
        assert found.get(name, []) == ([home] if home else []), (name, found.get(name))
