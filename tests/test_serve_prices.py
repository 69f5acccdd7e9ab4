"""Serving prices: the four bundled data files, model matching, platform rates, commitments
and purchase prices; bad rows name their file, line and column."""

from __future__ import annotations

import re

import pytest

from frugal.errors import FrugalError
from frugal.hardware.gpus import lookup_gpu
from frugal.serve import prices
from frugal.serve.prices import (
    ApiPrice,
    Commitment,
    PlatformRow,
    Purchase,
    api_prices,
    commitments,
    conservative_commitment,
    model_key,
    parse_api_prices,
    parse_commitments,
    parse_hardware,
    parse_platforms,
    platform_rates,
    purchase_price,
)

DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
API_HEADER = (
    "provider,model,api_model,input_usd_per_mtok,output_usd_per_mtok,batch_discount,"
    "cached_input_factor,retrieved,source\n"
)


def _all_records() -> list[ApiPrice | PlatformRow | Commitment | Purchase]:
    return [
        *prices._apis(),
        *prices._platforms(),
        *prices._commitments(),
        *prices._hardware(),
    ]


def test_every_bundled_row_parses_with_source_and_date() -> None:
    assert len(prices._apis()) >= 20
    assert len(prices._platforms()) >= 20
    assert {c.provider for c in prices._commitments()} == {"aws", "gcp", "azure"}
    assert len(prices._hardware()) >= 3
    for rec in _all_records():
        assert rec.source.strip(), rec
        assert DATE.fullmatch(rec.retrieved), rec


def test_api_rows_name_bundled_models_and_sane_prices() -> None:
    for a in prices._apis():
        assert api_prices(a.model), f"{a.model} does not match itself"
        assert 0 < a.input_usd_per_mtok < 10 and 0 < a.output_usd_per_mtok < 10
        assert a.batch_discount is None or 0 < a.batch_discount < 1


def test_pinned_api_figures() -> None:
    by = {(a.provider, model_key(a.model)): a for a in prices._apis()}
    deepinfra = by[("deepinfra", "llama318b")]
    assert (deepinfra.input_usd_per_mtok, deepinfra.output_usd_per_mtok) == (0.02, 0.05)
    turbo = by[("together", "llama3370b")]
    assert turbo.input_usd_per_mtok == 1.04 and "Turbo" in turbo.api_model
    assert turbo.batch_discount == 0.5
    groq = by[("groq", "llama3370b")]
    assert (groq.input_usd_per_mtok, groq.output_usd_per_mtok) == (0.59, 0.79)


