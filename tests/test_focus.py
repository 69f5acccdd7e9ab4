"""FOCUS billing imports, the FOCUS 1.2 chargeback, and the lossless export and import of
the ledger (frugal.ledger.billing, .focus, .backup, .exchange: `frugal costs
import|export`), on SQLite and PostgreSQL. The chargeback is checked against the columns and
rules of the FOCUS 1.2 specification (tests/data/focus/spec-1.2, from its column files)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import run_error, run_json
from sqlalchemy import func, select

from frugal.cli.main import main
from frugal.errors import FrugalError
from frugal.ledger import exchange, focus
from frugal.ledger.budgets import set_budget
from frugal.ledger.report import report
from frugal.ledger.schema import Alert, CostEntry, Heartbeat, PlanRecord, RunRecord, Tag
from frugal.ledger.store import Ledger, aware

FOCUS_DATA = Path(__file__).parent / "data" / "focus"
PLAN = {"method": "qlora", "provider": "runpod", "instance": "1x RTX 4090", "region": "",
        "gpu": "RTX 4090", "gpus": 1, "spot": True, "price_per_hour_usd": 0.34,
        "est_hours": 2.5, "est_cost_usd": 0.85}  # fmt: skip
BILL_COLUMNS = ["BilledCost", "EffectiveCost", "BillingCurrency", "ChargePeriodStart",
                "ChargePeriodEnd", "ProviderName", "ResourceId", "ServiceName",
                "ServiceCategory", "ChargeCategory", "ChargeDescription", "ConsumedQuantity",
                "ConsumedUnit", "Tags"]  # fmt: skip


def T(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def add_run(led: Ledger, start: datetime, hours: float, tags: dict[str, str], cost: float,
            gpus: int = 1, resource_id: str = "") -> str:  # fmt: skip
    rid = led.start_run(model="llama-8b", method="lora", config={}, price_per_hour_usd=1.0,
                        gpu="H100", gpus=gpus, tags=tags, at=start,
                        resource_id=resource_id)  # fmt: skip
    led.end_run(rid, "completed", {}, step=10, tokens=1e6, cost_usd=cost, hours=hours,
                at=start + timedelta(hours=hours))  # fmt: skip
    return rid


def bill_row(cost: float, start: str, end: str = "", resource: str = "",
             tags: dict[str, Any] | None = None, **cols: str) -> dict[str, str]:  # fmt: skip
    return {"BilledCost": str(cost), "EffectiveCost": str(cost), "BillingCurrency": "USD",
            "ChargePeriodStart": start, "ChargePeriodEnd": end, "ProviderName": "AWS",
            "ResourceId": resource, "ServiceName": "Amazon EC2", "ServiceCategory": "Compute",
            "ChargeCategory": "Usage", "Tags": json.dumps(tags) if tags else ""} | cols  # fmt: skip


def write_bill(path: Path, rows: list[dict[str, str]], columns: list[str] = BILL_COLUMNS) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture
def runs(ledger_url: str) -> tuple[Ledger, dict[str, str]]:
    """A machine used by two runs in turn, and two overlapping runs known by their tags."""
    led = Ledger(ledger_url)
    ids = {
        "a": add_run(led, T("2026-05-03T10:00"), 4, {"team": "nlp", "project": "chat"}, 40,
                     gpus=2, resource_id="i-0abc"),
        "b": add_run(led, T("2026-05-05T10:00"), 2, {"team": "nlp"}, 10, resource_id="i-0abc"),
        "c": add_run(led, T("2026-05-04T08:00"), 2,
                     {"team": "cv", "project": "vision", "env": "prod"}, 20, gpus=4),
        "d": add_run(led, T("2026-05-04T09:00"), 2, {"team": "cv", "project": "vision"}, 5),
    }  # fmt: skip
    return led, ids


def bill(ids: dict[str, str]) -> list[dict[str, str]]:
    return [
        bill_row(45.5, "2026-05-03T00:00:00Z", "2026-05-04T00:00:00Z", "i-0abc",
                 ConsumedQuantity="4", ConsumedUnit="Hours"),  # a: 4 machine-hours x 2 GPUs
        bill_row(11, "2026-05-05T00:00:00Z", "2026-05-06T00:00:00Z", "i-0abc",
                 ConsumedQuantity="2", ConsumedUnit="GPU-Hours"),  # b, not a (same machine)
        bill_row(1, "2026-05-10T00:00:00Z", "2026-05-11T00:00:00Z",
                 tags={"frugal_run_id": ids["d"]}),  # named, though not overlapping
        bill_row(3, "2026-05-04T00:00:00Z", "2026-05-05T00:00:00Z", "vol-1",
                 tags={"team": "cv", "project": "vision", "env": "prod", "billing/on": True},
                 ServiceCategory="Storage", ConsumedQuantity="100", ConsumedUnit="GB-Hours"),
        bill_row(2, "2026-05-04T00:00:00Z", "2026-05-05T00:00:00Z",
                 tags={"team": "cv"}),  # c and d share one tag each: a tie
        bill_row(4, "2026-06-01T00:00:00Z", "2026-06-02T00:00:00Z",
                 tags={"team": "nlp"}),  # no run then
        bill_row(0.5, "2026-05-31T00:00:00Z", "2026-06-01T00:00:00Z", ServiceCategory="",
                 ChargeCategory="Tax", ServiceName="Tax"),
    ]  # fmt: skip


def costs(led: Ledger) -> list[CostEntry]:
    with led.session() as s:
        return list(s.scalars(select(CostEntry).order_by(CostEntry.id)))


def test_billing_rows_match_runs_by_resource_id_and_by_tags(
    runs: tuple[Ledger, dict[str, str]], tmp_path: Path
) -> None:
    led, ids = runs
    path = write_bill(tmp_path / "aws-2026-05.csv", bill(ids))
    r = exchange.import_file(led, path)
    assert (r.format, r.rows, r.added, r.skipped) == ("billing", 7, {"costs": 7}, {"costs": 0})
    assert r.matched == {"resource_id": 2, "run_id_tag": 1, "tags": 1} and r.unmatched == 3
    assert r.added_usd == pytest.approx(67)
    assert (r.matched_billed_usd, r.matched_runs_usd) == pytest.approx((57.5, 40 + 10 + 5))
    got = costs(led)
    # the volume tagged like run c is attributed to it, and stays a cost of its own
    assert [c.run_id for c in got] == [ids["a"], ids["b"], ids["d"], None, None, None, None]
    assert [c.gpu_hours for c in got] == [8, 2, 0, 0, 0, 0, 0]
    assert [c.kind for c in got] == ["compute"] * 3 + ["storage"] + ["compute"] * 2 + ["tax"]
    assert {c.source for c in got} == {"aws-2026-05.csv"}
    first = (got[0].resource_id, got[0].provider, got[0].description)
    assert first == ("i-0abc", "AWS", "Amazon EC2")
    assert aware(got[0].at) == T("2026-05-03") and aware(got[0].period_end) == T("2026-05-04")
    assert led.tags("cost", str(got[3].id)) == {"team": "cv", "project": "vision",
                                                 "env": "prod", "billing/on": "true"}  # fmt: skip
    # rows of a run's own machine are in its dollars; the others add to the spend
    total = report(led, "team", "all", extras=False).totals
    assert total.spend_usd == pytest.approx(75 + 3 + 2 + 4 + 0.5)


def test_importing_twice_counts_once(runs: tuple[Ledger, dict[str, str]], tmp_path: Path) -> None:
    led, ids = runs
    rows = bill(ids)
    path = write_bill(tmp_path / "bill.csv", rows)
    exchange.import_file(led, path)
    before = report(led, "team", "all", extras=False).totals.spend_usd
    again = exchange.import_file(led, path)
    assert (again.added, again.skipped) == ({"costs": 0}, {"costs": 7})
    assert len(costs(led)) == 7
    assert report(led, "team", "all", extras=False).totals.spend_usd == pytest.approx(before)
    write_bill(path, [*rows, rows[-1], bill_row(9, "2026-05-20T00:00:00Z")])  # the bill grew
    grown = exchange.import_file(led, path)
    assert (grown.added, grown.skipped) == ({"costs": 2}, {"costs": 7})  # a repeated row counts
    assert len(costs(led)) == 9
    other = exchange.import_file(led, write_bill(tmp_path / "other.csv", rows[:1]))
    assert other.added == {"costs": 1}  # another file's rows are its own


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # a quote never closed would run the next rows into one cell: $1 read for $6
        ('BilledCost,BillingCurrency,ChargePeriodStart,ChargeDescription\n'
         '1,USD,2026-05-01T00:00:00Z,"oops\n2,USD,2026-05-02T00:00:00Z,b\n'
         '3,USD,2026-05-03T00:00:00Z,c\n', "line 2: not CSV (a quoted cell is never closed)"),
        # a short row would import with its missing cells empty
        ("BilledCost,BillingCurrency,ChargePeriodStart,ProviderName\n"
         "1,USD,2026-05-01T00:00:00Z,AWS\n2,USD\n", "line 3: not CSV (2 cells where the header"),
    ],
)  # fmt: skip
def test_a_bill_that_would_be_misread_is_refused_whole(
    ledger_url: str, tmp_path: Path, text: str, says: str
) -> None:
    bill = tmp_path / "bill.csv"
    bill.write_text(text)
    led = Ledger(ledger_url)
    with pytest.raises(FrugalError, match=re.escape(says)):
        exchange.import_file(led, bill)
    assert costs(led) == []


def test_a_bill_not_in_usd_is_refused_whole(ledger_url: str, tmp_path: Path) -> None:
    led = Ledger(ledger_url)
    rows = [bill_row(5, "2026-05-01T00:00:00Z"), bill_row(6, "2026-05-01T00:00:00Z")]
    rows[1]["BillingCurrency"] = "EUR"
    path = write_bill(tmp_path / "eur.csv", rows)
    with pytest.raises(FrugalError, match=r"eur\.csv line 3: BillingCurrency is EUR.*in USD"):
        exchange.import_file(led, path)
    assert costs(led) == []


def test_bad_files_are_one_line_naming_the_line_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FRUGAL_DB_URL", f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ok = bill_row(5, "2026-05-01T00:00:00Z")
    cases = {
        "line 1: no BilledCost column": ([ok], [c for c in BILL_COLUMNS if "Cost" not in c]),
        "line 3: BilledCost 'abc' is not a number": ([ok, ok | {"BilledCost": "abc"}], None),
        "line 2: ChargePeriodStart 'May 1st' is not a date or time": (
            [ok | {"ChargePeriodStart": "May 1st"}], None),
        "line 2: Tags is not a JSON object": ([ok | {"Tags": "team=nlp"}], None),
    }  # fmt: skip
    for i, (want, (rows, columns)) in enumerate(cases.items()):
        path = write_bill(tmp_path / f"bad{i}.csv", rows, columns or BILL_COLUMNS)
        assert f"bad{i}.csv {want}" in run_error(capsys, "costs", "import", str(path))
    (tmp_path / "empty.csv").write_text("")
    assert "empty" in run_error(capsys, "costs", "import", str(tmp_path / "empty.csv"))
    assert "no such file" in run_error(capsys, "costs", "import", str(tmp_path / "nope.csv"))
    (tmp_path / "x.jsonl").write_text('{"format":"frugal-ledger","version":1}\nnot json\n')
    assert "x.jsonl line 2: not a JSON object" in run_error(
        capsys, "costs", "import", str(tmp_path / "x.jsonl")
    )
    (tmp_path / "y.jsonl").write_text('{"table":"invoices","row":{}}\n')
    assert "y.jsonl line 1: no table 'invoices'" in run_error(
        capsys, "costs", "import", str(tmp_path / "y.jsonl")
    )
    assert costs(Ledger()) == []


# -- the lossless export and import -------------------------------------------------------


def full_books(led: Ledger) -> None:
    """Plans (one never run), runs with heartbeats and tags (one running), costs (one
    matched), a budget and an alert: every table."""
    pid = led.record_plan(PLAN, "llama-8b", 2e7, {"project": "demo"})
    led.record_plan(PLAN | {"est_cost_usd": 1.5}, "qwen-7b", 1e7, {"project": "later"})
    t0 = datetime(2026, 5, 4, 10, 0, 0, 123456, tzinfo=UTC)
    rid = led.start_run(model="llama-8b", method="qlora", config={"job": {"seq": 2048}, "x": 0.1},
                        price_per_hour_usd=0.34, gpu="RTX 4090", spot=True, plan_id=pid,
                        predicted={"hours": 2.5, "cost_usd": 0.85}, resource_id="host-1",
                        tags={"team": "nlp", "note": "a, \"quoted\"\nvalue"}, at=t0)  # fmt: skip
    for i in range(1, 4):
        led.heartbeat(rid, step=i, tokens=i * 1e4, cost_usd=i / 30, at=t0 + timedelta(minutes=i))
    led.end_run(rid, "completed", {"hours": 2.4, "tokens_per_s": 1234.5}, step=20, tokens=2e5,
                cost_usd=0.82, hours=2.4, at=t0 + timedelta(hours=2.4))  # fmt: skip
    running = led.start_run(model="qwen-7b", method="lora", config={}, price_per_hour_usd=None,
                            dry_run=True, at=t0 + timedelta(days=1))  # fmt: skip
    led.heartbeat(running, step=1, tokens=10.0, cost_usd=0.01, at=t0 + timedelta(days=1, seconds=9))
    led.add_cost(3.5, "storage", "bucket", tags={"project": "demo"}, at=t0)
    led.add_cost(1.25, "compute", "the bill", "host-1", "bill.csv", at=t0, run_id=rid,
                 provider="aws", gpu_hours=2.0, period_end=t0 + timedelta(hours=3))  # fmt: skip
    budget = set_budget(led, "nlp-monthly", 100, "month", {"team": "nlp"}, (50, 100), "stop")
    with led.session() as s:
        s.add(Alert(budget_id=budget.id, period_start=T("2026-05-01"), threshold=50.0,
                    fired_at=t0, spend_usd=51.0))  # fmt: skip


def export(led: Ledger, fmt: str) -> str:
    out = io.StringIO()
    exchange.write_export(led, fmt, out)
    return out.getvalue()


def spend_rows(text: str) -> list[dict[str, str]]:
    """A FOCUS export's rows with frugal's run ids written as RUN (a run's id is random: two
    ledgers made alike differ there, and nowhere else)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    ids = {r["x_RunId"] for r in rows if r["x_RunId"]}
    out = []
    for r in rows:
        for k, v in r.items():
            for i in ids:
                v = v.replace(i, "RUN")
            r[k] = v
        out.append(r)
    return out


