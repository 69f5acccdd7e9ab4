"""frugal's spot interruption model against measured GPU spot preemptions.

The traces behind "Can't Be Late" (Wu et al., NSDI 2024; skypilot-org/spot-traces @221da1a)
held AWS V100 spot instances and recorded each preemption; benchmarks/data/
spot_traces_observed.csv holds the per-zone counts computed from them (preemptions per hour
held; "availability" sets are launch probes, a proxy). For each traced instance type and
zone the table prints the observed rate beside what frugal predicts from the AWS Spot
Advisor bucket of that instance type and region: before (the bucket read as a monthly
probability per instance) and now (the bucket scaled to the measured rate, frugal.plan.spot),
and the rate the plan uses (measured, where a trace covers the instance type).
Usage: python benchmarks/spot_check.py
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

from frugal.hardware.offers import HOURS_PER_MONTH, bundled_offers
from frugal.plan import spot

OBSERVED = Path(__file__).parent / "data" / "spot_traces_observed.csv"


def before(bucket: str) -> float:
    """The model until 2026-11-25: the bucket's midpoint as a monthly probability."""
    return -math.log1p(-spot.BUCKET_P[bucket]) / HOURS_PER_MONTH


def main() -> int:
    buckets = {(o.instance, o.region): o for o in bundled_offers() if o.provider == "aws"}
    print("| instance | zone | kind | held h | observed /h | Advisor bucket | before /h | "
          "bucket now /h | plan uses /h |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    ratios_before, ratios_now = [], []
    with OBSERVED.open() as f:
        for r in csv.DictReader(f):
            if "pooled" in r["region_or_zone"]:
                continue
            instance = r["instance_type"].split(" x")[0]
            zone = r["region_or_zone"]
            offer = buckets.get((instance, zone[:-1]))
            observed = float(r["preemptions_per_hour"])
            if offer is None or offer.spot_usd_h is None or observed == 0:
                continue
            old, now = before(offer.interruption), 1 / spot.mtbi_hours(offer.interruption)
            used = 1 / spot.offer_mtbi(offer)[0]
            ratios_before.append(old / observed)
            ratios_now.append(now / observed)
            kind = "availability" if "[availability" in r["source"] else "held"
            nodes = (
                " (" + r["instance_type"].split(" x")[1] + ")" if " x" in r["instance_type"] else ""
            )
            cells = (f"{instance}{nodes}", zone, kind, f"{float(r['held_hours']):,.0f}",
                     f"{observed:.3f}", offer.interruption, f"{old:.5f}", f"{now:.3f}",
                     f"{used:.3f}")  # fmt: skip
            print("| " + " | ".join(cells) + " |")
    print(
        f"\nmedian predicted / observed: before {statistics.median(ratios_before):.4f}, "
        f"now {statistics.median(ratios_now):.2f} ({len(ratios_now)} zone traces)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