def test_instruct_id_matches_the_8b_rows_only() -> None:
    rows = api_prices("meta-llama/Llama-3.1-8B-Instruct")
    assert {a.model for a in rows} == {"meta-llama/Llama-3.1-8B"}
    assert {"together", "deepinfra", "groq", "aws-bedrock", "cerebras"} <= {
        a.provider for a in rows
    }
    # the same architecture spelt other ways; other sizes and versions do not match
    assert len(api_prices("META-LLAMA/Meta-Llama-3.1-8B-Instruct")) == len(rows)
    assert len(api_prices("Llama-3.1-8B")) == len(rows)
    assert not api_prices("meta-llama/Meta-Llama-3-8B")
    assert all(a.model.endswith("3.3-70B-Instruct") for a in api_prices("Llama-3.3-70B"))
    assert api_prices("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert api_prices("no-such/model") == []


def test_api_cost_and_json_units() -> None:
    a = next(a for a in api_prices("Llama-3.1-8B") if a.provider == "together")
    assert a.cost_usd(10, 2) == pytest.approx(10 * 0.18 + 2 * 0.18)
    assert a.cost_usd(10, 2, batch=True) == pytest.approx((10 + 2) * 0.18 * 0.5)
    j = a.to_json()
    assert {"input_usd_per_mtok", "output_usd_per_mtok", "source", "retrieved"} <= set(j)


def test_sagemaker_is_ec2_on_demand_times_the_markup() -> None:
    for instance in ("p5.48xlarge", "ml.p5.48xlarge"):
        sm = [r for r in platform_rates("H100", 8, 98.32, instance) if r.platform == "sagemaker"]
        assert len(sm) == 1
        assert sm[0].usd_h == pytest.approx(98.32 * 1.15) == pytest.approx(113.068)
        assert sm[0].instance == "ml.p5.48xlarge" and sm[0].to_json()["usd_h"] == sm[0].usd_h
    g5 = [r for r in platform_rates("A10G", 1, 1.006, "g5.xlarge") if r.platform == "sagemaker"]
    assert g5[0].usd_h == pytest.approx(1.4084)
    # no on-demand price, or a family without a published markup: no guess
    assert not [
        r for r in platform_rates("H100", 8, None, "p5.48xlarge") if r.platform == "sagemaker"
    ]
    assert not [
        r for r in platform_rates("A100", 8, 27.4, "p4de.24xlarge") if r.platform == "sagemaker"
    ]


def test_hf_endpoints_rate_by_gpu_and_count() -> None:
    hf = {r.provider: r for r in platform_rates("H100", 1) if r.platform == "hf-endpoints"}
    assert hf["aws"].usd_h == 4.5 and hf["aws"].gpus == 1 and hf["aws"].scales_to_zero
    assert hf["gcp"].usd_h == 10
    # three GPUs rent the smallest size that holds them
    a100 = {r.provider: r for r in platform_rates("NVIDIA A100-SXM4-80GB", 3)}
    assert (a100["aws"].gpus, a100["aws"].usd_h) == (4, 10)
    assert platform_rates("RTX 4090", 1) == []  # no platform lists it
    with pytest.raises(FrugalError, match="at least one GPU"):
        platform_rates("H100", 0)


def test_commitments_by_provider_and_conservative_pick() -> None:
    aws = commitments("AWS")
    assert aws and {c.term_months for c in aws} == {12, 36}
    assert all(0 < c.discount < 1 and c.range_end in ("point", "upper") for c in aws)
    assert commitments("nowhere") == []
    gcp = conservative_commitment("gcp", 36)
    assert gcp is not None and gcp.range_end == "point" and gcp.discount == 0.55
    assert gcp.usd_h(2.0) == pytest.approx(0.9)
    aws36 = conservative_commitment("aws", 36)
    assert aws36 is not None and aws36.discount == min(
        c.discount for c in aws if c.term_months == 36
    )
    assert conservative_commitment("aws", 24) is None


def test_purchase_prices() -> None:
    rtx = purchase_price("rtx4090")
    assert rtx is not None and rtx.price_usd == 1599 and rtx.per_gpu_usd == 1599
    h100 = purchase_price("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.gpus == 8 and h100.per_gpu_usd == pytest.approx(39625)
    assert h100.to_json()["per_gpu_usd"] == 39625
    assert purchase_price("T4") is None  # not priced: the TCO takes the user's price
    assert purchase_price("no such gpu") is None
    for p in prices._hardware():
        assert lookup_gpu(p.gpu) is not None and p.range_end in ("point", "upper")


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ("x,meta-llama/Llama-3.1-8B,m,abc,0.1,,,2026-01-01,src", "column 'input_usd_per_mtok'"),
        ("x,meta-llama/Llama-3.1-8B,m,0.1,-1,,,2026-01-01,src", "column 'output_usd_per_mtok'"),
        ("x,meta-llama/Llama-3.1-8B,m,0.1,0.1,1.5,,2026-01-01,src", "column 'batch_discount'"),
        ("x,meta-llama/Llama-3.1-8B,m,0.1,0.1,,,2026-01-01,", "column 'source'"),
        ("x,meta-llama/Llama-3.1-8B,m,0.1,0.1,,,last week,src", "column 'retrieved'"),
    ],
)
def test_bad_api_rows_name_file_line_and_column(row: str, where: str) -> None:
    text = "# a comment line\n" + API_HEADER + row + "\n"
    with pytest.raises(FrugalError, match=rf"^apis\.csv:3: {where}"):
        parse_api_prices(text, "apis.csv")


def test_bad_rows_in_the_other_files() -> None:
    with pytest.raises(FrugalError, match="missing column"):
        parse_api_prices("provider,model\nx,y\n", "apis.csv")
    platforms = (
        "platform,provider,kind,instance,gpu,gpus,usd_h,markup,scales_to_zero,notes,retrieved,"
        "source\nhf,aws,rate,x1,Z9000,1,1,,yes,,2026-01-01,src\n"
    )
    with pytest.raises(FrugalError, match=r"platforms\.csv:2: column 'gpu': unknown GPU"):
        parse_platforms(platforms, "platforms.csv")
    with pytest.raises(FrugalError, match="column 'scales_to_zero'"):
        parse_platforms(platforms.replace("Z9000", "T4").replace("yes", "maybe"), "p.csv")
    commit = (
        "provider,plan,term_months,discount,payment,applies_to,range_end,retrieved,source\n"
        "aws,x,12,1.2,none,all,point,2026-01-01,src\n"
    )
    with pytest.raises(FrugalError, match=r"c\.csv:2: column 'discount'"):
        parse_commitments(commit, "c.csv")
    with pytest.raises(FrugalError, match="column 'term_months'"):
        parse_commitments(commit.replace(",12,1.2,", ",0,0.2,"), "c.csv")
    hw = (
        "gpu,form,gpus,price_usd,price_kind,range_end,price_date,retrieved,source\n"
        "T4,card,1,100,street,point,,2026-01-01,a\nt4,card,1,90,street,point,,2026-01-01,b\n"
    )
    with pytest.raises(FrugalError, match=r"h\.csv:3: column 'gpu': T4 is priced twice"):
        parse_hardware(hw, "h.csv")