def counts(led: Ledger) -> dict[str, int]:
    with led.session() as s:
        return {t.__tablename__: s.scalar(select(func.count()).select_from(t)) or 0
                for t in (PlanRecord, RunRecord, Heartbeat, CostEntry, Tag, Alert)}  # fmt: skip


def test_export_import_export_is_byte_identical(ledger_url: str, tmp_path: Path) -> None:
    source = Ledger(f"sqlite:///{tmp_path / 'source.sqlite'}")
    full_books(source)
    first = export(source, "jsonl")
    path = tmp_path / "books.jsonl"
    path.write_text(first, encoding="utf-8")
    target = Ledger(ledger_url)  # empty, on either backend
    r = exchange.import_file(target, path)
    assert r.format == "jsonl" and sum(r.skipped.values()) == 0
    assert export(target, "jsonl") == first
    assert counts(target) == counts(source)  # the whole ledger, budgets and alerts too
    assert export(target, "focus") == export(source, "focus")
    again = exchange.import_file(target, path)
    assert sum(again.added.values()) == 0 and export(target, "jsonl") == first
    new = target.add_cost(1.0, "other")  # ids carry on after the restored ones
    assert new > max(c.id for c in costs(source))


def test_an_earlier_frugals_chargeback_with_its_records_still_restores(
    ledger_url: str, tmp_path: Path
) -> None:
    """frugal 0.1 exported its records inside the FOCUS file (x_FrugalRecords): such a file,
    written by that version from `full_books`, still restores the spend it carried."""
    source = Ledger(f"sqlite:///{tmp_path / 'source.sqlite'}")
    full_books(source)
    target = Ledger(ledger_url)
    r = exchange.import_file(target, FOCUS_DATA / "frugal-0.1-chargeback.csv")
    assert r.format == "focus" and r.added["runs"] == 2
    # the spend: runs with their plans and heartbeats, costs, their tags
    assert counts(target) == counts(source) | {"plans": 1, "alerts": 0, "tags": 4}
    assert spend_rows(export(target, "focus")) == spend_rows(export(source, "focus"))


