"""`frugal offers update`: today's prices, downloaded into frugal's cache.

Sources:
* `gpuhunt`: dstack's gpuhunt catalogs (the optional extra: pip install 'frugal-ft[gpuhunt]';
  `GPUHUNT_CATALOG_URL` points it at a mirror) for AWS, Azure, GCP, Lambda, Nebius, OCI and
  RunPod, their on-demand and spot rows of an instance and location made one offer.
* `skypilot` (default): the per-cloud catalog files SkyPilot itself reads, from its public
  catalog repository (skypilot-org/skypilot-catalog, format v8), one `vms.csv` per cloud;
  `FRUGAL_SKYPILOT_URL` points at a mirror of its `catalogs/` directory.
* a URL or a PATH: a mirror of that layout (`<base>/v8/<cloud>/vms.csv`), or one CSV file
  (frugal's offers columns, or a SkyPilot vms.csv with the cloud in its name).

Every row is normalized to frugal's offers (one per instance type and region, the zone of
the cheapest spot price kept; GPUs named as in gpus.csv, a GPU without specs reported, never
guessed) and stamped with its source and the time it was read. The providers updated
replace their rows; the others keep theirs. The new snapshot is installed whole or not at
all (frugal.hardware.snapshot); a provider that cannot be read stops the update, and plans
go on pricing from the snapshot they had.
"""

from __future__ import annotations

import http.client
import importlib
import json
import logging
import os
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from frugal.errors import FrugalError
from frugal.hardware.gpus import GPU, lookup_gpu
from frugal.hardware.offers import (
    ADVISED,
    BUCKETS,
    Offer,
    base,
    find_provider,
    offers_csv,
    providers,
)
from frugal.hardware.price_files import parse_price_text
from frugal.hardware.sanity import error
from frugal.hardware.skypilot import from_skypilot
from frugal.hardware.snapshot import header, install

SKYPILOT_URL = "https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/master/catalogs"
# the catalog file of each provider; SkyPilot's newest format for each (v8), or the last one
# it published for a provider that left it
SKYPILOT_FILES = {
    "aws": "v8/aws/vms.csv",
    "gcp": "v8/gcp/vms.csv",
    "azure": "v8/azure/vms.csv",
    "lambda": "v8/lambda/vms.csv",
    "runpod": "v8/runpod/vms.csv",
    "vast": "v8/vast/vms.csv",
    "nebius": "v8/nebius/vms.csv",
    "cudo": "v8/cudo/vms.csv",
    "oci": "v8/oci/vms.csv",
    "hyperbolic": "v8/hyperbolic/vms.csv",
    "primeintellect": "v8/primeintellect/vms.csv",
    "fluidstack": "v6/fluidstack/vms.csv",  # SkyPilot's last catalog of these two is v6
    "paperspace": "v6/paperspace/vms.csv",
}
# AWS's Spot Instance Advisor feed: the interruption bucket of each instance type per region
ADVISOR_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
TIMEOUT_S = 30.0
MAX_BYTES = 512 << 20  # AWS's catalog is the largest, about 100 MB

Progress = Callable[[str, int, int | None], None]  # (what, bytes so far, total or None)


@dataclass
class Fetched:
    """One provider's rows as read from the source."""

    provider: str
    where: str  # the URL or path read
    offers: list[Offer]
    left_out: str = ""  # what was left out and why (unknown GPUs, rows without a price)
    unknown: Counter[str] = field(default_factory=Counter)
    advised: int = 0  # spot offers given their own interruption bucket (AWS Spot Advisor)

    def to_json(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "from": self.where,
            "offers": len(self.offers),
            "gpus": sorted({o.gpu.name for o in self.offers}),
            "regions": len({o.region for o in self.offers}),
            "unknown_gpus": dict(self.unknown),
            "interruption_from_advisor": self.advised,
            "left_out": self.left_out or None,
        }


@dataclass
class Update:
    """What an update did: per provider, the rows read; where the snapshot went."""

    fetched: list[Fetched]
    path: str
    kept: int  # rows of providers not updated, kept from the snapshot before
    retrieved: datetime

    def to_json(self) -> dict[str, object]:
        return {
            "snapshot": self.path,
            "retrieved": self.retrieved.isoformat().replace("+00:00", "Z"),
            "providers": [f.to_json() for f in self.fetched],
            "offers": sum(len(f.offers) for f in self.fetched) + self.kept,
            "kept_from_before": self.kept,
        }


