"""The offer catalog: where a GPU can be rented, for how much, and on what terms.

Bundled rows (data/offers.csv, each with its source and date) are merged with the user's
own price files (`--prices FILE`, same columns, or a SkyPilot catalog `vms.csv`), adjusted
by per-provider discounts, and extended with `local` offers (your own GPUs, priced as
electricity). Every price error names the file, line and column to fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path

from frugal.errors import FrugalError
from frugal.hardware.csvdata import data_rows, header
from frugal.hardware.gpus import GPU, find_gpu, gpus, lookup_gpu
from frugal.hardware.skypilot import GCP_HOST, from_skypilot
from frugal.names import closest

BUCKETS = ("<5%", "5-10%", "10-15%", "15-20%", ">20%")
OFFER_COLUMNS = ("provider", "instance", "gpu", "gpus", "ondemand_usd_h", "spot_usd_h", "region")
KWH_USD = 0.17  # US residential average 2024, 16.5 c/kWh (EIA Electric Power Monthly)
HOST_WATTS = 150.0  # CPU, RAM, disks and fans of a one-GPU workstation under load
HOURS_PER_MONTH = 730.0  # 8,760 / 12: what clouds bill a month of (AWS pricing calculator)


@dataclass(frozen=True)
class Provider:
    name: str
    boot_min: float
    storage_usd_gb_month: float
    egress_usd_gb: float
    interregion_usd_gb: float  # $/GB to another region of the same provider
    spot_notice_s: float
    interruption: str  # default bucket of its spot offers ("" = no spot market)
    node_network_gbps: float  # GB/s between nodes; 0 = single-node only
    source: str


@dataclass(frozen=True)
class Offer:
    provider: str
    instance: str
    gpu: GPU
    gpus: int
    ondemand_usd_h: float
    spot_usd_h: float | None
    region: str
    interruption: str
    source: str
    retrieved: str = ""

    @property
    def terms(self) -> Provider:
        return providers()[self.provider]

    def to_json(self) -> dict[str, object]:
        t = self.terms
        return {
            "provider": self.provider,
            "instance": self.instance,
            "gpu": self.gpu.name,
            "gpus": self.gpus,
            "ondemand_usd_h": self.ondemand_usd_h,
            "spot_usd_h": self.spot_usd_h,
            "region": self.region,
            "interruption": self.interruption if self.spot_usd_h is not None else None,
            "boot_min": t.boot_min,
            "storage_usd_gb_month": t.storage_usd_gb_month,
            "egress_usd_gb": t.egress_usd_gb,
            "interregion_usd_gb": t.interregion_usd_gb,
            "source": self.source,
            "retrieved": self.retrieved,
        }


@cache
def providers() -> dict[str, Provider]:
    text = (resources.files("frugal.hardware") / "data" / "providers.csv").read_text()
    out = {}
    for _, r in data_rows(text):
        out[r["provider"]] = Provider(
            name=r["provider"],
            boot_min=float(r["boot_min"]),
            storage_usd_gb_month=float(r["storage_usd_gb_month"]),
            egress_usd_gb=float(r["egress_usd_gb"]),
            interregion_usd_gb=float(r["interregion_usd_gb"]),
            spot_notice_s=float(r["spot_notice_s"]),
            interruption=r["interruption"],
            node_network_gbps=float(r["node_network_gbps"]),
            source=r["source"],
        )
    return out


def find_provider(name: str) -> str:
    key = name.strip().lower()
    if key in providers():
        return key
    hint = closest(name, providers())
    raise FrugalError(f"unknown provider {name!r}; closest: {', '.join(hint or list(providers()))}")


class _Where:
    """Names the file, line and column of a bad value."""

    def __init__(self, file: str, line: int) -> None:
        self.file, self.line = file, line

    def fail(self, column: str, msg: str) -> FrugalError:
        return FrugalError(f"{self.file}:{self.line}: column {column!r}: {msg}")

    def price(self, row: dict[str, str], column: str, required: bool) -> float | None:
        raw = (row.get(column) or "").strip()
        if not raw:
            if required:
                raise self.fail(column, "missing price: give $/hour for the whole instance")
            return None
        try:
            value = float(raw.lstrip("$"))
        except ValueError:
            raise self.fail(column, f"{raw!r} is not a number of $/hour") from None
        if not math.isfinite(value) or value < 0:
            raise self.fail(column, f"{raw!r}: a price must be a number >= 0")
        return value


def parse_offers(text: str, file: str) -> list[Offer]:
    """Offers from frugal's own CSV format (see data/offers.csv)."""
    present = set(header(text, file))
    missing = [c for c in OFFER_COLUMNS if c not in present]
    if missing:
        raise FrugalError(
            f"{file}: missing column(s) {', '.join(missing)}; a price file needs "
            f"{','.join(OFFER_COLUMNS)} (or a SkyPilot catalog vms.csv)"
        )
    out = []
    for lineno, r in data_rows(text, file):
        at = _Where(file, lineno)
        provider = (r["provider"] or "").strip().lower()
        if provider not in providers():
            raise at.fail(
                "provider", f"unknown provider {r['provider']!r}; known: {', '.join(providers())}"
            )
        gpu = lookup_gpu(r["gpu"] or "")
        if gpu is None:
            hint = closest(r["gpu"] or "", [g.name for g in gpus()])
            raise at.fail("gpu", f"unknown GPU {r['gpu']!r}; closest: {', '.join(hint)}")
        try:
            count = int(r["gpus"])
        except (TypeError, ValueError):
            raise at.fail("gpus", f"{r['gpus']!r} is not a whole number of GPUs") from None
        if count < 1:
            raise at.fail("gpus", "a training offer needs at least one whole GPU")
        ondemand = at.price(r, "ondemand_usd_h", required=True)
        assert ondemand is not None
        spot = at.price(r, "spot_usd_h", required=False)
        bucket = (r.get("interruption") or "").strip() or providers()[provider].interruption
        if spot is not None and bucket not in BUCKETS:
            raise at.fail("interruption", f"{bucket!r}: use one of {', '.join(BUCKETS)}")
        out.append(
            Offer(
                provider=provider,
                instance=(r["instance"] or "").strip() or f"{count}x {gpu.name}",
                gpu=gpu,
                gpus=count,
                ondemand_usd_h=ondemand,
                spot_usd_h=spot,
                region=(r["region"] or "").strip(),
                interruption=bucket if spot is not None else "",
                source=(r.get("source") or file).strip(),
                retrieved=(r.get("retrieved") or "").strip(),
            )
        )
    return out