def test_import_into_books_that_use_the_same_ids(ledger_url: str, tmp_path: Path) -> None:
    source = Ledger(f"sqlite:///{tmp_path / 'source.sqlite'}")
    full_books(source)
    path = tmp_path / "books.jsonl"
    path.write_text(export(source, "jsonl"))
    target = Ledger(ledger_url)
    other_plan = target.record_plan(PLAN | {"est_cost_usd": 9.0}, "other", 1.0)
    other_cost = target.add_cost(99.0, "other", tags={"team": "theirs"})
    assert (other_plan, other_cost) == (1, 1)  # the ids the source uses too
    exchange.import_file(target, path)
    with target.session() as s:
        run = s.scalar(select(RunRecord).where(RunRecord.model == "llama-8b"))
        assert run is not None and run.plan_id is not None and run.plan_id != other_plan
        plan = s.get(PlanRecord, run.plan_id)
        assert plan is not None and plan.est_cost_usd == 0.85
        storage = s.scalar(select(CostEntry).where(CostEntry.kind == "storage"))
        assert storage is not None and storage.id != other_cost
    assert target.tags("cost", str(storage.id)) == {"project": "demo"}
    assert target.tags("cost", str(other_cost)) == {"team": "theirs"}
    assert target.tags("plan", str(run.plan_id)) == {"project": "demo"}
    assert sum(exchange.import_file(target, path).added.values()) == 0


