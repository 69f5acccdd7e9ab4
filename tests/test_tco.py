"""The N-month total cost of ownership: hand-computed months, crossovers, break-even with the
cheapest API, and inputs that cannot be right."""

from __future__ import annotations

import json

import pytest

from frugal.errors import FrugalError
from frugal.serve.tco import Api, Hourly, Owned, Training, Workload, month_usd, tco


def test_hand_computed_months() -> None:
    w = Workload(
        months=3,
        replicas=2,
        hours_per_month=365,
        input_mtok_per_month=100,
        output_mtok_per_month=20,
        engineering_usd_h=100,
    )
    on_demand = Hourly("on-demand", 1.0, engineering_h_month=10)
    reserved = Hourly(
        "reserved", 0.6, always_on=True, term_months=12, upfront_usd=500, engineering_h_month=10
    )
    api = Api("api", input_usd_per_mtok=0.02, output_usd_per_mtok=0.05)
    own = Owned(
        "own",
        purchase_usd_per_gpu=1800,
        watts_per_gpu=500,
        kwh_usd=0.2,
        amortize_years=3,
        utilization=0.5,
    )
    result = tco(w, [on_demand, reserved, api, own])
    by = {o.name: o for o in result.options}
    # 2 replicas x $1 x 365 h + 10 h x $100 engineering
    assert by["on-demand"].monthly_usd == pytest.approx((1730, 1730, 1730))
    # a commitment bills all 730 h; the upfront lands in month 1; 9 months stay owed
    assert by["reserved"].monthly_usd == pytest.approx((2376, 1876, 1876))
    assert by["reserved"].commitment_left_usd == pytest.approx(9 * 2 * 0.6 * 730)
    # 100 M input x $0.02 + 20 M output x $0.05
    assert by["api"].monthly_usd == pytest.approx((3, 3, 3))
    # 2 GPUs x $1800 / 36 months + 2 x 0.5 kW x $0.2 x 365 h x 0.5 busy
    assert by["own"].monthly_usd == pytest.approx((136.5, 136.5, 136.5))
    assert by["own"].cumulative_usd == pytest.approx((136.5, 273, 409.5))
    assert result.cheapest_by_month == ("api", "api", "api")
    assert result.cheapest_total == "api"
    out = json.loads(json.dumps(result.to_json()))
    assert out["options"][0]["monthly_usd"] == [1730, 1730, 1730]
    assert out["options"][1]["total_usd"] == 2376 + 2 * 1876
    assert out["cheapest_total"] == "api"


def test_owned_cash_view_and_resale() -> None:
    w = Workload(months=13)
    buy = Owned(
        "buy", 3000, watts_per_gpu=0, kwh_usd=0, amortize_years=1, resale_fraction=0.2, upfront=True
    )
    assert [month_usd(buy, w, m) for m in (1, 2, 12, 13)] == [3000, 0, -600, 0]
    spread = Owned("spread", 3000, 0, 0, amortize_years=1, resale_fraction=0.2)
    assert [month_usd(spread, w, m) for m in (1, 12, 13)] == [200, 200, 0]


def test_crossover_month_when_buying_passes_renting() -> None:
    w = Workload(months=12, replicas=1, hours_per_month=500)
    rent = Hourly("rent", usd_per_replica_h=1.0)  # $500 a month
    buy = Owned("buy", purchase_usd_per_gpu=3000, watts_per_gpu=0, kwh_usd=0, upfront=True)
    result = tco(w, [rent, buy])
    # equal at month 6 ($3000 each); from month 7 buying has cost less in total
    assert [(c.month, c.cheaper, c.dearer) for c in result.crossovers] == [(7, "buy", "rent")]
    assert result.cheapest_by_month[0] == "rent" and result.cheapest_by_month[1:] == ("buy",) * 11
    assert result.cheapest_total == "buy"


