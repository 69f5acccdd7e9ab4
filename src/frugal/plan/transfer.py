"""The data that moves: a dataset onto the training VM and the results back to the data.

Where data lives is a `DataSource`: `local` (your own machine), `hub` (the Hugging Face hub
or any public URL) or `PROVIDER:REGION` (a bucket or disk of that provider in that region,
e.g. `aws:us-east-1`; a bucket URL such as `s3://...` does not say its region, so it is not
accepted). Sizes are in GB (1e9 bytes), prices are the list prices of providers.csv.

Ingress is free at every provider (sources in providers.csv's header), so a move is paid by
the side the data leaves, at that side's price per GB:

    same provider, same region       $0
    same provider, another region    size_gb x interregion_usd_gb   (e.g. AWS $0.02/GB)
    to another provider, to your     size_gb x egress_usd_gb        (internet egress, e.g.
      machine or to the hub                                          AWS $0.09/GB)
    from your machine or the hub     $0                             (nobody bills the upload)

    hours = size_gb / link_gbps / 3600

The link speeds are frugal's assumptions, not measurements: a cloud VM reads from a bucket,
another cloud or the hub at DOWNLOAD_GBPS (0.5 GB/s, ~4 Gbit/s); a move with your machine at
one end runs at your uplink, UPLOAD_GBPS (0.05 GB/s, ~400 Mbit/s, a fast office or fibre home
line; pass your own). Home downlinks are usually faster than uplinks, so a download to your
machine is estimated on the slow side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from frugal.errors import FrugalError
from frugal.hardware.offers import Offer, providers

# the one copy of the in-cloud speed (the search prices its weight downloads with it)
DOWNLOAD_GBPS = 0.5  # model weights or data from the hub or a bucket onto a cloud VM, GB/s
UPLOAD_GBPS = 0.05  # your machine's uplink, GB/s (~400 Mbit/s); an assumption, pass your own

FORMS = (
    "local (your machine), hub (the Hugging Face hub or a public URL) or PROVIDER:REGION "
    "(e.g. aws:us-east-1, gcp:us-central1)"
)


@dataclass(frozen=True)
class DataSource:
    kind: Literal["local", "hub", "cloud"]
    provider: str = ""
    region: str = ""

    @property
    def label(self) -> str:
        """How a reason names the place: `your machine`, `the hub`, `aws us-east-1`."""
        if self.kind == "cloud":
            return f"{self.provider} {self.region}".strip()
        return "your machine" if self.kind == "local" else "the hub"

    def __str__(self) -> str:  # the form parse_location reads back
        return f"{self.provider}:{self.region}" if self.kind == "cloud" else self.kind


def parse_location(text: str) -> DataSource:
    """`local`, `hub` (or an http(s) URL) or `PROVIDER:REGION`; anything else names the forms."""
    raw = text.strip()
    key = raw.lower()
    if key == "local":
        return DataSource("local")
    if key == "hub" or key.startswith(("http://", "https://")):
        return DataSource("hub")
    if "://" in key:
        raise FrugalError(
            f"data location {text!r}: a bucket URL does not say its region; write {FORMS}"
        )
    name, sep, region = raw.partition(":")
    name, region = name.strip().lower(), region.strip().lower()
    if not sep or not name or not region:
        raise FrugalError(f"data location {text!r}: write {FORMS}")
    if name not in providers():
        raise FrugalError(
            f"data location {text!r}: unknown provider {name!r} (known: "
            f"{', '.join(providers())}); write {FORMS}"
        )
    return DataSource("local") if name == "local" else DataSource("cloud", name, region)


def measure_gb(path: str) -> float:
    """The size of a file, or of every file under a directory, in GB (1e9 bytes)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FrugalError(f"{path} not found: give the dataset's file or directory to measure")
    if p.is_file():
        return p.stat().st_size / 1e9
    total = 0
    for root, _, files in os.walk(p):
        total += sum((Path(root) / f).stat().st_size for f in files)
    return total / 1e9


@dataclass(frozen=True)
class Move:
    usd: float
    hours: float
    reason: str  # the sentence with the GB, the dollars, the price per GB and the time


def _place(offer: Offer) -> DataSource:
    if offer.provider == "local":
        return DataSource("local")
    return DataSource("cloud", offer.provider, offer.region)


def _duration(hours: float) -> str:
    if hours >= 1:
        return f"{hours:.1f} h"
    return f"{hours * 60:.0f} min" if hours >= 1 / 60 else f"{hours * 3600:.0f} s"


def _move(what: str, size_gb: float, src: DataSource, dst: DataSource, upload_gbps: float) -> Move:
    if size_gb < 0 or upload_gbps <= 0:
        raise FrugalError(f"{what}: size must be >= 0 GB and the upload speed > 0 GB/s")
    head = f"{what} {size_gb:.1f} GB from {src.label} to {dst.label}"
    if src.kind == "local" and dst.kind == "local":
        return Move(0.0, 0.0, f"{head}: already there, $0")
    gbps = upload_gbps if "local" in (src.kind, dst.kind) else DOWNLOAD_GBPS
    hours = size_gb / gbps / 3600
    speed = f"{_duration(hours)} at {gbps:g} GB/s"
    if src.kind != "cloud":  # your upload or the hub's download: nobody bills it
        free = "your upload" if src.kind == "local" else "a public download"
        return Move(0.0, hours, f"{head}: free ({free}; ingress is free), {speed}")
    terms = providers()[src.provider]
    same_region = bool(src.region) and src.region.lower() == dst.region.lower()
    if dst.kind == "cloud" and dst.provider == src.provider:
        if same_region:
            return Move(0.0, hours, f"{head}: free within the region, {speed}")
        rate, kind = terms.interregion_usd_gb, "inter-region transfer"
        if not (src.region and dst.region):
            kind += " (a region is unknown: priced as another region)"
    else:
        rate, kind = terms.egress_usd_gb, f"{src.provider} internet egress"
    usd = size_gb * rate
    return Move(usd, hours, f"{head}: ${usd:,.2f} {kind} at ${rate:g}/GB, {speed}")


def move_in(
    src: DataSource, size_gb: float, offer: Offer, upload_gbps: float = UPLOAD_GBPS
) -> Move:
    """The dataset's way from where it lives onto the offer's machine."""
    return _move("dataset", size_gb, src, _place(offer), upload_gbps)


def move_out(
    size_gb: float, offer: Offer, dest: DataSource, upload_gbps: float = UPLOAD_GBPS
) -> Move:
    """Results (checkpoints, adapters) from the offer's machine back to `dest`."""
    return _move("results", size_gb, _place(offer), dest, upload_gbps)
