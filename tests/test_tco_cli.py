"""`frugal tco`: the serving plan priced every way over N months, training included."""

from __future__ import annotations

import pytest
from conftest import run_error, run_json

LLAMA8 = "meta-llama/Llama-3.1-8B"
LOAD = ["--rate", "20", "--input-len", "1000", "--output-len", "200", "--ttft-ms", "500"]


def test_tco_compares_renting_committing_managed_api_and_owning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(capsys, "tco", LLAMA8, *LOAD, "--quant", "bf16", "--providers", "aws", "--json")
    names = [o["name"] for o in out["options"]]  # bf16: an L40S, which a platform sells
    assert names[0] == "on-demand" and "spot" in names
    # a 36-month term is not priced over 12 months: it would still be owed after
    assert "commitment 12 months" in names and "commitment 36 months" not in names
    longer = run_json(capsys, "tco", LLAMA8, *LOAD, "--quant", "bf16", "--providers", "aws",
                      "--months", "36", "--json")  # fmt: skip
    assert "commitment 36 months" in [o["name"] for o in longer["options"]]
    assert any(n.startswith("managed ") for n in names)
    assert any(n.startswith("API ") for n in names)
    assert any(n.startswith("own ") for n in names)
    assert len(out["cheapest_by_month"]) == 12
    by = {o["name"]: o for o in out["options"]}
    # the serving plan's fleet, priced on-demand for 730 hours a month
    s = out["serving"]
    per_replica = s["usd_h"] / s["replicas_running"] if s["replicas_running"] else 0
    assert by["on-demand"]["monthly_usd"][0] == pytest.approx(
        s["replicas"] * per_replica * 730, rel=1e-3
    )
    # a commitment is cheaper per month than on-demand for a load that runs all month
    assert by["commitment 12 months"]["monthly_usd"][0] < by["on-demand"]["monthly_usd"][0]
    assert out["cheapest_total"] in names


def test_engineering_hours_and_training_enter_every_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = run_json(capsys, "tco", LLAMA8, *LOAD, "--providers", "aws", "--json")
    paid = run_json(capsys, "tco", LLAMA8, *LOAD, "--providers", "aws", "--json",
                    "--engineering-usd-h", "100", "--train-tokens", "2e7")  # fmt: skip
    assert paid["training"]["gpu_hours"] > 0
    train_usd = paid["training"]["gpu_hours"] * paid["training"]["usd_per_gpu_h"]
    a = {o["name"]: o["monthly_usd"] for o in base["options"]}
    b = {o["name"]: o["monthly_usd"] for o in paid["options"]}
    # self-hosting: 20 engineering hours a month at $100; the API: 2
    assert b["on-demand"][1] - a["on-demand"][1] == pytest.approx(2000, rel=1e-3)
    api = next(n for n in a if n.startswith("API "))
    assert b[api][1] - a[api][1] == pytest.approx(200, rel=1e-3)
    # training is paid in month 1 only (no --train-every-months)
    assert b["on-demand"][0] - a["on-demand"][0] == pytest.approx(2000 + train_usd, rel=1e-3)


def test_tco_bad_load_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_error(capsys, "tco", LLAMA8, "--input-len", "10", "--output-len", "10")
    assert "--rate R or --requests-per-day N" in err
    # a method frugal has no step for is named by its own flag, with or without training
    load = ("--rate", "5", "--input-len", "100", "--output-len", "50")
    for extra in ((), ("--train-tokens", "1M")):
        err = run_error(capsys, "tco", LLAMA8, *load, "--train-method", "dora", *extra)
        assert err.startswith("error: --train-method 'dora': give full, lora, qlora")


def test_short_horizons_and_the_api_cheapest_for_this_workload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(capsys, "tco", LLAMA8, *LOAD, "--months", "2", "--json")
    assert len(out["cheapest_by_month"]) == 2
    from frugal.cli.main import main

    assert main(["tco", LLAMA8, *LOAD, "--months", "1"]) == 0  # the table fits one month
    capsys.readouterr()
    # long prompts, short answers: the API with the cheapest input wins, not the cheapest sum
    mix = ["tco", "mistralai/Mixtral-8x7B-v0.1", "--rate", "1", "--input-len", "10000",
           "--output-len", "100", "--json"]  # fmt: skip
    api = next(o for o in run_json(capsys, *mix)["options"] if o["name"].startswith("API "))
    from frugal.serve.prices import api_prices

    rows = api_prices("mistralai/Mixtral-8x7B-v0.1")
    best = min(rows, key=lambda a: a.cost_usd(10000, 100))
    assert api["name"] == f"API {best.provider}"