def test_training_every_k_months_and_on_own_gpus() -> None:
    w = Workload(months=6, replicas=0, training=Training(10, usd_per_gpu_h=2, every_months=2))
    rent = Hourly("rent", 1.0)
    assert [month_usd(rent, w, m) for m in range(1, 7)] == [20, 0, 20, 0, 20, 0]
    here = Owned("here", 0, watts_per_gpu=500, kwh_usd=0.2, trains_here=True)
    assert month_usd(here, w, 1) == pytest.approx(10 * 0.5 * 0.2)
    once = Workload(months=3, replicas=0, training=Training(10, 2))
    assert [month_usd(rent, once, m) for m in (1, 2, 3)] == [20, 0, 0]


def test_breakeven_utilization_with_the_cheapest_api() -> None:
    w = Workload(months=1, replicas=1, output_mtok_per_month=50, output_tokens_per_s=100)
    own = Owned("own", purchase_usd_per_gpu=3600, watts_per_gpu=1000, kwh_usd=0.10)
    cheap = Api("cheap", input_usd_per_mtok=0.0, output_usd_per_mtok=1.0)
    dear = Api("dear", input_usd_per_mtok=0.0, output_usd_per_mtok=3.0)
    (be,) = tco(w, [own, dear, cheap]).breakeven
    # capacity 100 tok/s x 3600 x 730 = 262.8 M a month; own = 100 + 73 u, API = 262.8 u
    assert be.api == "cheap"
    assert be.utilization == pytest.approx(100 / (262.8 - 73))
    assert be.output_mtok_per_month == pytest.approx(262.8 * 100 / 189.8)
    assert "utilization" in be.reason
    # at that load both cost the same
    u, tokens = be.utilization, be.output_mtok_per_month
    assert u is not None and tokens is not None
    assert 100 + 73 * u == pytest.approx(1.0 * tokens)


def test_breakeven_prices_input_at_the_workload_ratio_and_reports_never() -> None:
    w = Workload(
        replicas=1, input_mtok_per_month=100, output_mtok_per_month=50, output_tokens_per_s=100
    )
    api = Api("api", input_usd_per_mtok=0.5, output_usd_per_mtok=1.0)  # $2 per M output
    rent = Hourly("rent", 1.0)  # $730 a month whatever the load
    (be,) = tco(w, [rent, api]).breakeven
    assert be.utilization == pytest.approx(730 / (2 * 262.8))
    assert be.input_mtok_per_month == pytest.approx(2 * 730 / 2)
    pricey = Hourly("pricey", 10.0)
    (far,) = tco(w, [pricey, api]).breakeven
    assert far.utilization is not None and far.utilization > 1 and "stays cheaper" in far.reason
    hot = Owned("hot", 0, watts_per_gpu=100_000, kwh_usd=1.0)  # power alone beats the API
    (never,) = tco(w, [hot, api]).breakeven
    assert never.utilization is None and never.reason.startswith("never")
    no_tps = Workload(output_mtok_per_month=10)
    (tokens_only,) = tco(no_tps, [rent, api]).breakeven
    assert tokens_only.utilization is None
    assert tokens_only.output_mtok_per_month == pytest.approx(730 / 1.0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Training(gpu_hours=-5, usd_per_gpu_h=2), r"training: gpu_hours = -5; give"),
        (lambda: Hourly("od", -1.0), r"option 'od': usd_per_replica_h = -1.0; give"),
        (lambda: Workload(hours_per_month=800), r"hours_per_month = 800; give the hours"),
        (lambda: Workload(months=0), r"months = 0; give 1 or more"),
        (lambda: Owned("own", 1000, 300, 0.2, utilization=1.2), r"utilization = 1.2; give the"),
        (lambda: Owned("own", 1000, 300, 0.2, amortize_years=0), r"amortize_years = 0; give"),
        (lambda: Api("api", 0.1, 0.2, batch_discount=1.5), r"batch_discount = 1.5; give"),
        (lambda: tco(Workload(), []), r"no options to compare"),
        (lambda: tco(Workload(), [Hourly("a", 1), Hourly("a", 2)]), r"own name"),
    ],
)
def test_bad_inputs_raise_one_line_naming_the_fix(make: object, match: str) -> None:
    with pytest.raises(FrugalError, match=match) as err:
        make()  # type: ignore[operator]
    assert "\n" not in str(err.value)