def parse_advisor(text: str, where: str) -> dict[tuple[str, str], str]:
    """AWS Spot Instance Advisor data: {(instance type, region): bucket} for Linux, the
    bucket named as the feed's own `ranges` labels (<5%, 5-10%, ... >20%)."""
    try:
        data = json.loads(text)
        labels = {int(r["index"]): str(r["label"]) for r in data["ranges"]}
        out = {}
        for region, systems in data["spot_advisor"].items():
            for instance, v in systems.get("Linux", {}).items():
                out[(instance, region)] = labels[int(v["r"])]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise FrugalError(f"{where}: not AWS Spot Instance Advisor data ({e!r})") from None
    unknown = set(out.values()) - set(BUCKETS)
    if unknown:
        raise FrugalError(f"{where}: unknown interruption buckets {sorted(unknown)}")
    return out


def with_advisor(offers: list[Offer], buckets: dict[tuple[str, str], str], when: str) -> int:
    """Give each AWS spot offer its own bucket from the advisor (in place), its source
    saying so (`Offer.advised`); how many got one."""
    n = 0
    for i, o in enumerate(offers):
        bucket = buckets.get((o.instance, o.region))
        if o.provider == "aws" and o.spot_usd_h is not None and bucket:
            offers[i] = replace(o, interruption=bucket, source=f"{o.source}; {ADVISED} {when}")
            n += 1
    return n


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def read_source(where: str, progress: Progress | None = None) -> str:
    """The text at a URL or path; one line naming it when it cannot be read."""
    if not _is_url(where):
        try:
            return Path(where).read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as e:
            raise FrugalError(f"cannot read {where}: {getattr(e, 'strerror', e) or e}") from None
    try:
        with urllib.request.urlopen(where, timeout=TIMEOUT_S) as r:
            total = int(r.headers.get("Content-Length") or 0) or None
            chunks, got = [], 0
            while chunk := r.read(1 << 16):
                chunks.append(chunk)
                got += len(chunk)
                if got > MAX_BYTES:
                    raise FrugalError(f"{where}: over {MAX_BYTES >> 20} MB, not a price catalog")
                if progress:
                    progress(where, got, total)
        if total is not None and got != total:  # http.client returns what came, unchecked
            raise FrugalError(
                f"the download of {where} was cut off at {got:,} of {total:,} bytes; try again"
            )
        return b"".join(chunks).decode("utf-8-sig")
    except urllib.error.HTTPError as e:
        raise FrugalError(f"cannot download {where}: HTTP {e.code} {e.reason}") from None
    except http.client.IncompleteRead as e:  # a chunked download cut off
        raise FrugalError(
            f"the download of {where} was cut off after {len(e.partial):,} bytes; try again"
        ) from None
    except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as e:
        why = getattr(e, "reason", None) or e
        raise FrugalError(f"cannot download {where} ({why})") from None
    except UnicodeDecodeError:
        raise FrugalError(f"{where}: not a text CSV file") from None


def plan_sources(source: str, only: Iterable[str] | None) -> list[tuple[str, str]]:
    """(provider, URL or path) of each file to read; provider "" for one CSV of offers."""
    if source == "skypilot":
        root = os.environ.get("FRUGAL_SKYPILOT_URL", SKYPILOT_URL)
    elif source.endswith(".csv"):
        return [("", source)]
    elif _is_url(source) or Path(source).is_dir():
        root = source
    else:
        raise FrugalError(
            f"--source {source!r}: give skypilot, a URL or directory of SkyPilot catalogs, or "
            "a CSV file of offers"
        )
    names = list(SKYPILOT_FILES) if only is None else list(only)
    out = []
    for name in names:
        rel = SKYPILOT_FILES.get(name)
        if rel is None:
            raise FrugalError(
                f"--providers {name}: SkyPilot publishes no catalog for it; the source covers "
                f"{', '.join(SKYPILOT_FILES)}"
            )
        out.append((name, f"{root.rstrip('/')}/{rel}"))
    return out


