"""`frugal costs advise`: each rule fires on a synthetic ledger made for it, and stays quiet on one
where its condition does not hold; advice is sorted by the dollars at stake."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import run_error, run_json

from frugal.cli.main import main
from frugal.estimate.core import get_profile
from frugal.estimate.throughput import step_time
from frugal.hardware.gpus import find_gpu
from frugal.hardware.offers import Offer, bundled_offers
from frugal.ledger.advise import Advice, advise_ledger
from frugal.ledger.store import Ledger, now
from frugal.models.specs import ModelSpec
from frugal.step.job import TrainJob

JOB = TrainJob(method="lora", precision="fp32", batch=4, seq=256)


@pytest.fixture(autouse=True)
def no_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimator's own constants, whatever the user's config dir holds."""
    path = tmp_path / "calibration.json"
    path.write_text("{}")
    monkeypatch.setenv("FRUGAL_CALIBRATION", str(path))


def add_run(
    led: Ledger,
    model: str,
    *,
    outcome: str = "completed",
    gpu: str = "A100 80GB",
    gpus: int = 1,
    hours: float = 10.0,
    price: float = 4.0,
    spot: bool = False,
    provider: str = "aws",
    instance: str = "some-instance",
    region: str = "us-east-1",
    actual: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    plan_id: int | None = None,
    dry_run: bool = False,
    days_ago: float = 0.0,
    cost: float | None = None,
) -> str:
    config = {"model": model, "job": JOB.model_dump(mode="json"), "training": training or {}}
    rid = led.start_run(
        model=model,
        method=JOB.method,
        config=config,
        gpu=gpu,
        gpus=gpus,
        price_per_hour_usd=price,
        provider=provider,
        instance=instance,
        region=region,
        spot=spot,
        plan_id=plan_id,
        dry_run=dry_run,
        at=now() - timedelta(days=days_ago),
    )
    usd = hours * price if cost is None else cost
    led.end_run(rid, outcome, actual or {}, step=1000, tokens=1e7, cost_usd=usd, hours=hours)
    return rid


def rules(url: str, period: str = "all") -> dict[str, Advice]:
    return {a.rule: a for a in advise_ledger(Ledger(url), period).advice}


def model_tokens_per_s(spec: ModelSpec, gpu: str) -> float:
    s = step_time(get_profile(spec, JOB, JOB.seq), JOB, find_gpu(gpu))
    assert s is not None
    return s.tokens_per_s


@pytest.mark.parametrize("peak_gib", [6.0, 70.0])
def test_gpu_oversized(ledger_url: str, tiny_llama: ModelSpec, peak_gib: float):
    led = Ledger(ledger_url)
    rid = add_run(led, tiny_llama.id, actual={"peak_reserved_gib": peak_gib})
    got = rules(ledger_url).get("gpu-oversized")
    if peak_gib > 40:  # no GPU with less memory than the A100 80GB holds 70 GiB
        assert got is None
        return
    assert got is not None and got.runs == [rid]
    # today's cheapest A100 80GB for 10 h, less 10 h on a 24 GB card at well under $1/h
    assert 5 < got.usd_at_stake < 13.9
    assert "6.0 GiB" in got.why and "run it on 1x" in got.change


@pytest.mark.parametrize("share", [0.3, 0.95])
def test_low_utilisation(ledger_url: str, tiny_llama: ModelSpec, share: float):
    led = Ledger(ledger_url)
    tps = share * model_tokens_per_s(tiny_llama, "A100 80GB")
    rid = add_run(led, tiny_llama.id, actual={"tokens_per_s": tps})
    got = rules(ledger_url).get("low-utilisation")
    if share > 0.6:
        assert got is None
        return
    assert got is not None and got.runs == [rid]
    assert got.usd_at_stake == pytest.approx(40 * 0.7, rel=1e-3)
    assert "30%" in got.why


@pytest.mark.parametrize(("spot", "hours"), [(False, 10.0), (True, 10.0), (False, 30.0)])
def test_spot(ledger_url: str, tiny_llama: ModelSpec, spot: bool, hours: float):
    led = Ledger(ledger_url)
    rid = add_run(
        led, tiny_llama.id, gpu="A10G", instance="g5.xlarge", price=1.006, spot=spot, hours=hours
    )
    got = rules(ledger_url).get("spot")
    if spot or hours > 24:  # already spot; too long to move blindly
        assert got is None
        return
    assert got is not None and got.runs == [rid]
    # the same instance on spot in its region, as the catalog prices it, 10% for work redone
    best = next(o for o in bundled_offers() if (o.instance, o.region) == ("g5.xlarge", "us-east-1"))
    assert best.spot_usd_h is not None
    assert got.usd_at_stake == pytest.approx(10 * (1.006 - 1.1 * best.spot_usd_h), rel=1e-3)
    assert f"{best.instance} {best.region}" in got.change


