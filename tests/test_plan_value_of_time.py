"""`frugal plan --value-of-time`: waiting hours weighed against dollars.

A model of eight Llama-2-7B-wide layers (a small vocabulary; simulated once, no weights)
is slow on one RTX 4090 and several times faster on a cloud H100, so the local GPU is the
cheapest in dollars and the slowest: the case the option is for.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import run_error, run_json, write_config
from pydantic import ValidationError

from frugal.cli.main import main
from frugal.errors import FrugalError
from frugal.plan.constraints import Constraints

WIDE = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 8,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
}


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("wide-llama"), WIDE)


def _plan(capsys: pytest.CaptureFixture[str], model: Path, *extra: str) -> dict[str, Any]:
    # the step's memory techniques pinned off: the value of time is the point
    return run_json(capsys, "plan", str(model), "--tokens", "1G", "--local", "RTX 4090",
                    "--loss-chunks", "0", "--no-offload-activations", *extra, "--json")  # fmt: skip


def _frontier(out: dict[str, Any]) -> list[tuple[Any, ...]]:
    keys = ("provider", "instance", "nodes", "spot", "method", "est_hours", "est_cost_usd")
    return [tuple(p[k] for k in keys) for p in out["frontier"]]


def test_value_zero_picks_the_cheapest_in_dollars(
    capsys: pytest.CaptureFixture[str], wide_dir: Path
) -> None:
    out = _plan(capsys, wide_dir)
    rec = out["recommendation"]
    assert rec["provider"] == "local" and rec["gpu"] == "RTX 4090"
    assert rec["est_cost_usd"] == min(p["est_cost_usd"] for p in out["frontier"])
    for p in [rec, *out["frontier"]]:  # time not valued: no weighed figures
        assert "time_value_usd" not in p and "weighed_cost_usd" not in p
    assert any(r.startswith("cheapest of ") for r in rec["reasons"])
    assert not any("weighed" in r for r in rec["reasons"])
    # an explicit 0 is the same plan
    assert _plan(capsys, wide_dir, "--value-of-time", "0")["recommendation"] == rec


def test_a_high_value_of_time_picks_a_faster_plan(
    capsys: pytest.CaptureFixture[str], wide_dir: Path
) -> None:
    cheap = _plan(capsys, wide_dir)
    out = _plan(capsys, wide_dir, "--value-of-time", "50")
    rec, local = out["recommendation"], cheap["recommendation"]
    assert rec["provider"] != "local"
    assert rec["est_hours"] < local["est_hours"] and rec["est_cost_usd"] > local["est_cost_usd"]
    # the weighed cost: dollars plus the plan's hours (setup and spot losses included) x $50
    for p in [rec, *out["frontier"]]:
        assert p["time_value_usd"] == pytest.approx(50 * p["est_hours"], abs=0.03)
        assert p["weighed_cost_usd"] == pytest.approx(
            p["est_cost_usd"] + p["time_value_usd"], abs=0.011
        )
    assert rec["weighed_cost_usd"] == min(p["weighed_cost_usd"] for p in out["frontier"])
    assert rec["weighed_cost_usd"] < local["est_cost_usd"] + 50 * local["est_hours"]
    # the frontier is of dollars against hours: the value of time does not change it
    assert _frontier(out) == _frontier(cheap)


def test_the_reasons_say_what_time_value_changed(
    capsys: pytest.CaptureFixture[str], wide_dir: Path
) -> None:
    local = _plan(capsys, wide_dir)["recommendation"]
    rec = _plan(capsys, wide_dir, "--value-of-time", "50")["recommendation"]
    reasons = "\n".join(rec["reasons"])
    usd, h = f"${rec['est_cost_usd']:,.2f}", f"{rec['est_hours']:.2f} h"
    assert f"with time at $50/h: {usd} + {h} x $50 = ${rec['weighed_cost_usd']:,.2f}" in reasons
    m = re.search(
        r"time value changed the choice: the cheapest in dollars, local your 1x RTX 4090 "
        r"lora, costs \$([\d,.]+) but takes ([\d.]+) h \(\$([\d,.]+) weighed\); this plan "
        r"spends \$([\d,.]+) more to finish ([\d.]+) h sooner, worth \$([\d,.]+) at \$50/h",
        reasons,
    )
    assert m, reasons
    cost, hours, _, more, sooner, worth = (float(g.replace(",", "")) for g in m.groups())
    assert cost == pytest.approx(local["est_cost_usd"], abs=0.01)
    assert hours == pytest.approx(local["est_hours"], abs=0.05)
    assert more == pytest.approx(rec["est_cost_usd"] - local["est_cost_usd"], abs=0.02)
    assert sooner == pytest.approx(local["est_hours"] - rec["est_hours"], abs=0.06)
    assert worth == pytest.approx(50 * (local["est_hours"] - rec["est_hours"]), abs=0.5)
    assert "cheapest of " not in reasons  # it is not the cheapest in dollars


def test_a_small_value_keeps_the_cheapest_and_says_so(
    capsys: pytest.CaptureFixture[str], wide_dir: Path
) -> None:
    rec = _plan(capsys, wide_dir, "--value-of-time", "0.01")["recommendation"]
    assert rec["provider"] == "local"
    reasons = "\n".join(rec["reasons"])
    assert "lowest weighed cost of " in reasons and "with time at $0.01/h" in reasons
    assert "time value changed the choice" not in reasons


def test_optimize_time_ignores_the_value_of_time(
    capsys: pytest.CaptureFixture[str], wide_dir: Path
) -> None:
    fastest = _plan(capsys, wide_dir, "--optimize", "time")["recommendation"]
    valued = _plan(capsys, wide_dir, "--optimize", "time", "--value-of-time", "50")
    rec = valued["recommendation"]
    assert (rec["provider"], rec["instance"], rec["est_hours"]) == (
        fastest["provider"],
        fastest["instance"],
        fastest["est_hours"],
    )
    assert "weighed_cost_usd" in rec  # still reported


def test_the_table_shows_the_weighed_cost(
    capsys: pytest.CaptureFixture[str], wide_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["plan", str(wide_dir), "--tokens", "1G", "--local", "RTX 4090"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert "weighed" not in plain
    assert main([*argv, "--value-of-time", "50"]) == 0
    text = capsys.readouterr().out
    assert "with time at $50/h)" in text
    assert "weighed = cost + hours x $50" in text
    header = next(ln for ln in text.splitlines() if " plan " in ln and "hours" in ln)
    assert re.search(r"hours\s*┃\s*cost\s*┃\s*weighed\s*┃\s*tokens/s", header), header


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("-5", "'--value-of-time': -5: give a number of 0 or more"),
        ("-0.01", "'--value-of-time': -0.01: give a number of 0 or more"),
        ("nan", "'--value-of-time': nan: give a number of 0 or more"),
        ("inf", "'--value-of-time': inf: give a number of 0 or more"),
        ("lots", "'--value-of-time'"),
    ],
)
def test_a_bad_value_of_time_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path, value: str, why: str
) -> None:
    msg = run_error(capsys, "plan", str(tiny_llama_dir), "--tokens", "1M",
                    "--value-of-time", value)  # fmt: skip
    assert why in msg, msg


def test_constraints_validate_the_value_of_time() -> None:
    with pytest.raises(FrugalError) as e:
        Constraints.build(tokens=1e6, value_of_time_usd_h=-1)
    assert str(e.value) == "--value-of-time -1: give a number of 0 or more"
    with pytest.raises(ValidationError):  # a library caller that skips build()
        Constraints(tokens=1e6, value_of_time_usd_h=-1)
    assert Constraints(tokens=1e6).value_of_time_usd_h == 0