# dstack's gpuhunt names for the providers frugal knows (its other catalogs are left out)
GPUHUNT = {
    "aws": "aws",
    "azure": "azure",
    "gcp": "gcp",
    "lambdalabs": "lambda",
    "nebius": "nebius",
    "oci": "oci",
    "runpod": "runpod",
}


def _gpuhunt_gpu(name: str, memory_gb: float | None, instance: str) -> GPU | None:
    """Our GPU for gpuhunt's name and memory per GPU (A100 40 or 80 GB, V100 16 or 32)."""
    if name.upper() == "H100":
        return lookup_gpu(from_skypilot(name, instance))
    if memory_gb:
        sized = lookup_gpu(f"{name}-{memory_gb:.0f}gb")
        if sized is not None:
            return sized
    return lookup_gpu(name)


def from_gpuhunt(only: list[str] | None, retrieved: str) -> list[Fetched]:
    """The offers of dstack's gpuhunt catalogs (the optional extra `gpuhunt`), one Fetched a
    provider: its on-demand and spot rows of an instance and location made one offer."""
    try:
        gpuhunt = importlib.import_module("gpuhunt")
    except ImportError:
        raise FrugalError(
            "--source gpuhunt needs dstack's gpuhunt package: pip install 'frugal-ft[gpuhunt]'"
        ) from None
    theirs = [g for g, ours in GPUHUNT.items() if only is None or ours in only]
    if not theirs:
        raise FrugalError(f"--source gpuhunt covers {', '.join(sorted(GPUHUNT.values()))}")
    where = os.environ.get("GPUHUNT_CATALOG_URL", "gpuhunt's catalog")
    catalog = gpuhunt.Catalog(balance_resources=False, auto_reload=False)
    quiet = logging.getLogger("gpuhunt")  # it logs a traceback per provider it cannot read
    level, quiet.level = quiet.level, logging.CRITICAL + 1
    try:
        catalog.load()  # every provider gpuhunt publishes; the ones it cannot read stay empty
    except Exception as e:  # gpuhunt's own error, or the network's, when none can be read
        raise FrugalError(f"cannot read gpuhunt's catalogs from {where} ({e})") from None
    finally:
        quiet.setLevel(level)
    return [_gpuhunt_provider(catalog, name, where, retrieved) for name in theirs]


def _gpuhunt_provider(catalog: Any, name: str, where: str, retrieved: str) -> Fetched:
    """One provider of gpuhunt's catalog: an offer per instance and location that has an
    on-demand price (spot-only rows have nothing to plan against)."""
    items = [i for i in catalog.query(provider=name) if i.gpu_count and i.gpu_count >= 1]
    if not items:
        raise FrugalError(f"gpuhunt: no {name} offers could be read from {where}")
    rows: dict[tuple[str, str], tuple[GPU, Any, dict[str, float]]] = {}
    unknown: Counter[str] = Counter()
    for i in items:
        gpu = _gpuhunt_gpu(i.gpu_name or "", i.gpu_memory, i.instance_name)
        if gpu is None:
            unknown[i.gpu_name or "?"] += 1
            continue
        _, _, prices = rows.setdefault((i.instance_name, i.location), (gpu, i, {}))
        prices["spot" if i.spot else "od"] = float(i.price)
    provider = GPUHUNT[name]
    bucket = providers()[provider].interruption or ">20%"
    offers = []
    for (instance, location), (gpu, item, prices) in rows.items():
        od, spot = prices.get("od"), prices.get("spot")
        if od is None:
            continue
        offers.append(
            Offer(
                provider=provider,
                instance=instance,
                gpu=gpu,
                gpus=int(item.gpu_count),
                ondemand_usd_h=od,
                # as SkyPilot's rows: no discount is no spot; above on-demand: flagged
                spot_usd_h=spot
                if spot is not None and spot > 0 and abs(spot - od) > 1e-4 * od
                else None,
                region=location,
                interruption=bucket if spot is not None else "",
                source=f"gpuhunt catalog {name} (dstack)",
                retrieved=retrieved,
                vcpus=float(item.cpu),
                memory_gib=float(item.memory),
            )
        )
    left = ", ".join(f"{n} ({c})" for n, c in unknown.most_common())
    note = f"GPUs without specs in gpus.csv, left out: {left}" if unknown else ""
    return Fetched(provider, f"{where} ({name})", offers, note, unknown)


