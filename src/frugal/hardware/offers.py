"""The offer catalog: where a GPU can be rented, for how much, and on what terms.

Bundled rows (data/offers.csv, each with its source and date) are merged with the user's
own price files (`--prices FILE`, same columns, or a SkyPilot catalog `vms.csv`), adjusted
by per-provider discounts, and extended with `local` offers (your own GPUs, priced as
electricity). Every price error names the file, line and column to fix.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from frugal.csvrows import Cells
from frugal.errors import FrugalError, notice
from frugal.hardware import sanity
from frugal.hardware.csvdata import data_rows, header
from frugal.hardware.gpus import GPU, gpus, lookup_gpu
from frugal.hardware.snapshot import Snapshot, bundled_text, meta, read, stored
from frugal.names import closest
from frugal.settings import settings_path, table
from frugal.times import parse_time

BUCKETS = ("<5%", "5-10%", "10-15%", "15-20%", ">20%")
OFFER_COLUMNS = ("provider", "instance", "gpu", "gpus", "ondemand_usd_h", "spot_usd_h", "region")
KWH_USD = 0.17  # US residential average 2024, 16.5 c/kWh (EIA Electric Power Monthly)
HOST_WATTS = 150.0  # CPU, RAM, disks and fans of a one-GPU workstation under load
HOURS_PER_MONTH = 730.0  # 8,760 / 12: what clouds bill a month of (AWS pricing calculator)
ADVISED = "interruption: AWS Spot Advisor"  # in an offer's source: its bucket is AWS's own
MAX_AGE_DAYS = 7.0  # prices older than this make a plan warn (settings [offers] max_age_days)
PER_HOUR = "$/hour for the whole instance"  # what a price cell holds


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
    retrieved: str = ""  # when the price was read (ISO date or time; "" = not known)
    zone: str = ""  # the zone of the spot price, where the catalog lists zones
    vcpus: float | None = None
    memory_gib: float | None = None  # host RAM

    @property
    def terms(self) -> Provider:
        return providers()[self.provider]

    def hourly_usd(self, spot: bool) -> float:
        """Dollars an hour for the instance: on spot where asked and offered, else on demand."""
        return self.spot_usd_h if spot and self.spot_usd_h is not None else self.ondemand_usd_h

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
            "zone": self.zone or None,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "source": self.source,
            "retrieved": self.retrieved or None,
        }

    @property
    def advised(self) -> bool:
        """Whether its interruption bucket is AWS Spot Advisor's for it (not a default)."""
        return ADVISED in self.source

    @property
    def key(self) -> tuple[str, str, str]:
        """What names an offer in a catalog: a row with the same key replaces it."""
        return (self.provider, self.instance, self.region)


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


def parse_offers(text: str, file: str, retrieved_default: str = "") -> list[Offer]:
    """Offers from frugal's own CSV format (see data/offers.csv); a row without a
    `retrieved` date takes `retrieved_default`."""
    present = set(header(text, file))
    missing = [c for c in OFFER_COLUMNS if c not in present]
    if missing:
        raise FrugalError(
            f"{file}: missing column(s) {', '.join(missing)}; a price file needs "
            f"{','.join(OFFER_COLUMNS)} (or a SkyPilot catalog vms.csv)"
        )
    out = []
    for lineno, r in data_rows(text, file):
        at = Cells(file, lineno, r)
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
        ondemand = at.number("ondemand_usd_h", required=True, unit=PER_HOUR)
        assert ondemand is not None
        spot = at.number("spot_usd_h", required=False, unit=PER_HOUR)
        bucket = (r.get("interruption") or "").strip() or providers()[provider].interruption
        if spot is not None and bucket not in BUCKETS:
            raise at.fail("interruption", f"{bucket!r}: use one of {', '.join(BUCKETS)}")
        retrieved = (r.get("retrieved") or "").strip() or retrieved_default
        if retrieved:
            try:
                parse_time(retrieved)
            except ValueError as e:
                raise at.fail("retrieved", str(e)) from None
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
                retrieved=retrieved,
                zone=(r.get("zone") or "").strip(),
                vcpus=at.number("vcpus", required=False),
                memory_gib=at.number("memory_gib", required=False),
            )
        )
    return out


SNAPSHOT_COLUMNS = (
    *OFFER_COLUMNS,
    "zone",
    "interruption",
    "vcpus",
    "memory_gib",
    "source",
    "retrieved",
)


def _decimal(x: float | None) -> str:
    """A number as the catalogs write it: up to 6 decimals, no trailing zeros ("" for None)."""
    return "" if x is None else f"{x:.6f}".rstrip("0").rstrip(".")


def offers_csv(offers: Iterable[Offer]) -> str:
    """Offers as rows of frugal's offers CSV (the snapshot's body, after its header)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SNAPSHOT_COLUMNS)
    for o in offers:
        w.writerow(
            [
                o.provider,
                o.instance,
                o.gpu.name,
                o.gpus,
                _decimal(o.ondemand_usd_h),
                _decimal(o.spot_usd_h),
                o.region,
                o.zone,
                o.interruption if o.spot_usd_h is not None else "",
                _decimal(o.vcpus),
                _decimal(o.memory_gib),
                o.source,
                o.retrieved,
            ]
        )
    return buf.getvalue()


@cache
def bundled() -> Base:
    """The catalog that ships with frugal: SkyPilot's catalogs' offers and Modal's."""
    text = bundled_text()
    snap = meta(text, "bundled catalog", None)
    assert snap is not None, "data/offers.csv must start with a snapshot header"
    day = snap.retrieved.date().isoformat()
    return Base.of(snap, parse_offers(text, "offers.csv", day) + modal_offers(day))