def parse_skypilot(text: str, file: str, cloud: str) -> list[Offer]:
    """Offers from a SkyPilot catalog vms.csv (InstanceType, AcceleratorName, Price, ...).

    GPU-only GCP rows are summed with the host VM their family needs (a2/a3); rows of
    fractional or unknown GPUs and rows without an on-demand price are skipped.
    """
    rows = list(data_rows(text, file))
    hosts: dict[tuple[str, str], tuple[float, float | None]] = {}
    for lineno, r in rows:
        if not (r.get("AcceleratorName") or "").strip() and r.get("InstanceType"):
            at = _Where(file, lineno)
            od = at.price(r, "Price", required=False)
            if od is not None:
                key = (r["InstanceType"], r.get("Region", ""))
                hosts.setdefault(key, (od, at.price(r, "SpotPrice", required=False)))
    out = []
    for lineno, r in rows:
        name = (r.get("AcceleratorName") or "").strip()
        if not name:
            continue
        at = _Where(file, lineno)
        try:
            count_f = float(r.get("AcceleratorCount") or "0")
        except ValueError:
            raise at.fail(
                "AcceleratorCount", f"{r['AcceleratorCount']!r} is not a number"
            ) from None
        if count_f < 1 or count_f != int(count_f):
            continue  # fractional GPUs cannot hold a training job
        count = int(count_f)
        instance = (r.get("InstanceType") or "").strip()
        gpu_name = from_skypilot(name)
        if "pcie" in instance.lower() and name == "H100":
            gpu_name = "H100 PCIe"
        gpu = lookup_gpu(gpu_name)
        od = at.price(r, "Price", required=False)
        if gpu is None or od is None:
            continue
        spot = at.price(r, "SpotPrice", required=False)
        region = (r.get("Region") or "").strip()
        if not instance:  # a GCP GPU-only row: add its host
            family = GCP_HOST.get(gpu.name)
            host = hosts.get((family.format(n=count), region)) if family else None
            if host is None:
                continue
            instance = family.format(n=count) if family else instance
            od += host[0]
            spot = spot + host[1] if spot is not None and host[1] is not None else None
        if spot is not None and spot >= od:
            spot = None  # no discount: not a spot offer worth the risk
        terms = providers().get(cloud)
        out.append(
            Offer(
                provider=cloud,
                instance=instance,
                gpu=gpu,
                gpus=count,
                ondemand_usd_h=od,
                spot_usd_h=spot,
                region=region,
                interruption=(terms.interruption if terms else ">20%") if spot is not None else "",
                source=f"{file} (SkyPilot catalog)",
            )
        )
    return out


