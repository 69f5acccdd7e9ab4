"""The lifecycle (`frugal lifecycle`, serve.lifecycle) and a model's life on the books
(`costs add --model`, `costs lifetime`, ledger.lifetime): the large model as it is, a smaller
one trained and served, an API; the training priced as `frugal plan` prices it and the
serving as `frugal serve plan` does; quality from the books or given; the frontier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_json
from sqlalchemy import func, select

from frugal.cli.main import main
from frugal.ledger.schema import PlanRecord
from frugal.ledger.store import Ledger
from frugal.models.specs import load_spec
from frugal.serve.lifecycle import Lifecycle, Way

SMALL, LARGE = "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B"
LOAD = ["--rate", "20", "--input-len", "512", "--output-len", "128"]
DISTIL = ["--task", "distill", "--teacher", LARGE, "--tokens", "50M", "--epochs", "3"]


@pytest.fixture
def books(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Ledger:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    return Ledger(url)


# -- the arithmetic ---------------------------------------------------------------------------


def test_totals_per_million_payback_and_the_frontier() -> None:
    big = Way("big", "b", "4x GPU", serving_usd_month=1000.0, serving_gpu_h_month=4 * 730,
              quality=1.0)  # fmt: skip
    small = Way("small", "s", "1x GPU", training_usd=300.0, training_gpu_h=20.0,
                serving_usd_month=250.0, serving_gpu_h_month=730, quality=1.2)  # fmt: skip
    api = Way("api", "b", "someone", serving_usd_month=1500.0, quality=1.0)
    worse = Way("worse", "s", "1x GPU", training_usd=400.0, serving_usd_month=250.0, quality=1.3)
    life = Lifecycle([big, small, api, worse], 12, 2_000_000, "loss", False)
    assert life.total_usd(small) == 300 + 250 * 12
    assert life.usd_per_million(big) == pytest.approx(12_000 / 24)  # 24M requests
    assert life.gpu_hours(small) == 20 + 730 * 12
    assert life.pays_back_months(small, big) == pytest.approx(300 / 750)
    assert life.pays_back_months(big, small) is None  # it serves for more: never
    # the API's quality is the big model's at a higher price; `worse` costs more for less
    assert life.frontier == [small, big] and life.cheapest is small
    again = Lifecycle([big, small], 12, 2e6, "loss", False, retrain_every=5)  # months 1, 6, 11
    assert again.trainings == 3 and again.total_usd(small) == 3 * 300 + 250 * 12
    assert again.gpu_hours(small) == 3 * 20 + 730 * 12
    assert Lifecycle([big], 12, 2e6, "loss", False, retrain_every=12).trainings == 1
    higher = Lifecycle([big, small], 12, 2e6, "accuracy", True)  # higher: small is better too
    assert higher.frontier == [small]
    assert Lifecycle([big, small, api], 12, 2e6, "loss", False).to_json()["frontier"] == [
        "small", "big"]  # fmt: skip


def test_a_training_that_costs_nothing_is_still_the_trained_way() -> None:
    """The trained way is named by the lifecycle, not found by its dollars: a training of
    $0 (a local GPU already paid for) pays for itself at once, and its notes say so."""
    big = Way("big", "b", "4x GPU", serving_usd_month=1000.0)
    free = Way("free", "s", "local GPU", training_usd=0.0, serving_usd_month=250.0)
    notes = Lifecycle([big, free], 12, 2e6, "loss", False, trained=1).notes()
    assert notes[0] == "training pays for itself against big after 0.0 days of serving"
    assert "(plan not recorded)" in notes[-1]
    both = Lifecycle([big, free], 12, 2e6, "loss", False, trained=0).notes()
    assert both[0].startswith("training never pays back against free")


# -- the command ------------------------------------------------------------------------------


def test_each_way_is_priced_as_plan_and_serve_plan_price_it(
    capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    """The trained way's dollars are `frugal plan`'s for the same job; each self-hosted
    way's a month are `frugal serve plan`'s cheapest deployment of its model; the API's the
    cheapest bundled API serving the large model, for the load."""
    got = run_json(capsys, "lifecycle", SMALL, *DISTIL, *LOAD, "--json")
    plan = run_json(capsys, "plan", SMALL, *DISTIL, "--json")
    ways = {w["name"]: w for w in got["ways"]}
    trained = ways["Llama-3.2-1B distilled, lora"]
    assert trained["training_usd"] == pytest.approx(
        plan["recommendation"]["est_cost_usd"], abs=0.01
    )
    serve = {m: run_json(capsys, "serve", "plan", m, *LOAD, "--json") for m in (LARGE, SMALL)}
    for name, model in (("Llama-3.1-8B as it is", LARGE), ("Llama-3.2-1B distilled, lora", SMALL)):
        month = serve[model]["recommendation"]["usd_per_month"]
        assert ways[name]["serving_usd_per_month"] == pytest.approx(month, abs=0.01)
        assert ways[name]["training_usd"] == (0 if model == LARGE else trained["training_usd"])
    api = ways["Llama-3.1-8B by API, deepinfra"]
    cheapest = serve[LARGE]["apis"][0]["usd_per_month"]
    assert api["serving_usd_per_month"] == pytest.approx(cheapest, rel=1e-4)
    months, requests = got["months"], got["requests_per_month"]
    for w in got["ways"]:
        total = w["training_usd"] + w["serving_usd_per_month"] * months
        assert w["total_usd"] == pytest.approx(total, abs=0.02)
        assert w["usd_per_million_predictions"] == pytest.approx(total / (requests * months) * 1e6,
                                                                 rel=1e-3)  # fmt: skip
    assert requests == pytest.approx(20 * 3600 * 730)
    monthly = run_json(capsys, "lifecycle", SMALL, *DISTIL, *LOAD, "--train-every-months", "1",
                       "--json")  # fmt: skip
    again = {w["name"]: w for w in monthly["ways"]}["Llama-3.2-1B distilled, lora"]
    assert monthly["trainings"] == 12
    assert again["total_usd"] == pytest.approx(
        12 * trained["training_usd"] + 12 * trained["serving_usd_per_month"], abs=0.05
    )
    assert got["cheapest"] == "Llama-3.2-1B distilled, lora"  # a 1B serves 20/s for less
    assert got["frontier"] == []  # no quality known: no frontier
    assert any("no quality on the books" in n for n in got["notes"])
    one = run_json(capsys, "lifecycle", SMALL, *DISTIL, *LOAD, "--quality", "trained=1.2", "--json")
    assert one["frontier"] == ["Llama-3.2-1B distilled, lora"]
    assert any("whose quality is known (1 of 3)" in n for n in one["notes"])


def test_quality_comes_from_the_books_and_draws_the_frontier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    """The large model a run made (its directory), evaluated; the small model trained by
    an earlier run of the same job: each one's newest finished run says its quality."""
    made = tmp_path / "runs" / "big"
    (made / "final").mkdir(parents=True)
    (made / "final" / "config.json").write_text(json.dumps(load_spec(LARGE).config))
    old = books.start_run(model=LARGE, method="lora", config={"model": LARGE},
                          price_per_hour_usd=1.0, output_dir=str(made))  # fmt: skip
    books.end_run(old, "completed", {"best_eval_loss": 1.05}, step=9, tokens=1.0, cost_usd=3.0,
                  hours=1.0)  # fmt: skip
    student = books.start_run(model=SMALL, method="lora", price_per_hour_usd=1.0,
                              config={"model": SMALL, "job": {"task": "causal"}})  # fmt: skip
    books.end_run(student, "completed", {"best_eval_loss": 1.31}, step=9, tokens=1.0,
                  cost_usd=1.0, hours=1.0)  # fmt: skip
    plot = tmp_path / "life.html"
    got = run_json(capsys, "lifecycle", SMALL, "--large", str(made / "final"), "--tokens", "50M",
                   "--epochs", "3", *LOAD, "--plot", str(plot), "--json")  # fmt: skip
    ways = {w["name"]: w for w in got["ways"]}
    assert ways["final as it is"]["quality"] == 1.05
    assert ways["final as it is"]["quality_from"] == f"run {old[:8]} on the books"
    assert ways["Llama-3.2-1B fine-tuned, lora"]["quality"] == 1.31
    assert got["frontier"] == ["Llama-3.2-1B fine-tuned, lora", "final as it is"]
    page = plot.read_text()
    assert "Llama-3.2-1B fine-tuned, lora" in page and "held-out loss on the labels" in page
    # both ways drawn, on the frontier (no API serves a model of one's own)
    assert page.count('class="fp"') == 2 and page.count('class="p"') == 0
    assert len(got["ways"]) == 2
    png = tmp_path / "life.png"
    run_json(capsys, "lifecycle", SMALL, "--large", str(made / "final"), "--tokens", "50M",
             "--epochs", "3", *LOAD, "--plot", str(png), "--json")  # fmt: skip
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a quality given wins over the books'
    got = run_json(capsys, "lifecycle", SMALL, "--large", str(made / "final"), "--tokens", "50M",
                   "--epochs", "3", *LOAD, "--quality", "trained=0.9", "--json")  # fmt: skip
    ways = {w["name"]: w for w in got["ways"]}
    assert ways["Llama-3.2-1B fine-tuned, lora"]["quality_from"] == "--quality"
    assert got["frontier"] == ["Llama-3.2-1B fine-tuned, lora"]  # better and cheaper


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--tokens", "1M"], "--large MODEL"),
        ([*DISTIL, "--quality", "small=1"], "give large=VALUE or trained=VALUE"),
        ([*DISTIL, "--quality", "large=good"], "'good' is not a number"),
        ([*DISTIL, "--quality", "trained=nan"], "'nan' is not a number"),
        ([*DISTIL, "--metric", "bleu"], "--metric 'bleu'"),
        ([*DISTIL, "--plot", "x.txt"], "end the name in .png"),
    ],
)
def test_bad_input_is_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    assert main(["lifecycle", SMALL, *LOAD, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_a_load_missing_stops_before_the_training_plan_is_recorded(
    capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    assert main(["lifecycle", SMALL, *DISTIL, "--input-len", "10", "--output-len", "10"]) == 2
    assert "give the load" in capsys.readouterr().err
    with books.session() as s:
        assert s.scalar(select(func.count()).select_from(PlanRecord)) == 0


def test_a_plot_without_any_quality_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    plot = tmp_path / "life.html"
    assert main(["lifecycle", SMALL, *DISTIL, *LOAD, "--plot", str(plot)]) == 2
    assert "no way has a known quality" in capsys.readouterr().err
    assert not plot.exists()


# -- a model's lifetime on the books ----------------------------------------------------------


def test_serving_is_attributed_to_the_model_and_summed_with_its_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    out = tmp_path / "runs" / "my model"  # a space in the name
    (out / "final").mkdir(parents=True)
    rid = books.start_run(model=SMALL, method="lora", config={}, price_per_hour_usd=2.0,
                          gpus=2, output_dir=str(out), tags={"model": SMALL})  # fmt: skip
    books.end_run(rid, "completed", {}, step=5, tokens=1.0, cost_usd=8.0, hours=4.0)
    again = books.start_run(
        model=SMALL, method="lora", config={}, price_per_hour_usd=2.0, output_dir=str(out)
    )  # started again in the same directory
    books.end_run(again, "completed", {}, step=5, tokens=1.0, cost_usd=2.0, hours=1.0)
    for amount, name in ((300.0, str(out / "final")), (200.0, rid), (50.0, LARGE)):
        got = run_json(capsys, "costs", "add", str(amount), "--kind", "serving", "--model", name,
                       "--gpu-hours", "730", "--json")  # fmt: skip
        assert got["tags"]["model"] == (LARGE if name == LARGE else SMALL)
    run_json(capsys, "costs", "add", "4", "--kind", "storage", "--model", str(out), "--json")
    life = run_json(capsys, "costs", "lifetime", str(out / "final"), "--json")
    parts = {p["what"]: p for p in life["parts"]}
    assert parts["training"]["entries"] == 2 and parts["training"]["usd"] == 10.0
    assert parts["training"]["gpu_hours"] == 4 * 2 + 1
    assert parts["serving"] == parts["serving"] | {"entries": 2, "usd": 500.0, "gpu_hours": 1460}
    assert parts["storage"]["usd"] == 4.0 and life["usd"] == 514.0
    assert sorted(life["runs"]) == sorted([rid, again])
    large = run_json(capsys, "costs", "lifetime", LARGE, "--json")
    assert large["usd"] == 50.0 and large["runs"] == []
    assert main(["costs", "lifetime", str(out / "final")]) == 0
    assert "its lifetime on the books" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["costs", "add", "5", "--model", "."], "no run on the books trained in"),
        (["costs", "add", "5", "--model", "x" * 301], "name it in 300 or fewer"),
        (["costs", "lifetime", "nobody/served-this"], "nothing on the books trained or served"),
    ],
)
def test_a_model_the_books_do_not_know_is_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_no_commitment_outlives_the_horizon(
    capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    """On AWS the 8B serves 20 requests/s cheapest on a 12-month commitment: over 12 months
    the lifecycle takes it, over 6 it may not (it would be owed for 6 more)."""
    aws = [*DISTIL, *LOAD, "--providers", "aws", "--json"]
    ways = {w["name"]: w for w in run_json(capsys, "lifecycle", SMALL, *aws)["ways"]}
    assert "commitment 12 months" in ways["Llama-3.1-8B as it is"]["serving"]
    short = run_json(capsys, "lifecycle", SMALL, *aws, "--months", "6")
    assert not any("commitment" in w["serving"] for w in short["ways"])