# -- the FOCUS 1.2 chargeback, checked against the specification ------------------------------

SPEC = FOCUS_DATA / "spec-1.2"
DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")  # datetime_format.md
# numeric_format.md: a sign only when negative, one point, no thousands separator; E notation
# with a sign only on a negative exponent. frugal writes a point and no exponent (the
# FinOps Foundation's validator reads a number without a point as an integer, not a Decimal)
DECIMAL = re.compile(r"^-?\d+\.\d+$")
UNIT = re.compile(
    r"^[A-Z][A-Za-z]*(-[A-Z][a-z]+s|/[A-Z][a-z]+)?$"
)  # unit_format.md, the forms used


def spec_columns() -> dict[str, dict[str, str]]:
    lines = [ln for ln in (SPEC / "columns.csv").read_text().splitlines() if ln[:1] != "#"]
    return {r["column"]: r for r in csv.DictReader(lines)}


def spec_subcategories() -> dict[str, str]:
    lines = [ln for ln in (SPEC / "subcategories.csv").read_text().splitlines() if ln[:1] != "#"]
    return {r["subcategory"]: r["category"] for r in csv.DictReader(lines)}


def _row_problems(
    row: dict[str, str], header: list[str], spec: dict[str, dict[str, str]],
    subcategories: dict[str, str],
) -> Iterator[str]:  # fmt: skip
    """What one row breaks; empty cells are nulls."""

    def null(c: str) -> bool:
        return row.get(c, "") == ""

    for c in (c for c in header if c in spec):
        col, v = spec[c], row[c]
        if v == "":
            if col["allows_nulls"] == "False":
                yield f"{c} is null"
            continue
        if col["data_type"] == "Decimal" and not DECIMAL.match(v):
            yield f"{c} {v!r} is not a decimal in FOCUS's numeric format"
        if col["data_type"] == "Date/Time" and not DATETIME.match(v):
            yield f"{c} {v!r} is not YYYY-MM-DDTHH:mm:ssZ"
        if col["data_type"] == "JSON":
            obj = json.loads(v)
            if not isinstance(obj, dict) or any(isinstance(x, dict | list) for x in obj.values()):
                yield f"{c} is not a JSON object of plain values"
        if col["allowed_values"] and v not in col["allowed_values"].split("|"):
            yield f"{c} {v!r} is not an allowed value"
        if v != v.strip():
            yield f"{c} {v!r} has spaces around it"
    if row["BillingCurrency"] != "USD":  # ISO 4217 national currency; the books are in USD
        yield "BillingCurrency is not USD"
    usage = row["ChargeCategory"] in ("Usage", "Purchase") and null("ChargeClass")
    for c in ("ListUnitPrice", "ContractedUnitPrice", "PricingCategory", "PricingQuantity",
              "SkuId", "SkuPriceId", "ConsumedQuantity"):  # fmt: skip
        if c in header and usage and null(c):
            yield f"{c} is null on a Usage row"
    for a, b in (("PricingQuantity", "PricingUnit"), ("ConsumedQuantity", "ConsumedUnit"),
                 ("RegionId", "RegionName"), ("ResourceId", "ResourceType"),
                 ("SubAccountId", "SubAccountName"), ("SkuId", "SkuMeter")):  # fmt: skip
        if a in header and b in header and null(a) != null(b):
            yield f"{b} is {'null' if null(b) else 'not null'} where {a} is not"
    if not null("ResourceName") and null("ResourceId"):
        yield "ResourceName without a ResourceId"
    if not null("SkuPriceDetails") and null("SkuPriceId"):
        yield "SkuPriceDetails without a SkuPriceId"
    for unit in ("PricingUnit", "ConsumedUnit"):
        if not null(unit) and not UNIT.match(row[unit]):
            yield f"{unit} {row[unit]!r} is not in FOCUS's unit format"
    for price, cost in (("ListUnitPrice", "ListCost"), ("ContractedUnitPrice", "ContractedCost")):
        if null(price) or null("PricingQuantity"):
            continue
        product = float(row[price]) * float(row["PricingQuantity"])
        if abs(product - float(row[cost])) > 1e-6 * max(1.0, abs(float(row[cost]))):
            yield f"{price} x PricingQuantity is {product}, {cost} {row[cost]}"
        if float(row[price]) < 0:
            yield f"{price} is negative"
    sub = row.get("ServiceSubcategory", "")
    if "ServiceSubcategory" in header and subcategories.get(sub) != row["ServiceCategory"]:
        yield f"ServiceSubcategory {sub!r} is not one of {row['ServiceCategory']!r}'s"
    for start, end in (("BillingPeriodStart", "BillingPeriodEnd"),
                       ("ChargePeriodStart", "ChargePeriodEnd")):  # fmt: skip
        if row[end] < row[start]:
            yield f"{end} before {start}"
    if row["ChargeFrequency"] == "Usage-Based" and row["ChargeCategory"] == "Purchase":
        yield "a Purchase is not Usage-Based"