def read_price_file(path: str) -> list[Offer]:
    p = Path(path)
    if not p.is_file():
        raise FrugalError(f"price file {path} not found: give a CSV of offers (--prices FILE)")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise FrugalError(f"cannot read price file {path}: {e}") from None
    columns = header(text, path)
    if "AcceleratorName" in columns and "InstanceType" in columns:
        cloud = next((c for c in providers() if c in str(p).lower()), "")
        if not cloud:
            raise FrugalError(
                f"{path}: a SkyPilot catalog, but which cloud? keep the cloud in its path "
                "(e.g. catalogs/v8/aws/vms.csv) or rename it aws-vms.csv"
            )
        return parse_skypilot(text, str(path), cloud)
    return parse_offers(text, str(path))


@cache
def bundled_offers() -> tuple[Offer, ...]:
    text = (resources.files("frugal.hardware") / "data" / "offers.csv").read_text()
    return tuple(parse_offers(text, "offers.csv"))


def local_offer(spec: str, kwh_usd: float) -> Offer:
    """`RTX 4090`, `2x RTX 4090` or `RTX 4090x2`: your own GPUs, priced as electricity."""
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(.+?)\s*", spec) or re.fullmatch(
        r"\s*(.+?)\s*x\s*(\d+)\s*", spec
    )
    if m and m.group(1).isdigit():
        count, name = int(m.group(1)), m.group(2)
    elif m:
        count, name = int(m.group(2)), m.group(1)
    else:
        count, name = 1, spec.strip()
    if count < 1:
        raise FrugalError(f"--local {spec!r}: the GPU count must be at least 1")
    gpu = find_gpu(name)
    watts = gpu.tdp_w * count + HOST_WATTS
    return Offer(
        provider="local",
        instance=f"your {count}x {gpu.name}",
        gpu=gpu,
        gpus=count,
        ondemand_usd_h=round(watts / 1000 * kwh_usd, 4),
        spot_usd_h=None,
        region="here",
        interruption="",
        source=f"{watts:.0f} W x ${kwh_usd}/kWh (board power x GPUs + {HOST_WATTS:.0f} W host)",
    )


def parse_discounts(items: Iterable[str]) -> dict[str, float]:
    """`aws=15` -> {"aws": 0.85}: percent off every price of that provider."""
    out = {}
    for item in items:
        name, sep, pct = item.partition("=")
        try:
            value = float(pct.rstrip("%"))
        except ValueError:
            value = -1.0
        if not sep or not 0 <= value < 100:
            raise FrugalError(f"--discount {item!r}: write PROVIDER=PERCENT, e.g. aws=15")
        out[find_provider(name)] = 1 - value / 100
    return out


def catalog(
    price_files: Iterable[str] = (),
    discounts: dict[str, float] | None = None,
    local: Iterable[str] = (),
    kwh_usd: float = KWH_USD,
    bundled: bool = True,
) -> list[Offer]:
    """All offers: bundled, then each price file's rows, then local GPUs; discounts applied.

    A user row with the same provider, instance and region as a bundled one replaces it.
    """
    merged: dict[tuple[str, str, str], Offer] = {}
    for o in bundled_offers() if bundled else ():
        merged[(o.provider, o.instance, o.region)] = o
    for f in price_files:
        for o in read_price_file(f):
            merged[(o.provider, o.instance, o.region)] = o
    out = list(merged.values())
    out += [local_offer(s, kwh_usd) for s in local]
    for name, factor in (discounts or {}).items():
        out = [
            replace(
                o,
                ondemand_usd_h=o.ondemand_usd_h * factor,
                spot_usd_h=o.spot_usd_h * factor if o.spot_usd_h is not None else None,
            )
            if o.provider == name
            else o
            for o in out
        ]
    return out


def select_offers(
    prices: Iterable[str] = (),
    discount: Iterable[str] = (),
    local: Iterable[str] = (),
    kwh_usd: float = KWH_USD,
    providers_csv: str | None = None,
    gpu: str | None = None,
) -> list[Offer]:
    """The catalog as the CLI options select it (shared by `offers` and `plan`)."""
    if kwh_usd < 0:
        raise FrugalError("--kwh-usd must be >= 0 (your electricity price, $/kWh)")
    out = catalog(prices, parse_discounts(discount), local, kwh_usd)
    if providers_csv:
        keep = {find_provider(p) for p in providers_csv.split(",") if p.strip()}
        if "local" in keep and not list(local):
            raise FrugalError("--providers local needs --local GPU (e.g. --local 'RTX 4090')")
        out = [o for o in out if o.provider in keep]
    elif not list(local):
        out = [o for o in out if o.provider != "local"]
    if gpu:
        g = find_gpu(gpu)
        out = [o for o in out if o.gpu == g]
    return out
