"""Every number a user gives frugal goes through one mechanism (frugal.validation.Number):
every numeric option of every command, walked here, refuses NaN, infinities, values below
its range and fractions of a whole quantity with one line naming the option; `--json`
never prints NaN or Infinity."""

from __future__ import annotations

import inspect
import json
import math
import typing
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from conftest import run_error

from frugal.cli import print_json
from frugal.cli.main import app, main
from frugal.config import validate_run_config
from frugal.counts import parse_count
from frugal.errors import FrugalError
from frugal.validation import Number


def _numeric_options() -> Iterator[tuple[list[str], str, str, Any]]:
    """(command path, parameter, its flag, its typer info) for every int or float
    parameter of every command."""

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], str, str, Any]]:
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, [*path, name])
        if getattr(cmd, "commands", None):
            return
        hints = typing.get_type_hints(cmd.callback)
        params = {p.name: p for p in cmd.params}
        for name, p in inspect.signature(cmd.callback).parameters.items():
            types = typing.get_args(hints[name]) or (hints[name],)
            if (int in types or float in types) and bool not in types:
                opts = getattr(params[name], "opts", None) or [name]
                flag = next((o for o in opts if o.startswith("--")), opts[0])
                yield path, name, flag, p.default

    yield from walk(typer.main.get_command(app), [])


OPTIONS = list(_numeric_options())


def test_the_walk_finds_the_numeric_options() -> None:
    found = {(" ".join(path), flag) for path, _, flag, _ in OPTIONS}
    assert ("plan", "--epochs") in found and ("costs add", "amount") in found
    assert ("serve estimate", "--requests") in found and ("tco", "--own-years") in found
    assert len(OPTIONS) > 60


@pytest.mark.parametrize(
    ("path", "flag", "info"),
    [(p, f, i) for p, _, f, i in OPTIONS],
    ids=[f"{' '.join(p)} {f}" for p, _, f, _ in OPTIONS],
)
def test_every_numeric_option_has_a_range(path: list[str], flag: str, info: Any) -> None:
    number = info.parser
    if number is parse_count:  # a token count: 20M, 1.5B (frugal.counts), whole, 1 to 1e15
        for bad in ("nan", "inf", "-inf", "0", "0.5", "1.5", "1e16", "-5M", "12abc", ""):
            with pytest.raises(ValueError, match="give a whole count from 1 to 1e15"):
                parse_count(bad)
        assert (parse_count("20M"), parse_count("1.33M"), parse_count("2e7")) == (
            2e7, 1_330_000.0, 2e7)  # fmt: skip
        return
    assert isinstance(number, Number), f"frugal {' '.join(path)} {flag} is not a Number"
    # no quantity frugal asks for means anything below zero: each option says its floor
    assert number.ge is not None or number.gt is not None, f"{flag} has no lower bound"
    low = number.ge if number.ge is not None else number.gt
    assert low is not None
    for bad in ("nan", "inf", "-inf", "NaN", str(low - 1), "12abc", ""):
        with pytest.raises(ValueError, match=r"give a (whole )?number"):
            number(bad)
    if number.gt is not None:
        with pytest.raises(ValueError):
            number(str(number.gt))
    if number.whole:
        with pytest.raises(ValueError, match="whole number"):
            number(str(low + 0.5))
    top = number.le if number.le is not None else number.lt
    if top is not None:
        with pytest.raises(ValueError):
            number(str(top * 2 + 1))


@pytest.mark.parametrize(
    ("path", "flag"),
    [(p, f) for p, _, f, _ in OPTIONS],
    ids=[f"{' '.join(p)} {f}" for p, _, f, _ in OPTIONS],
)
def test_a_nan_is_one_line_naming_the_option(
    capsys: pytest.CaptureFixture[str], path: list[str], flag: str
) -> None:
    # click takes the options in the order given: the bad one is read before anything
    # else, so no model, ledger or file is needed to be refused
    argv = [*path, "--", "nan"] if not flag.startswith("--") else [*path, flag, "nan"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"'{flag}': " in err and "nan" in err and "give a" in err, err
    assert f"(see: frugal {' '.join(path)} --help)" in err  # the command's own help


def test_numbers_in_words() -> None:
    assert Number(ge=1, le=4096, whole=True).accepts() == "a whole number from 1 to 4,096"
    assert Number(gt=0, le=1).accepts() == "a number above 0, up to 1"
    assert Number(ge=0, lt=1).accepts() == "a number from 0, below 1"
    assert Number(ge=0).accepts() == "a number of 0 or more"
    assert Number(gt=0).accepts() == "a number above 0"
    assert Number(ge=1, whole=True)("1e3") == 1000
    assert Number(ge=1, whole=True)("20_000") == 20000
    assert Number(gt=0)("2.5") == 2.5


def test_token_counts_are_whole_and_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0.5", "1.5", "0", "nan", "inf", "1e16", "-5M"):
        assert main(["plan", "x", "--tokens", bad]) == 2
        err = capsys.readouterr().err
        assert "--tokens" in err and "whole count from 1 to 1e15" in err, err


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"training": {"seed": -1}}, "training.seed: -1: give a whole number from 0"),
        ({"training": {"learning_rate": math.nan}}, "training.learning_rate: nan: give"),
        ({"data": {"epochs": math.inf}}, "data.epochs: inf: give a number above 0"),
        ({"price_per_hour_usd": math.inf}, "price_per_hour_usd: inf: give a number of 0"),
        ({"job": {"batch": 2.5}}, "job.batch: 2.5: give a whole number from 1"),
        ({"budget_usd": -3}, "budget_usd: -3: give a number above 0"),
    ],
)
def test_run_config_numbers_are_checked_by_the_same_ranges(
    config: dict[str, Any], says: str
) -> None:
    with pytest.raises(FrugalError, match=r"^cfg\.yaml: ") as e:
        validate_run_config({"model": "m", **config}, "cfg.yaml")
    assert says in str(e.value)