@pytest.mark.parametrize("patience", [None, 3])
def test_early_stopping(ledger_url: str, tiny_llama: ModelSpec, patience: int | None):
    led = Ledger(ledger_url)
    training = {"eval_every": 50, "early_stopping_patience": patience}
    rid = add_run(
        led,
        tiny_llama.id,
        hours=10,
        price=5.0,
        training=training,
        actual={"best_step": 200, "steps": 1000},
    )
    add_run(
        led,
        tiny_llama.id,
        training={"eval_every": 50},  # its best came at the end
        actual={"best_step": 950, "steps": 1000},
    )
    got = rules(ledger_url).get("early-stopping")
    if patience:
        assert got is None
        return
    assert got is not None and got.runs == [rid]
    assert got.usd_at_stake == pytest.approx(50 * 800 / 1000)
    assert "early_stopping_patience: 2" in got.change and "step 300" in got.change


def _cheapest_h100() -> Offer:
    return min(
        (o for o in bundled_offers() if o.gpu.name == "H100 SXM" and o.gpus == 1),
        key=lambda o: o.ondemand_usd_h,
    )


@pytest.mark.parametrize("cheapest", [False, True])
def test_cheaper_offer(ledger_url: str, tiny_llama: ModelSpec, cheapest: bool):
    best = _cheapest_h100()
    provider, instance, price = (
        (best.provider, best.instance, best.ondemand_usd_h)
        if cheapest
        else ("aws", "p5.4xlarge", 6.88)
    )
    led = Ledger(ledger_url)
    plan = {
        "method": "lora",
        "provider": provider,
        "instance": instance,
        "region": "x",
        "gpu": "H100 SXM",
        "gpus": 1,
        "spot": False,
        "price_per_hour_usd": price,
        "est_hours": 10.0,
        "est_cost_usd": 10 * price,
    }
    pid = led.record_plan(plan, tiny_llama.id, 1e7)
    rid = add_run(
        led,
        tiny_llama.id,
        gpu="H100 SXM",
        price=price,
        plan_id=pid,
        provider=provider,
        instance=instance,
    )
    got = rules(ledger_url).get("cheaper-offer")
    if cheapest:  # the cheapest 1x H100 SXM today already
        assert got is None
        return
    assert got is not None and got.plans == [pid] and got.runs == [rid]
    assert got.usd_at_stake == pytest.approx(10 * (6.88 - best.ondemand_usd_h))
    assert f"{best.provider} {best.instance}" in got.change


@pytest.mark.parametrize("failed_usd", [20.0, 1.0])
def test_failures(ledger_url: str, tiny_llama: ModelSpec, failed_usd: float):
    led = Ledger(ledger_url)
    add_run(led, tiny_llama.id, cost=100.0)
    lost = [
        add_run(led, tiny_llama.id, outcome="failed", cost=failed_usd),
        add_run(led, tiny_llama.id, outcome="preempted", cost=failed_usd),
    ]
    add_run(led, tiny_llama.id, outcome="failed", cost=500.0, dry_run=True)  # not spend
    got = rules(ledger_url).get("failures")
    if failed_usd < 5:  # 2% of the spend
        assert got is None
        return
    assert got is not None and sorted(got.runs) == sorted(lost)
    assert got.usd_at_stake == 40.0
    assert "29% of $140.00: 1 failed, 1 preempted" in got.why


def test_advice_is_sorted_by_dollars_and_printed(
    tmp_path: Path,
    tiny_llama: ModelSpec,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    led = Ledger(url)
    add_run(led, tiny_llama.id, gpu="A10G", instance="g5.xlarge", price=1.006)  # spot, ~$5
    add_run(led, tiny_llama.id, outcome="failed", cost=30.0)  # failures, $30
    add_run(led, tiny_llama.id, outcome="failed", cost=25.0, days_ago=60)  # outside 30d
    add_run(
        led, tiny_llama.id, training={"eval_every": 10}, actual={"best_step": 100, "steps": 1000}
    )  # early stopping, $36
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    out = run_json(capsys, "costs", "advise", "--json")
    usd = [a["usd_at_stake"] for a in out["advice"]]
    assert usd == sorted(usd, reverse=True) and len(usd) == 3
    assert [a["rule"] for a in out["advice"]] == ["failures", "early-stopping", "spot"]
    assert out["advice"][0]["usd_at_stake"] == 55.0
    assert set(out["advice"][0]) == {"rule", "usd_at_stake", "change", "why", "runs", "plans"}
    recent = run_json(capsys, "costs", "advise", "--period", "30d", "--json")
    assert recent["runs"] == 3 and recent["since"] is not None
    assert next(a for a in recent["advice"] if a["rule"] == "failures")["usd_at_stake"] == 30.0
    assert main(["costs", "advise"]) == 0
    text = capsys.readouterr().out
    assert "largest first" in text and "$55.00" in text
    assert "--period 'fortnight'" in run_error(capsys, "costs", "advise", "--period", "fortnight")


def test_an_empty_ledger_has_no_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("FRUGAL_DB_URL", f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    assert run_json(capsys, "costs", "advise", "--json")["advice"] == []
    assert main(["costs", "advise", "--period", "this-month"]) == 0
    assert "no advice" in capsys.readouterr().out
