"""Data movement: where data lives, its size, and the dollars and hours of moving it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from frugal.errors import FrugalError
from frugal.hardware.catalog import local_offer
from frugal.hardware.offers import KWH_USD, Offer, bundled_offers, providers
from frugal.plan.transfer import (
    DOWNLOAD_GBPS,
    UPLOAD_GBPS,
    DataSource,
    measure_gb,
    move_in,
    move_out,
    parse_location,
)


def _offer(provider: str, region: str) -> Offer:
    return replace(bundled_offers()[0], provider=provider, region=region)


def test_every_provider_has_a_sourced_interregion_price() -> None:
    for p in providers().values():
        assert 0 <= p.interregion_usd_gb <= p.egress_usd_gb  # never dearer than the internet
        assert p.interregion_usd_gb == 0 or "region" in p.source
    # the sourced list prices, pinned once (US / same-continent pairs)
    assert {n: providers()[n].interregion_usd_gb for n in ("aws", "gcp", "azure")} == {
        "aws": 0.02,
        "gcp": 0.02,
        "azure": 0.02,
    }
    assert providers()["local"].interregion_usd_gb == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("local", DataSource("local")),
        (" Local ", DataSource("local")),
        ("hub", DataSource("hub")),
        ("https://example.org/data.jsonl", DataSource("hub")),
        ("aws:us-east-1", DataSource("cloud", "aws", "us-east-1")),
        ("GCP:us-central1", DataSource("cloud", "gcp", "us-central1")),
        ("local:here", DataSource("local")),
    ],
)
def test_parse_location(text: str, expected: DataSource) -> None:
    got = parse_location(text)
    assert got == expected
    assert parse_location(str(got)) == got  # str() writes the form it reads


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("s3://bucket/data", "does not say its region"),
        ("gs://bucket", "does not say its region"),
        ("aws", "PROVIDER:REGION"),
        ("aws:", "PROVIDER:REGION"),
        ("", "PROVIDER:REGION"),
        ("amazon:us-east-1", "unknown provider 'amazon'"),
    ],
)
def test_parse_location_errors_name_the_forms(text: str, says: str) -> None:
    with pytest.raises(FrugalError, match=says) as err:
        parse_location(text)
    assert "local" in str(err.value) and "hub" in str(err.value)


def test_measure_gb_of_a_file_and_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"y" * 2500)
    assert measure_gb(str(tmp_path / "a.jsonl")) == pytest.approx(1000 / 1e9)
    assert measure_gb(str(tmp_path)) == pytest.approx(3500 / 1e9)
    with pytest.raises(FrugalError, match=r"nowhere\.jsonl not found"):
        measure_gb(str(tmp_path / "nowhere.jsonl"))


def test_move_in_same_region_is_free_at_cloud_speed() -> None:
    m = move_in(parse_location("aws:us-east-1"), 12.0, _offer("aws", "us-east-1"))
    assert m.usd == 0.0
    assert m.hours == pytest.approx(12.0 / DOWNLOAD_GBPS / 3600)
    assert "12.0 GB from aws us-east-1 to aws us-east-1: free" in m.reason


def test_move_in_cross_region_pays_interregion() -> None:
    rate = providers()["aws"].interregion_usd_gb
    m = move_in(parse_location("aws:us-west-2"), 12.0, _offer("aws", "us-east-1"))
    assert m.usd == pytest.approx(12.0 * rate)  # $0.24 at $0.02/GB
    assert m.hours == pytest.approx(12.0 / DOWNLOAD_GBPS / 3600)
    assert f"${12.0 * rate:.2f}" in m.reason and f"${rate:g}/GB" in m.reason


def test_move_in_cross_provider_pays_the_source_egress() -> None:
    rate = providers()["aws"].egress_usd_gb
    m = move_in(parse_location("aws:us-east-1"), 12.0, _offer("gcp", "us-central1"))
    assert m.usd == pytest.approx(12.0 * rate)  # $1.08 at $0.09/GB; gcp ingress is free
    assert m.reason.startswith("dataset 12.0 GB from aws us-east-1 to gcp us-central1: $1.08")
    assert "egress" in m.reason
    # your own GPU pulling from a cloud bucket pays that cloud's egress, over your link
    own = local_offer("RTX 4090", KWH_USD)
    m = move_in(parse_location("gcp:us-central1"), 12.0, own)
    assert m.usd == pytest.approx(12.0 * providers()["gcp"].egress_usd_gb)
    assert m.hours == pytest.approx(12.0 / UPLOAD_GBPS / 3600)


def test_move_in_local_upload_is_free_but_slow() -> None:
    m = move_in(parse_location("local"), 12.0, _offer("aws", "us-east-1"))
    assert m.usd == 0.0
    assert m.hours == pytest.approx(12.0 / UPLOAD_GBPS / 3600)  # 4 min at 0.05 GB/s
    assert "4 min" in m.reason
    fast = move_in(parse_location("local"), 12.0, _offer("aws", "us-east-1"), upload_gbps=0.5)
    assert fast.hours == pytest.approx(m.hours / 10)
    own = local_offer("RTX 4090", KWH_USD)
    assert move_in(parse_location("local"), 12.0, own).hours == 0.0


def test_move_in_from_the_hub_is_free_at_download_speed() -> None:
    m = move_in(parse_location("hub"), 90.0, _offer("azure", "eastus"))
    assert m.usd == 0.0
    assert m.hours == pytest.approx(90.0 / DOWNLOAD_GBPS / 3600)  # 3 min at 0.5 GB/s
    assert "from the hub" in m.reason


def test_move_out_back_to_the_data() -> None:
    gcp = _offer("gcp", "us-central1")
    same = move_out(0.5, gcp, parse_location("gcp:us-central1"))
    assert same.usd == 0.0
    other_region = move_out(0.5, gcp, parse_location("gcp:us-east1"))
    assert other_region.usd == pytest.approx(0.5 * providers()["gcp"].interregion_usd_gb)
    other_cloud = move_out(0.5, gcp, parse_location("aws:us-east-1"))
    assert other_cloud.usd == pytest.approx(0.5 * providers()["gcp"].egress_usd_gb)
    home = move_out(0.5, gcp, parse_location("local"))
    assert home.usd == pytest.approx(0.5 * providers()["gcp"].egress_usd_gb)
    assert home.hours == pytest.approx(0.5 / UPLOAD_GBPS / 3600)
    assert home.reason.startswith("results 0.5 GB from gcp us-central1 to your machine")
    # a provider that bills no egress (Lambda) sends results anywhere for free
    assert move_out(0.5, _offer("lambda", "us-east-1"), parse_location("aws:us-east-1")).usd == 0
    # from your own GPU: your upload, free
    own = local_offer("RTX 4090", KWH_USD)
    assert move_out(0.5, own, parse_location("aws:us-east-1")).usd == 0.0
    with pytest.raises(FrugalError, match="size"):
        move_out(-1.0, gcp, parse_location("local"))
