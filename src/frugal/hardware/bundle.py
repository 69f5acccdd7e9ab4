"""Build the bundled catalog (data/offers.csv) from SkyPilot's catalog files: the same
normalizer `frugal offers update` runs, over files a maintainer recorded, each provider's
rows stamped with the catalog commit they came from. Rows whose price is an error are left
out (the bundled catalog holds none; a test checks it) and listed on stderr, with the
prices far from their peers', which stay (`sanity`: findings, said where a plan takes one).

    python -m frugal.hardware.bundle CATALOGS --commit aws=00148f2 ... \\
        [--advisor spot-advisor-data.json] [--retrieved 2026-11-25] > offers.csv

CATALOGS is SkyPilot's `catalogs/` layout (v8/aws/vms.csv, ...), e.g. a checkout of
skypilot-org/skypilot-catalog; a provider whose file is missing is skipped, with a note.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from frugal.hardware.offers import Offer, modal_offers, offers_csv
from frugal.hardware.price_files import parse_skypilot
from frugal.hardware.refresh import SKYPILOT_FILES, parse_advisor, with_advisor
from frugal.hardware.sanity import errors, findings
from frugal.hardware.snapshot import header
from frugal.times import parse_time

HEAD = """\
# GPU offers: one row per instance type and region (the zone of the cheapest spot price kept).
# $/hour for the whole instance (all its GPUs). spot_usd_h empty = no spot capacity listed
# there (never "free"). GCP rows are host VM + GPU summed (GCP lists them apart).
# interruption: AWS Spot Instance Advisor bucket where it lists the instance and region, else
# the provider's default (providers.csv). Built by frugal.hardware.bundle from SkyPilot's
# catalog files (skypilot-org/skypilot-catalog; path and commit in each row's source).
"""


def build(
    catalogs: Path, commits: dict[str, str], advisor: Path | None, retrieved: str
) -> tuple[list[Offer], list[str]]:
    """The offers of every provider's file under `catalogs`, and notes of what was left out."""
    rows: list[Offer] = []
    notes = []
    for cloud, rel in SKYPILOT_FILES.items():
        path = catalogs / rel
        if not path.exists():
            notes.append(f"{cloud}: no {rel}, skipped")
            continue
        commit = commits.get(cloud, "")
        source = f"SkyPilot catalog {rel}" + (f" @{commit[:7]}" if commit else "")
        got = parse_skypilot(
            path.read_text(encoding="utf-8-sig"), str(path), cloud, retrieved, source
        )
        rows += got.offers
        if got.summary():
            notes.append(f"{cloud}: {got.summary()}")
    if advisor is not None:
        buckets = parse_advisor(advisor.read_text(), str(advisor))
        n = with_advisor(rows, buckets, f"({advisor.name})")
        notes.append(f"aws: {n} spot offers given their Spot Advisor bucket")
    # frugal loads these with Modal's offers (data/modal.csv): judged together
    modal = modal_offers(retrieved)
    wrong = errors(rows + modal)
    for key, why in sorted(wrong.items()):
        notes.append(f"left out, a price error: {' '.join(key)}: {why}")
    rows = [o for o in rows if o.key not in wrong]
    for key, why in sorted(findings(rows + modal).items()):
        notes.append(f"kept, a finding: {' '.join(key)}: {why}")
    return rows, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("catalogs", type=Path)
    ap.add_argument("--commit", action="append", default=[], help="CLOUD=SHA of its file")
    ap.add_argument("--advisor", type=Path, help="AWS spot-advisor-data.json")
    ap.add_argument("--retrieved", required=True, help="the day the files were read")
    a = ap.parse_args(argv)
    day = parse_time(a.retrieved)
    commits = dict(c.split("=", 1) for c in a.commit)
    offers, notes = build(a.catalogs, commits, a.advisor, a.retrieved)
    for n in notes:
        print(n, file=sys.stderr)
    source = "SkyPilot catalogs, commit per row"
    sys.stdout.write(header(day, source) + HEAD + offers_csv(offers))
    print(f"{len(offers)} offers of {len({o.provider for o in offers})} providers", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
