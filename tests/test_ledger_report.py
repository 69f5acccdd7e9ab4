"""Reports over the books (frugal.ledger.report, `frugal costs report|showback|add`): group
sums against hand-computed values, periods, lost money, estimate error, the month-end
projection, anomalies and the weekly showback, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import run_error, run_json

from frugal.cli.main import main
from frugal.errors import FrugalError
from frugal.ledger import forecast, periods, showback
from frugal.ledger import report as rep
from frugal.ledger.store import Ledger


def T(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def add_run(led: Ledger, start: datetime, tags: dict[str, str], outcome: str | None = "completed",
            gpu: str = "H100", gpus: int = 1, provider: str = "aws", method: str = "lora",
            hours: float = 1.0, tokens: float = 1e6, cost: float = 1.0, est: float | None = None,
            model: str = "llama-8b") -> str:  # fmt: skip
    rid = led.start_run(model=model, method=method, config={}, price_per_hour_usd=1.0,
                        provider=provider, gpu=gpu, gpus=gpus, tags=tags, at=start,
                        predicted={"cost_usd": est} if est is not None else {})  # fmt: skip
    if outcome is None:  # still running: a heartbeat's dollars so far
        led.heartbeat(rid, step=1, tokens=tokens, cost_usd=cost, at=start + timedelta(minutes=1))
    else:
        led.end_run(rid, outcome, {}, step=10, tokens=tokens, cost_usd=cost, hours=hours,
                    at=start + timedelta(hours=hours))  # fmt: skip
    return rid


def may_books(led: Ledger) -> None:
    """Six runs and four costs in May 2026 (one cost matched to a run), one run either side."""
    r1 = add_run(led, T("2026-05-03T10:00"), {"project": "chat", "team": "nlp"}, gpus=2, hours=3,
                 tokens=6e6, cost=30, est=25)  # fmt: skip
    add_run(led, T("2026-05-04T10:00"), {"project": "chat", "team": "nlp"}, method="qlora",
            hours=2, tokens=2e6, cost=10, est=12.5)  # fmt: skip
    add_run(led, T("2026-05-05T10:00"), {"project": "chat", "team": "cv"}, "failed", gpu="A100",
            provider="runpod", tokens=5e5, cost=4, est=8)  # fmt: skip
    add_run(led, T("2026-05-06T10:00"), {"project": "search", "team": "cv"}, "preempted",
            gpu="A100", gpus=4, provider="runpod", method="full", hours=0.5, cost=6,
            est=10)  # fmt: skip
    add_run(led, T("2026-05-07T10:00"), {"project": "search", "model": "custom-model"}, None,
            gpu="L4", provider="local", tokens=1e5, cost=1)  # fmt: skip
    add_run(led, T("2026-05-08T10:00"), {}, cost=5, est=5)
    add_run(led, T("2026-04-30T23:59:59"), {"project": "chat"}, cost=1000)
    add_run(led, T("2026-06-01T00:00:00"), {"project": "chat"}, cost=1000)
    led.add_cost(7, "storage", tags={"project": "chat"}, at=T("2026-05-10T00:00"), provider="aws")
    led.add_cost(3, "notebook", tags={"project": "search"}, at=T("2026-05-11T00:00"),
                 provider="runpod", gpu_hours=1.5)  # fmt: skip
    led.add_cost(100, "compute", run_id=r1, at=T("2026-05-03T00:00"), provider="aws")
    led.add_cost(2, "other", at=T("2026-05-12T00:00"))


def groups(r: rep.SpendReport) -> dict[str, dict[str, Any]]:
    return {g.name: g.to_json() for g in r.groups}


def test_group_sums_match_hand_computed_values(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    may_books(led)
    r = rep.report(led, by="project", period="2026-05", at=T("2026-05-20T12:00"))
    g = groups(r)
    assert list(g) == ["chat", "search", "(none)"]  # by spend
    chat, search, none = g["chat"], g["search"], g["(none)"]
    assert chat["spend_usd"] == pytest.approx(51)  # 30 + 10 + 4 + the $7 storage
    assert (chat["run_spend_usd"], chat["other_spend_usd"]) == pytest.approx((44, 7))
    assert chat["gpu_hours"] == pytest.approx(3 * 2 + 2 + 1)
    assert chat["tokens"] == pytest.approx(8.5e6)
    assert chat["usd_per_million_tokens"] == pytest.approx(44 / 8.5, abs=1e-4)
    outcomes = {"completed": 2, "failed": 1, "preempted": 0, "budget-stopped": 0,
                "idle-stopped": 0, "running": 0}  # fmt: skip
    assert chat["runs_by_outcome"] == outcomes
    assert chat["lost_usd"] == pytest.approx(4)
    # estimates of completed runs only: +20% and -20% (the failed run's 4 vs 8 is not one)
    assert (chat["est_error_median_abs_pct"], chat["est_error_median_pct"]) == pytest.approx(
        (20, 0)
    )
    assert chat["est_error_runs"] == 2
    assert search["spend_usd"] == pytest.approx(6 + 1 + 3)
    assert search["gpu_hours"] == pytest.approx(0.5 * 4 + 1.5)
    assert search["runs_by_outcome"]["preempted"] == search["runs_by_outcome"]["running"] == 1
    assert search["lost_usd"] == pytest.approx(6)
    assert search["est_error_median_abs_pct"] is None
    assert none["spend_usd"] == pytest.approx(5 + 2)  # the untagged run and cost
    assert none["est_error_median_abs_pct"] == pytest.approx(0)
    t = r.totals.to_json()
    assert t["spend_usd"] == pytest.approx(68)  # the $100 matched to a run is in its $30
    assert (t["runs"], t["other_costs"], t["lost_usd"]) == (6, 3, pytest.approx(10))
    assert t["gpu_hours"] == pytest.approx(13.5)
    assert (t["est_error_median_abs_pct"], t["est_error_median_pct"]) == pytest.approx((20, 0))

    def spend(by: str) -> dict[str, float]:
        return {k: v["spend_usd"] for k, v in groups(rep.report(led, by, "2026-05")).items()}

    assert spend("model") == pytest.approx({"llama-8b": 55, "custom-model": 1, "(none)": 12})
    assert spend("gpu") == pytest.approx({"H100": 45, "A100": 10, "L4": 1, "(none)": 12})
    assert spend("provider") == pytest.approx({"aws": 52, "runpod": 13, "local": 1, "(none)": 2})
    assert spend("method") == pytest.approx({"lora": 40, "qlora": 10, "full": 6, "(none)": 12})
    assert spend("outcome") == pytest.approx(
        {"completed": 45, "failed": 4, "preempted": 6, "running": 1, "(none)": 12}
    )
    assert spend("team") == pytest.approx({"nlp": 40, "cv": 10, "(none)": 18})
    assert spend("tag:env") == pytest.approx({"(none)": 68})


def test_periods_and_their_boundaries(ledger_url: str) -> None:
    at = T("2026-05-20T12:00")  # a Wednesday
    p = periods.parse_period
    assert (p("this-month", at).start, p("this-month", at).end) == (
        T("2026-05-01"),
        T("2026-06-01"),
    )
    assert (p("last-month", at).start, p("last-month", at).end) == (
        T("2026-04-01"),
        T("2026-05-01"),
    )
    assert (p("this-week", at).start, p("this-week", at).end) == (T("2026-05-18"), T("2026-05-25"))
    assert (p("last-week", at).start, p("last-week", at).end) == (T("2026-05-11"), T("2026-05-18"))
    assert (p("7d", at).start, p("7d", at).end) == (T("2026-05-13T12:00"), at)
    assert (p("2026-02", at).start, p("2026-02", at).end) == (T("2026-02-01"), T("2026-03-01"))
    assert (p("all", at).start, p("all", at).end) == (None, None)
    span = p("2026-05-01..2026-05-31", at)  # a TO date includes its day
    assert (span.start, span.end) == (T("2026-05-01"), T("2026-06-01"))
    assert p("2026-05-01T06:00..2026-05-02T06:00", at).end == T("2026-05-02T06:00")
    assert p("..2026-05-02", at).start is None
    for bad in ("soon", "2026-13", "2026-05-10..2026-05-01", "..", "30"):
        with pytest.raises(FrugalError, match="--period"):
            p(bad, at)
    with pytest.raises(FrugalError, match="--by"):
        rep.parse_by("colour")
    with pytest.raises(FrugalError, match="tag name"):
        rep.parse_by("tag:9bad")

    led = Ledger(ledger_url)
    add_run(led, T("2026-04-30T23:59:59.999999"), {"team": "a"}, cost=1)
    add_run(led, T("2026-05-01T00:00:00"), {"team": "a"}, cost=10)  # the first instant of May
    add_run(led, T("2026-05-31T23:59:59.999999"), {"team": "a"}, cost=100)
    add_run(led, T("2026-06-01T00:00:00"), {"team": "a"}, cost=1000)
    led.add_cost(10000, "other", at=T("2026-05-18T00:00"))  # Monday 00:00: this week

    def total(period: str) -> float:
        return rep.report(led, "team", period, at=at, extras=False).totals.spend_usd

    assert total("2026-05") == pytest.approx(10110)
    assert total("last-month") == pytest.approx(1)
    assert total("2026-05-02..2026-05-31") == pytest.approx(10100)
    assert total("this-week") == pytest.approx(10000)
    assert total("last-week") == pytest.approx(0)
    assert total("2026-06-01..") == pytest.approx(1000)
    assert total("all") == pytest.approx(11111)


def test_the_month_end_projection(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    at = T("2026-05-20T12:00")
    add_run(led, T("2026-04-10T00:00"), {}, cost=1000)  # last month: neither sum
    add_run(led, T("2026-05-02T00:00"), {}, cost=100)  # this month, not the last 7 days
    add_run(led, T("2026-05-15T00:00"), {}, cost=70)
    add_run(led, T("2026-05-19T00:00"), {}, cost=70)
    led.add_cost(14, "storage", at=T("2026-05-18T00:00"))
    pr = rep.report(led, "team", "this-month", at=at).projection
    assert pr is not None
    assert pr.spent_usd == pytest.approx(254)
    assert (pr.rate_days, pr.rate_usd_per_day) == (7, pytest.approx(154 / 7))
    assert pr.days_left == pytest.approx(11.5)
    assert pr.projected_usd == pytest.approx(254 + 22 * 11.5)
    assert "$254.00 so far in 2026-05 + $22.00 a day (the last 7 days' mean)" in pr.how
    with led.session() as s:  # young books: the rate over the days they cover
        young = rep.projection(s, T("2026-04-11T12:00"))
    assert (young.rate_days, young.rate_usd_per_day) == (2, pytest.approx(500))


def spiky(days: int, spike: int | None, base: float = 100.0) -> dict[date, float]:
    d0 = date(2026, 3, 1)
    out = {d0 + timedelta(days=i): base + ((i * 37) % 11 - 5) * 5 for i in range(days)}  # ±25%
    if spike is not None:
        out[d0 + timedelta(days=spike)] = 4 * base
    return out


def test_anomalies_find_a_planted_spike_and_nothing_on_flat_spend() -> None:
    d0 = date(2026, 3, 1)
    last = d0 + timedelta(days=39)
    found = forecast.detect_anomalies(spiky(40, 30), d0, last, d0)
    assert [a.day for a in found] == [d0 + timedelta(days=30)]
    a = found[0]
    assert a.spend_usd == 400 and 85 <= a.baseline_usd <= 115 and a.threshold_usd < 400
    assert forecast.detect_anomalies(spiky(40, None), d0, last, d0) == []
    assert forecast.detect_anomalies({d: 50.0 for d in spiky(40, None)}, d0, last, d0) == []
    # a spike before 7 days of books is not judged; sparse small spend does not flag
    assert forecast.detect_anomalies(spiky(40, 4), d0, last, d0) == []
    sparse = {d0 + timedelta(days=i): 5.0 for i in range(0, 40, 9)}
    assert forecast.detect_anomalies(sparse, d0, last, d0) == []


def test_anomalies_from_the_books(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    for day, usd in spiky(30, 20).items():
        start = datetime(day.year, day.month, day.day, 23, 30, tzinfo=UTC)  # late: UTC days
        add_run(led, start, {"team": "nlp"}, cost=usd - 10)
        led.add_cost(10, "storage", at=start)
    r = rep.report(led, "team", "all", at=T("2026-03-30T12:00"))
    assert [a.day for a in r.anomalies] == [date(2026, 3, 21)]
    assert r.anomalies[0].spend_usd == pytest.approx(400)
    assert rep.report(led, "team", "2026-03-01..2026-03-20", at=T("2026-04-30")).anomalies == []


def test_the_weekly_showback(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    add_run(led, T("2026-05-05T10:00"), {"team": "nlp"}, cost=10)  # W19
    add_run(led, T("2026-05-06T10:00"), {"team": "cv"}, cost=4)
    top = add_run(led, T("2026-05-12T10:00"), {"team": "nlp"}, cost=12, hours=3, gpus=2)  # W20
    add_run(led, T("2026-05-13T10:00"), {"team": "nlp"}, "failed", cost=3)
    add_run(led, T("2026-05-14T10:00"), {"team": "search"}, "preempted", cost=5)
    led.add_cost(2, "storage", at=T("2026-05-15T00:00"))
    md = showback.showback(led, "last", at=T("2026-05-20T12:00")).to_markdown()
    assert md.startswith("# GPU spend by team: week of 2026-05-11 (2026-W20)\n")
    assert "Total **$22.00**, +$8.00 (+57%) vs the week before ($14.00) · 3 runs" in md
    assert "| nlp | $15.00 | +$5.00 (+50%) | 2 | 1 | 0 | $3.00 |" in md
    assert "| search | $5.00 | +$5.00 (new) | 1 | 0 | 1 | $5.00 |" in md
    assert "| cv | $0.00 | -$4.00 (-100%) | 0 | 0 | 0 | $0.00 |" in md
    assert "| (none) | $2.00 | +$2.00 (new) | 0 | 0 | 0 | $0.00 |" in md
    nlp = md[md.index("## nlp") :]
    assert f"| {top[:8]} | llama-8b | 2x H100 | completed | 3.00 | $12.00 |" in nlp
    assert "Failures: 1 failed, 0 preempted ($3.00 lost)." in nlp
    assert md == showback.showback(led, "2026-W20", at=T("2026-06-30")).to_markdown()
    assert md == showback.showback(led, "2026-05-14").to_markdown()
    with pytest.raises(FrugalError, match="--week"):
        periods.parse_week("W20")


# -- the command line ------------------------------------------------------------------------


@pytest.fixture
def books(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    led = Ledger(url)
    may_books(led)
    return led


def test_costs_report_json_is_one_object(books: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "costs", "report", "--by", "team", "--period", "2026-05", "--json")
    assert out["by"] == "team" and out["period"]["start"].startswith("2026-05-01")
    assert {g["group"]: g["spend_usd"] for g in out["groups"]} == pytest.approx(
        {"nlp": 40, "cv": 10, "(none)": 18}
    )
    assert out["totals"]["spend_usd"] == pytest.approx(68)
    assert set(out["projection"]) >= {"projected_usd", "how"} and "anomalies" in out


def test_costs_report_csv_and_table(books: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costs", "report", "--by", "gpu", "--period", "2026-05", "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == list(rep.CSV_COLUMNS)
    assert rows[0][:3] == ["group", "spend_usd", "run_spend_usd"]
    assert [r[0] for r in rows[1:]] == ["H100", "(none)", "A100", "L4", "(total)"]
    assert float(rows[-1][1]) == pytest.approx(68)
    assert main(["costs", "report", "--period", "2026-05"]) == 0
    out = capsys.readouterr().out
    assert "spend by project, 2026-05" in out and "$51.00" in out and "month end" in out


def test_costs_commands_refuse_bad_input(books: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    assert "--by 'colour'" in run_error(capsys, "costs", "report", "--by", "colour")
    assert "--period 'soon'" in run_error(capsys, "costs", "report", "--period", "soon")
    assert "choose one" in run_error(capsys, "costs", "report", "--json", "--csv")
    assert "--week" in run_error(capsys, "costs", "showback", "--week", "someday")
    assert "'amount': 0: give a number above 0" in run_error(capsys, "costs", "add", "0")
    assert "--at" in run_error(capsys, "costs", "add", "5", "--at", "yesterday")
    assert "key=value" in run_error(capsys, "costs", "add", "5", "--tag", "team")
    assert "--format" in run_error(capsys, "costs", "export", "--format", "xlsx")


def test_costs_add_and_showback(books: Ledger, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    out = run_json(capsys, "costs", "add", "12.5", "--kind", "storage", "--tag", "team=nlp",
                   "--at", "2026-05-12", "--gpu-hours", "2", "--json")  # fmt: skip
    assert out["amount_usd"] == 12.5 and out["tags"]["team"] == "nlp" and "user" in out["tags"]
    r = rep.report(books, "team", "2026-05", extras=False)
    assert groups(r)["nlp"]["other_spend_usd"] == pytest.approx(12.5)
    monkeypatch.setenv("FRUGAL_REQUIRED_TAGS", "project")
    assert "missing required tag project" in run_error(capsys, "costs", "add", "1")
    assert main(["costs", "showback", "--week", "2026-W19"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# GPU spend by team: week of 2026-05-04 (2026-W19)")
    assert "| nlp | $10.00 | -$20.00 (-67%) | 1 | 0 | 0 | $0.00 |" in md  # May 3 was W18


def test_costs_sync_sends_what_a_run_spooled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    run_dir = tmp_path / "runs" / "demo"
    run_dir.mkdir(parents=True)
    ops = [
        {
            "op": "start_run",
            "run_id": "r1",
            "model": "m",
            "method": "lora",
            "config": {},
            "price_per_hour_usd": 1.0,
            "at": "2026-05-01T00:00:00+00:00",
        },
        {
            "op": "end_run",
            "run_id": "r1",
            "outcome": "completed",
            "actual": {},
            "step": 3,
            "tokens": 10.0,
            "cost_usd": 2.5,
            "hours": 2.5,
            "at": "2026-05-01T02:30:00+00:00",
        },
    ]
    (run_dir / "ledger-spool.jsonl").write_text("".join(json.dumps(o) + "\n" for o in ops))
    assert main(["costs", "sync", str(tmp_path / "runs")]) == 0
    assert "sent 2 records" in capsys.readouterr().out
    assert Ledger(url).total_cost() == pytest.approx(2.5)
    assert not (run_dir / "ledger-spool.jsonl").exists()