def conformance_problems(text: str) -> list[str]:
    """Every way `text` (a FOCUS CSV) breaks the FOCUS 1.2 rules that apply to what frugal
    writes: the columns' presence, order and names, data types and formats, nulls, allowed
    values, and the rules that tie columns together."""
    spec, subcategories = spec_columns(), spec_subcategories()
    header = next(csv.reader(io.StringIO(text)))
    bad: list[str] = []
    focus_cols = [c for c in header if not c.startswith("x_")]
    bad += [f"{c}: not a FOCUS 1.2 column (custom ones start x_)" for c in focus_cols
            if c not in spec]  # fmt: skip
    bad += [f"{c}: Mandatory, missing" for c, r in spec.items()
            if r["level"] == "Mandatory" and c not in header]  # fmt: skip
    if header[: len(focus_cols)] != focus_cols:
        bad.append("custom x_ columns come before FOCUS columns")
    bad += [f"{c}: not PascalCase" for c in header
            if not re.fullmatch(r"(x_)?[A-Z][A-Za-z0-9]*", c)]  # fmt: skip
    for n, row in enumerate(csv.DictReader(io.StringIO(text)), 2):
        bad += [f"line {n}: {w}" for w in _row_problems(row, header, spec, subcategories)]
    return bad


def test_the_rules_catch_what_they_say() -> None:
    """The checker itself: each kind of break in a good row is found."""
    led = Ledger("sqlite://")
    led.add_cost(3.5, "storage", "bucket", tags={"project": "demo"}, at=T("2026-05-04"))
    good = export(led, "focus")
    assert conformance_problems(good) == []
    head, row = good.splitlines()
    cells = dict(zip(next(csv.reader([head])), next(csv.reader([row])), strict=True))

    def broken(**change: str) -> list[str]:
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=list(cells), lineterminator="\n")
        w.writeheader()
        w.writerow(cells | change)
        return conformance_problems(out.getvalue())

    assert broken(BilledCost="1,012.5") and broken(BilledCost="3") and broken(BilledCost="")
    assert broken(ChargePeriodStart="2026-05-04 00:00:00") and broken(ChargeCategory="usage")
    assert broken(ServiceSubcategory="Other (Compute)") and broken(PricingUnit="")
    assert broken(Tags='{"a": {"b": 1}}') and broken(ListUnitPrice="9.0")


