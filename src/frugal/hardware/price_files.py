"""Price files as people give them: a SkyPilot catalog `vms.csv` (the bundled catalog's
source, or one of a user's) or frugal's own offers columns, read into offers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from frugal.csvrows import Cells
from frugal.errors import FrugalError
from frugal.hardware.csvdata import data_rows, header
from frugal.hardware.gpus import lookup_gpu
from frugal.hardware.offers import PER_HOUR, Offer, parse_offers, providers
from frugal.hardware.skypilot import from_skypilot, gcp_host
from frugal.settings import settings_path


@dataclass
class Normalized:
    """A SkyPilot catalog read into offers, with what was left out and why."""

    offers: list[Offer]
    unknown: Counter[str]  # rows of GPUs frugal has no specs for, by catalog name
    no_price: int = 0  # GPU rows without an on-demand price
    fractional: int = 0  # rows of a fraction of a GPU (no training job fits one)

    def summary(self) -> str:
        out = []
        if self.unknown:
            names = ", ".join(f"{n} ({c})" for n, c in self.unknown.most_common())
            out.append(f"GPUs without specs in gpus.csv, left out: {names}")
        if self.no_price:
            out.append(f"{self.no_price} rows without an on-demand price left out")
        if self.fractional:
            out.append(f"{self.fractional} rows of a fraction of a GPU left out")
        return "; ".join(out)


def parse_skypilot(
    text: str, file: str, cloud: str, retrieved: str = "", source: str = ""
) -> Normalized:
    """Offers from a SkyPilot catalog vms.csv (InstanceType, AcceleratorName, Price, ...).

    GPU-only GCP rows are summed with the host VM their family needs (a2/a3/n1); one offer
    per instance type and region, the zone with the cheapest spot price kept (on-demand is
    the same in every zone). A GPU without specs in gpus.csv is counted, never guessed.
    """
    rows = [Cells(file, lineno, r) for lineno, r in data_rows(text, file)]
    hosts: dict[tuple[str, str], _Host] = {}
    for at in rows:
        if not (at.row.get("AcceleratorName") or "").strip() and at.row.get("InstanceType"):
            host, old = _Host.of(at), hosts.get(_Host.key_of(at))
            if host is not None and (old is None or _cheaper(host.spot, old.spot)):
                hosts[host.key] = host
    done = Normalized([], Counter())
    best: dict[tuple[str, str, str], Offer] = {}
    src, bucket = source or f"{file} (SkyPilot catalog)", providers()[cloud].interruption or ">20%"
    for at in rows:
        vm = _vm_offer(at, hosts, done)
        if vm is None:
            continue
        spot = bucket if vm.spot_usd_h is not None else ""
        offer = replace(vm, provider=cloud, retrieved=retrieved, source=src, interruption=spot)
        seen = best.get(offer.key)
        if seen is None or _cheaper(offer.spot_usd_h, seen.spot_usd_h):
            best[offer.key] = offer
    done.offers = list(best.values())
    return done


@dataclass
class _Host:
    """A VM without a GPU in a SkyPilot catalog: GCP adds one to each GPU-only row."""

    key: tuple[str, str]  # instance type, region
    ondemand: float
    spot: float | None
    vcpus: float | None
    memory_gib: float | None

    @staticmethod
    def key_of(at: Cells) -> tuple[str, str]:
        return (at.row["InstanceType"], at.row.get("Region", ""))

    @classmethod
    def of(cls, at: Cells) -> _Host | None:
        """The host of a row without a GPU; None without an on-demand price."""
        if (od := at.number("Price", required=False, unit=PER_HOUR)) is None:
            return None
        spot = at.number("SpotPrice", required=False, unit=PER_HOUR)
        vcpus, memory = at.number("vCPUs", required=False), at.number("MemoryGiB", required=False)
        return cls(cls.key_of(at), od, spot, vcpus, memory)


def _vm_offer(at: Cells, hosts: dict[tuple[str, str], _Host], done: Normalized) -> Offer | None:
    """The offer of one GPU row (its provider and source are the catalog's), or None, with
    the reason counted in `done`: not a GPU row, a fraction of a GPU, a GPU without specs,
    no on-demand price (or no host for it)."""
    r = at.row
    name = (r.get("AcceleratorName") or "").strip()
    if not name:
        return None
    try:
        count = float(r.get("AcceleratorCount") or "0")
    except ValueError:
        raise at.fail("AcceleratorCount", f"{r['AcceleratorCount']!r} is not a number") from None
    if count < 1 or count != int(count):
        done.fractional += 1
        return None
    instance = (r.get("InstanceType") or "").strip()
    gpu = lookup_gpu(from_skypilot(name, instance))
    if gpu is None:
        done.unknown[name] += 1
        return None
    od = at.number("Price", required=False, unit=PER_HOUR)
    spot = None if od is None else at.number("SpotPrice", required=False, unit=PER_HOUR)
    region = (r.get("Region") or "").strip().lstrip(", ")  # Vast: ", US, NA" (no state)
    vcpus, memory = at.number("vCPUs", required=False), at.number("MemoryGiB", required=False)
    if od is not None and not instance:  # a GCP GPU-only row: add its host
        family = gcp_host(name, int(count))
        host = hosts.get((family, region)) if family else None
        if family is None or host is None:
            od = None
        else:
            instance, vcpus, memory = family, host.vcpus, host.memory_gib
            od += host.ondemand
            spot = spot + host.spot if spot is not None and host.spot is not None else None
    if od is None:
        done.no_price += 1
        return None
    if spot is not None and (abs(spot - od) <= 1e-4 * od or spot == 0):
        # no discount (or one of rounding: AWS lists 8.226100 beside 8.22609), or the
        # catalog's "none" (Vast lists 0.00 for every row): no spot offer;
        # spot above on-demand, or an on-demand price of 0, is kept and flagged (sanity)
        spot = None
    return Offer(
        provider="",
        instance=instance,
        gpu=gpu,
        gpus=int(count),
        ondemand_usd_h=round(od, 6),
        spot_usd_h=round(spot, 6) if spot is not None else None,
        region=region,
        interruption="",
        source="",
        zone=(r.get("AvailabilityZone") or "").strip(),
        vcpus=vcpus,
        memory_gib=memory,
    )


def _cheaper(spot: float | None, than: float | None) -> bool:
    return spot is not None and (than is None or spot < than)


def read_price_file(path: str) -> list[Offer]:
    p = Path(path)
    if not p.is_file():
        raise FrugalError(
            f"offers file {path} not found: give a CSV of offers (--offers FILE, or [offers] "
            f"files in {settings_path()})"
        )
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise FrugalError(f"cannot read offers file {path}: {e}") from None
    return parse_price_text(text, str(path)).offers


def parse_price_text(
    text: str, where: str, cloud: str = "", retrieved: str = "", source: str = ""
) -> Normalized:
    """A price file in either format: a SkyPilot catalog `vms.csv` (of `cloud`, or of the
    cloud its path names) or frugal's offers columns (one provider or several)."""
    columns = header(text, where)
    if "AcceleratorName" in columns and "InstanceType" in columns:
        cloud = cloud or next((c for c in providers() if c in where.lower()), "")
        if not cloud:
            raise FrugalError(
                f"{where}: a SkyPilot catalog, but which cloud? keep the cloud in its path "
                "(e.g. catalogs/v8/aws/vms.csv) or rename it aws-vms.csv"
            )
        if "Price" not in columns:
            raise FrugalError(
                f"{where}: a SkyPilot catalog without its Price column (each row's on-demand "
                "dollars per hour); is the file whole?"
            )
        return parse_skypilot(text, where, cloud, retrieved, source)
    return Normalized(parse_offers(text, where, retrieved), Counter())
