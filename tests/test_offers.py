"""The offer catalog: bundled rows, user price files, SkyPilot import, discounts, local."""

from __future__ import annotations

from pathlib import Path

import pytest

from frugal.errors import FrugalError
from frugal.hardware.catalog import catalog, local_offer, select_offers
from frugal.hardware.gpus import find_gpu, gpus, lookup_gpu
from frugal.hardware.offers import bundled_offers, providers
from frugal.hardware.price_files import read_price_file

HEADER = "provider,instance,gpu,gpus,ondemand_usd_h,spot_usd_h,region\n"


def test_bundled_catalogs_are_complete() -> None:
    assert len(gpus()) >= 15
    for g in gpus():
        assert g.usable_gib > 0 and g.bandwidth_gbps > 0 and g.tdp_w > 0
        assert g.link in ("nvlink", "pcie")
    offers = bundled_offers()
    # the broad catalog the plans price from: every provider, every GPU with specs
    assert len(offers) >= 500 and len({o.provider for o in offers}) >= 12
    assert {"aws", "gcp", "azure", "lambda", "runpod", "vast", "nebius", "oci"} <= {
        o.provider for o in offers
    }
    assert {"B200", "H200", "H100 SXM", "MI300X"} <= {o.gpu.name for o in offers}
    for o in offers:
        assert o.ondemand_usd_h > 0 and o.gpus >= 1 and o.retrieved
        assert o.spot_usd_h is None or o.spot_usd_h < o.ondemand_usd_h
        # the catalog commit it came from, or the dated price page (Modal's)
        assert "@" in o.source or (o.provider == "modal" and "modal.com/pricing" in o.source)
    for p in providers().values():
        assert p.source
    for g in {o.gpu for o in offers}:  # every GPU priced has sourced specs
        assert g.source and g.memory_gb > 0 and (g.bf16_tflops or g.fp16_tflops)


def test_gcp_rows_are_host_plus_gpu() -> None:
    a3 = next(
        o for o in bundled_offers() if o.instance == "a3-highgpu-1g" and o.region == "us-central1"
    )
    # skypilot-catalog v8 gcp/vms.csv @006059e, us-central1: host a3-highgpu-1g + H100 x1
    assert a3.ondemand_usd_h == pytest.approx(1.18251 + 4.20076)


def test_forgiving_gpu_names() -> None:
    for name in ("l40s", "RTX 4090", "rtx4090", "rtx-4090", "h100-sxm"):
        find_gpu(name)
    with pytest.raises(FrugalError, match="closest"):
        find_gpu("rtx 9090")


@pytest.mark.parametrize(
    ("device", "ours"),
    [  # what torch.cuda.get_device_name() reports on each card
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100 16GB"),
        ("Tesla V100-SXM2-32GB", "V100 32GB"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA GeForce RTX 4050 Laptop GPU", "RTX 4050 Laptop"),
    ],
)
def test_cuda_device_names_find_their_gpu(device: str, ours: str) -> None:
    """The trainer looks up the card it runs on by this name (predicted tokens/s)."""
    g = lookup_gpu(device)
    assert g is not None and g.name == ours


def _write(tmp_path: Path, body: str, name: str = "prices.csv") -> str:
    p = tmp_path / name
    p.write_text(body)
    return str(p)


def test_user_prices_merge_and_replace(tmp_path: Path) -> None:
    f = _write(
        tmp_path, HEADER + "aws,g5.xlarge,A10G,1,0.5,,us-east-1\nlambda,my-box,l40s,2,1.0,,x\n"
    )
    offers = catalog([f])
    g5 = [o for o in offers if o.instance == "g5.xlarge" and o.region == "us-east-1"]
    assert len(g5) == 1 and g5[0].ondemand_usd_h == 0.5 and g5[0].spot_usd_h is None
    assert any(o.instance == "my-box" and o.gpus == 2 for o in offers)


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("aws,x,A10G,1,-1,,r", "ondemand_usd_h"),
        ("aws,x,A10G,1,cheap,,r", "ondemand_usd_h"),
        ("aws,x,A10G,1,,,r", "ondemand_usd_h"),
        ("aws,x,A10G,1,1.0,abc,r", "spot_usd_h"),
        ("aws,x,B9000,1,1.0,,r", "gpu"),
        ("nimbus,x,A10G,1,1.0,,r", "provider"),
        ("aws,x,A10G,two,1.0,,r", "gpus"),
    ],
)
def test_bad_price_rows_name_file_line_and_column(tmp_path: Path, row: str, column: str) -> None:
    f = _write(tmp_path, "# my prices\n" + HEADER + "aws,ok,A10G,1,1.0,,r\n" + row + "\n")
    with pytest.raises(FrugalError) as e:
        read_price_file(f)
    assert f"{f}:4:" in str(e.value) and repr(column) in str(e.value)


def test_missing_columns(tmp_path: Path) -> None:
    f = _write(tmp_path, "provider,gpu,price\naws,A10G,1\n")
    with pytest.raises(FrugalError, match="missing column"):
        read_price_file(f)


def test_skypilot_catalog_import(tmp_path: Path) -> None:
    d = tmp_path / "catalogs" / "v8" / "gcp"
    d.mkdir(parents=True)
    body = (
        "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,"
        "AvailabilityZone,Price,SpotPrice\n"
        "a3-highgpu-1g,26,234,,,,us-central1,us-central1-a,1.0,0.5\n"
        ",,,H100,1,,us-central1,us-central1-a,4.0,2.0\n"
        ",,,L4,0.125,,us-central1,us-central1-a,0.1,0.05\n"
        ",,,A100-80GB,1,,us-central1,us-central1-a,2.0,2.5\n"
    )
    offers = read_price_file(_write(d, body, "vms.csv"))
    h100 = next(o for o in offers if o.gpu.name == "H100 SXM")
    assert h100.instance == "a3-highgpu-1g"
    assert (h100.ondemand_usd_h, h100.spot_usd_h) == (5.0, 2.5)
    assert all(o.gpu.name != "L4" for o in offers)  # fractional GPU skipped
    assert all(o.gpu.name != "A100 80GB" for o in offers)  # no a2-ultragpu host row


def test_discounts_and_local() -> None:
    base = {(o.instance, o.region): o.ondemand_usd_h for o in catalog() if o.provider == "aws"}
    cut = select_offers(discount=["aws=20"], providers_csv="aws")
    assert all(o.ondemand_usd_h == pytest.approx(0.8 * base[(o.instance, o.region)]) for o in cut)
    with pytest.raises(FrugalError, match="PROVIDER=PERCENT"):
        select_offers(discount=["aws"])
    mine = local_offer("2x RTX 4090", 0.20)
    assert mine.gpus == 2 and mine.ondemand_usd_h == pytest.approx((2 * 450 + 150) / 1000 * 0.2)
    assert all(o.provider != "local" for o in select_offers())
    with pytest.raises(FrugalError, match="--local"):
        select_offers(providers_csv="local")
    with pytest.raises(FrugalError, match="closest"):
        select_offers(providers_csv="amazon")