def test_the_chargeback_conforms_to_focus_1_2(tmp_path: Path) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    full_books(led)
    text = export(led, "focus")
    assert conformance_problems(text) == []
    rows = list(csv.DictReader(io.StringIO(text)))
    header = list(rows[0])
    mandatory = [c for c, r in spec_columns().items() if r["level"] == "Mandatory"]
    assert set(mandatory) <= set(header) and len(mandatory) == 21
    assert header[: len(focus.COLUMNS)] == list(focus.COLUMNS)
    assert "x_FrugalRecords" not in header  # the backup is the jsonl export, not this file
    run = next(r for r in rows if r["x_FrugalKind"] == "run" and r["x_Outcome"] == "completed")
    assert (run["ChargePeriodStart"], run["ChargePeriodEnd"]) == (
        "2026-05-04T10:00:00Z", "2026-05-04T12:24:01Z")  # fmt: skip
    assert (run["BilledCost"], run["ConsumedQuantity"], run["ConsumedUnit"]) == (
        "0.82", "2.4", "GPU-Hours")  # fmt: skip
    assert (run["ListUnitPrice"], run["PricingUnit"], run["PricingCategory"]) == (
        "0.34", "Hours", "Dynamic")  # its plan's spot price per hour  # fmt: skip
    assert json.loads(run["Tags"])["team"] == "nlp"
    assert (run["BillingPeriodStart"], run["BillingPeriodEnd"]) == (
        "2026-05-01T00:00:00Z", "2026-06-01T00:00:00Z")  # fmt: skip
    bucket = next(r for r in rows if r["ChargeDescription"] == "bucket")
    assert (bucket["SubAccountId"], bucket["SubAccountName"]) == ("project/demo", "demo")
    assert bucket["ServiceSubcategory"] == "Other (Storage)"
    # a cost matched to a run bills nothing of its own: the column adds up to the spend
    billed = sum(float(r["BilledCost"]) for r in rows)
    assert billed == pytest.approx(report(led, "team", "all", extras=False).totals.spend_usd)
    assert billed == pytest.approx(0.82 + 0.01 + 3.5)