MODAL_CORES_PER_GPU = 4.0  # physical cores a training container reserves per GPU
MODAL_GIB_PER_GPU = 32.0  # and memory
MODAL_CORE_USD_S = 0.0000131  # per physical core-second (modal.com/pricing, data/modal.csv)
MODAL_GIB_USD_S = 0.00000222  # per GiB-second


def modal_gpu(gpu: GPU) -> tuple[str, int] | None:
    """Modal's name for our GPU and the most one container takes (None: Modal has none)."""
    for _, r in _modal_rows():
        if lookup_gpu(r["gpu"]) == gpu:
            return r["modal_gpu"], int(r["max_gpus"])
    return None


@cache
def _modal_rows() -> list[tuple[int, dict[str, str]]]:
    text = (resources.files("frugal.hardware") / "data" / "modal.csv").read_text()
    return list(data_rows(text, "modal.csv"))


def modal_offers(retrieved: str) -> list[Offer]:
    """Modal's GPU functions as offers: 1, 2, 4 (and 8) GPUs a container, the GPUs'
    per-second price plus the container's cores and memory, by the hour."""
    out = []
    for line, r in _modal_rows():
        gpu = lookup_gpu(r["gpu"])
        if gpu is None:
            raise FrugalError(f"modal.csv:{line}: unknown GPU {r['gpu']!r}")
        per_gpu_s = (
            float(r["usd_s"])
            + MODAL_CORES_PER_GPU * MODAL_CORE_USD_S
            + MODAL_GIB_PER_GPU * MODAL_GIB_USD_S
        )
        for n in (c for c in (1, 2, 4, 8) if c <= int(r["max_gpus"])):
            out.append(
                Offer(
                    provider="modal",
                    instance=f"{r['modal_gpu']}:{n}",
                    gpu=gpu,
                    gpus=n,
                    ondemand_usd_h=round(per_gpu_s * 3600 * n, 6),
                    spot_usd_h=None,
                    region="any",
                    interruption="",
                    source=f"{r['source']}; ${r['usd_s']}/GPU-s + {MODAL_CORES_PER_GPU:g} cores "
                    f"and {MODAL_GIB_PER_GPU:g} GiB per GPU, per second",
                    retrieved=retrieved,
                    vcpus=2 * MODAL_CORES_PER_GPU * n,
                    memory_gib=MODAL_GIB_PER_GPU * n,
                )
            )
    return out


def bundled_offers() -> tuple[Offer, ...]:
    return bundled().offers


@dataclass(frozen=True)
class Base:
    """The offers plans price from, what they are, the listings that are wrong (left out of
    plans) and the prices that stand far from their peers' (kept, and said): `sanity`."""

    snapshot: Snapshot
    offers: tuple[Offer, ...]
    errors: dict[tuple[str, str, str], str]
    findings: dict[tuple[str, str, str], str]

    @classmethod
    def of(cls, snap: Snapshot, offers: list[Offer]) -> Base:
        return cls(snap, tuple(offers), sanity.errors(offers), sanity.findings(offers))


_READ: dict[tuple[str, int, int], Base | None] = {}  # None: it cannot be read (said once)


def base() -> Base:
    """The last `frugal offers update` (or the one before it, if the last cannot be read),
    else the bundled catalog. Each snapshot file is read and judged once per process (per
    version of it); one that cannot be read is reported once."""
    for path in stored():
        try:
            st = path.stat()
        except OSError:
            continue
        sig = (str(path), st.st_mtime_ns, st.st_size)
        if sig not in _READ:
            _READ[sig] = _load(path)
        if (got := _READ[sig]) is not None:
            return got
    return bundled()


def _load(path: Path) -> Base | None:
    text = read(path)
    snap = meta(text, "offers update", str(path))
    try:
        if snap is None:
            raise FrugalError("not a frugal offers snapshot")
        return Base.of(snap, parse_offers(text, str(path), snap.retrieved.isoformat()))
    except FrugalError as e:
        notice(
            f"price snapshot {path} cannot be read ({e}): passed over; "
            "`frugal offers update` writes a new one"
        )
        return None


def offer_settings() -> tuple[list[str], float]:
    """Your own offers files and the age past which prices are stale (settings [offers])."""
    t = table("offers")
    files = t.get("files", [])
    age = t.get("max_age_days", MAX_AGE_DAYS)
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise FrugalError(f'settings file {settings_path()}: [offers] files = ["PATH", ...]')
    if isinstance(age, bool) or not isinstance(age, int | float) or not 0 < age <= 3650:
        raise FrugalError(
            f"settings file {settings_path()}: [offers] max_age_days: give days from 1 to 3650"
        )
    return [str(Path(f).expanduser()) for f in files], float(age)