def fetch(provider: str, where: str, retrieved: str, progress: Progress | None) -> list[Fetched]:
    """The offers of one file, normalized (a file of frugal's columns may hold several
    providers: one Fetched each)."""
    text = read_source(where, progress)
    rel = next((r for r in SKYPILOT_FILES.values() if where.endswith(r)), where)
    got = parse_price_text(text, where, provider, retrieved, f"SkyPilot catalog {rel}")
    if not got.offers:
        why = got.summary() or "no row names a GPU"
        what = f"the {provider} catalog" if provider else "a price file"
        raise FrugalError(f"{where}: no GPU offers in it ({why}); is it {what}?")
    by: dict[str, list[Offer]] = {}
    for o in got.offers:
        by.setdefault(o.provider, []).append(o)
    return [Fetched(p, where, rows, got.summary(), got.unknown) for p, rows in by.items()]


def update(
    source: str = "skypilot",
    only: str | None = None,
    progress: Progress | None = None,
    now: datetime | None = None,
    force: bool = False,
) -> Update:
    """Download, normalize and install a new snapshot (see the module docstring). A
    provider that lost most of its offers since the snapshot before is refused, unless
    `force`: a catalog that shrank by half since the last update is more likely damaged
    than true. (The bundled catalog is not compared: a first update from a mirror or from
    one's own file may well cover fewer offers than frugal ships.)"""
    chosen = [find_provider(p) for p in only.split(",") if p.strip()] if only else None
    when = now or datetime.now(UTC)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    if source == "gpuhunt":
        fetched = from_gpuhunt(chosen, stamp)
    else:
        fetched = [
            f for p, where in plan_sources(source, chosen) for f in fetch(p, where, stamp, progress)
        ]
    if chosen is not None:
        fetched = [f for f in fetched if f.provider in chosen]
    for f in fetched:
        if f.provider == "aws" and source == "skypilot":
            url = os.environ.get("FRUGAL_SPOT_ADVISOR_URL", ADVISOR_URL)
            buckets = parse_advisor(read_source(url, progress), url)
            f.advised = with_advisor(f.offers, buckets, stamp)
    if not fetched:
        raise FrugalError(f"{source}: no offers for {only}")
    _check_errors(fetched)
    before = base()
    if not force and before.snapshot.path is not None:  # against the last update's prices
        _check_losses(fetched, before.offers)
    fresh = {f.provider for f in fetched}
    kept = [o for o in before.offers if o.provider not in fresh]
    rows = [o for f in fetched for o in f.offers] + kept
    if source == "skypilot":
        source = f"SkyPilot catalogs {os.environ.get('FRUGAL_SKYPILOT_URL', SKYPILOT_URL)}"
    path = install(header(when, source) + offers_csv(rows))
    return Update(fetched, str(path), len(kept), when)


def _check_errors(fetched: list[Fetched]) -> None:
    """Refuse a provider none of whose offers has a usable price (`sanity.error`: zero,
    spot above on-demand, a GPU count its name contradicts): installing it would replace
    the provider's offers with nothing a plan can use."""
    for f in fetched:
        why = [error(o) for o in f.offers]
        if f.offers and all(why):
            raise FrugalError(
                f"{f.where}: every {f.provider} offer's price is an error ({why[0]}): check "
                "the file; the prices in use were not changed"
            )


def _check_losses(fetched: list[Fetched], before: tuple[Offer, ...]) -> None:
    """Refuse an update in which a provider keeps fewer than half of its offers."""
    had = Counter(o.provider for o in before)
    for f in fetched:
        if len(f.offers) * 2 < had[f.provider]:
            raise FrugalError(
                f"{f.where}: {f.provider} has {len(f.offers)} offers, down from "
                f"{had[f.provider]} in the prices in use: more likely a damaged or partial "
                "file than the provider's catalog; check it, or give --force to take it"
            )