def test_the_focus_metadata_declares_1_2(tmp_path: Path) -> None:
    meta = focus.metadata(T("2026-05-04T10:00:00"), "0.1.0")
    schema = meta["Schema"]
    assert (schema["FocusVersion"], schema["CreationDate"]) == ("1.2", "2026-05-04T10:00:00Z")
    assert meta["DataGenerator"] == "frugal"
    names = [c["ColumnName"] for c in schema["ColumnDefinition"]]
    assert names == [*focus.COLUMNS, *focus.X_COLUMNS]
    tags = next(c for c in schema["ColumnDefinition"] if c["ColumnName"] == "Tags")
    assert tags == {"ColumnName": "Tags", "DataType": "JSON", "ProviderTagPrefixes": []}
    assert focus.metadata(T("2027-01-01"), "0.2.0")["Schema"]["SchemaId"] == schema["SchemaId"]


def test_costs_export_and_import_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FRUGAL_DB_URL", f"sqlite:///{tmp_path / 'a.sqlite'}")
    full_books(Ledger())
    assert main(["costs", "export", "--format", "focus"]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "books.csv"
    assert main(["costs", "export", "--format", "focus", "--output", str(out)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "wrote 4 rows" in said and "books.focus-metadata.json" in said
    assert out.read_text() == printed
    meta = json.loads((tmp_path / "books.focus-metadata.json").read_text())
    assert meta["Schema"]["FocusVersion"] == "1.2"
    backup = tmp_path / "books.jsonl"
    assert main(["costs", "export", "--output", str(backup)]) == 0
    capsys.readouterr()
    monkeypatch.setenv("FRUGAL_DB_URL", f"sqlite:///{tmp_path / 'b.sqlite'}")
    # the chargeback is not a bill: imported, its runs would count twice
    assert "is frugal's own chargeback" in run_error(capsys, "costs", "import", str(out))
    got = run_json(capsys, "costs", "import", str(backup), "--json")
    assert got["format"] == "jsonl" and got["added"]["runs"] == 2
    assert main(["costs", "import", str(backup)]) == 0
    assert "added nothing" in capsys.readouterr().out


def test_the_same_bill_imported_twice_at_once_counts_once(ledger_url: str, tmp_path: Path) -> None:
    """Two `frugal costs import` of one file at the same moment (two people, a retried
    job): the second waits for the first and finds its rows on the books."""
    import subprocess
    import sys
    import time

    rows = [bill_row(0.25 + i / 100, f"2026-05-{1 + i % 28:02d}T00:00:00Z",
                     resource=f"i-{i}") for i in range(2000)]  # fmt: skip
    bill = write_bill(tmp_path / "bill.csv", rows)
    led = Ledger(ledger_url)  # migrated before the race: the race is the import's
    env = {**os.environ, "FRUGAL_DB_URL": ledger_url}
    cmd = [sys.executable, "-m", "frugal.cli.main", "costs", "import", str(bill), "--json"]
    with led.exclusive():  # the books busy: both imports start, and meet at the same point
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
                 for _ in range(2)]  # fmt: skip
        time.sleep(6)  # started, and each waiting for the books (without the lock: each has
        assert all(p.poll() is None for p in procs)  # read that nothing is there yet)
    added = [json.loads(p.communicate(timeout=120)[0])["added"]["costs"] for p in procs]
    assert sorted(added) == [0, 2000]
    assert report(Ledger(ledger_url), "team", "all", extras=False).totals.spend_usd == (
        pytest.approx(sum(0.25 + i / 100 for i in range(2000)))
    )