def test_json_never_prints_nan_or_infinity(capsys: pytest.CaptureFixture[str]) -> None:
    print_json({"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": (2, math.nan)}})
    out = capsys.readouterr().out
    assert json.loads(out) == {"a": None, "b": [None, None, 1.5], "c": {"d": [2, None]}}
    assert "NaN" not in out and "Infinity" not in out


# -- dates: the books hold 2000 to 2199 (frugal.times) ----------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["costs", "add", "5", "--at", "0001-01-01"],
        ["costs", "add", "5", "--at", "9999-12-31T23:00:00Z"],
        ["costs", "report", "--period", "9999-12"],
        ["costs", "report", "--period", "0001-01-01..2026-01-01"],
        ["costs", "showback", "--week", "9999-W01"],
    ],
)
def test_a_date_outside_the_books_years_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("FRUGAL_DB_URL", f"sqlite:///{tmp_path / 'l.sqlite'}")
    assert "outside the years 2000 to 2199" in run_error(capsys, *argv)
    assert main(["costs", "report", "--period", "all", "--json"]) == 0  # the books still work
    assert json.loads(capsys.readouterr().out)["totals"]["spend_usd"] == 0


def test_a_span_back_past_2000_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "reaches back before 2000" in run_error(
        capsys, "costs", "report", "--period", "99999999d"
    )


def test_a_billing_row_in_year_one_names_its_line(tmp_path: Any) -> None:
    from frugal.ledger.exchange import import_file
    from frugal.ledger.report import report
    from frugal.ledger.store import Ledger

    bill = tmp_path / "bill.csv"
    bill.write_text(
        "BilledCost,BillingCurrency,ChargePeriodStart,ProviderName\n"
        "1.0,USD,2026-01-01T00:00:00Z,AWS\n2.0,USD,0001-01-01T00:00:00Z,AWS\n"
    )
    led = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    with pytest.raises(
        FrugalError, match="line 3: ChargePeriodStart '0001-01-01T00:00:00Z' is out"
    ):
        import_file(led, str(bill))
    assert report(led, period="all").totals.spend_usd == 0  # nothing of the file went in


# -- spot: interrupted faster than it restarts ---------------------------------------------------


def test_spot_that_never_finishes_is_not_planned() -> None:
    from frugal.plan import spot

    assert spot.expected_wall(10.0, 1.0, 0.1, 0.2, 1 / 3600) == math.inf
    assert math.isfinite(spot.expected_wall(10.0, 1.0, 0.1, 0.2, 5.0))


def test_a_spot_only_plan_that_never_finishes_says_so(tiny_llama: Any) -> None:
    from frugal.hardware.catalog import select_offers
    from frugal.plan.constraints import Constraints
    from frugal.plan.plans import Infeasible
    from frugal.plan.search import search
    from frugal.step.job import make_job

    offers = [o for o in select_offers(providers_csv="aws") if o.spot_usd_h and o.gpus == 1]
    k = Constraints.build(tokens=1e8, spot="only", mtbi_h="1s", auto_loss_chunks=False,
                          auto_offload=False, auto_in_backward=False)  # fmt: skip
    with pytest.raises(Infeasible, match=r"nothing finishes: .*raise --spot-mtbi-hours, or drop"):
        search(tiny_llama, make_job(seq=256), offers[:1], k)


def test_a_plans_hours_read_as_minutes_under_a_tenth_of_an_hour() -> None:
    from frugal.formats import duration_h

    assert [duration_h(h) for h in (0.001, 0.04, 0.0999, 0.1, 2.345)] == [
        "1 min",
        "2 min",
        "6 min",
        "0.1 h",
        "2.3 h",
    ]  # the frontier's fastest plan read "0.0 h"
