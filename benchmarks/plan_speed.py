"""How fast `frugal plan` answers: the bundled catalog for an 8B model, and 10,000 offers.

Each figure is the median of several runs. "cold" is a fresh process with an empty profile
cache: "before" with the shipped profiles off (FRUGAL_SHIPPED_PROFILES=off, the estimator
simulates every profile the search asks for, as before profiles shipped), "after" as a
user's first plan runs today; the unbundled model (the 8B config with one more vocabulary
row, as a local config.json) has no shipped profile, so it simulates either way. "warm"
reuses the profiles, so the time is the catalog search itself. The README's job is timed
warm twice in the same run: over the bundled catalog, and over the 54-offer catalog frugal
bundled until 2026-11-20 (benchmarks/data/offers-2026-11-20.csv, installed as a price
snapshot); the ratio is the cost of the broader catalog. The synthetic catalog repeats the
bundled offers with jittered prices under distinct instance names.
Usage: python benchmarks/plan_speed.py [--runs N]
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _configs import unbundled  # beside this script

from frugal.hardware.offers import bundled_offers

PLAN = ["plan", "meta-llama/Llama-3.1-8B", "--tokens", "20M", "--deadline", "24", "--json"]
README = [*PLAN[:4], "--methods", "lora,qlora", *PLAN[4:]]
OLD = Path(__file__).parent / "data" / "offers-2026-11-20.csv"


def run(args: list[str], cache: str, offers_dir: str | None = None, shipped: bool = True) -> float:
    env = {**os.environ, "FRUGAL_CACHE_DIR": cache}
    env["FRUGAL_SHIPPED_PROFILES"] = "on" if shipped else "off"
    if offers_dir:
        env["FRUGAL_OFFERS_DIR"] = offers_dir
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def _rows(path: Path) -> list[str]:
    """The offers of a catalog file: its lines that are neither comments nor the header."""
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")][1:]


def synthetic(path: str, n: int) -> None:
    base = bundled_offers()
    rng = random.Random(0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["provider", "instance", "gpu", "gpus", "ondemand_usd_h", "spot_usd_h", "region"]
        )
        for i in range(n):
            o = base[i % len(base)]
            j = rng.uniform(0.7, 1.3)
            spot = f"{o.spot_usd_h * j:.4f}" if o.spot_usd_h else ""
            w.writerow(
                [
                    o.provider,
                    f"{o.instance}-{i}",
                    o.gpu.name,
                    o.gpus,
                    f"{o.ondemand_usd_h * j:.4f}",
                    spot,
                    f"region-{i % 37}",
                ]
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    n = ap.parse_args().runs
    rows = []
    with tempfile.TemporaryDirectory() as d:
        run(["gpus", "--json"], d)  # page the installed packages in once

        def cold(args: list[str], shipped: bool = True) -> list[float]:
            times = []
            for _ in range(n):
                with tempfile.TemporaryDirectory() as cache:
                    times.append(run(args, cache, shipped=shipped))
            return times

        before, after = cold(README, shipped=False), cold(README)
        rows.append(("README job, cold, before (every profile simulated)", before, 3.0))
        rows.append(("README job, cold, after (shipped profiles)", after, 3.0))
        gain = statistics.median(before) / statistics.median(after)
        rows.append(("8B every method, cold, after (shipped profiles)", cold(PLAN), 3.0))
        rows.append(("README job, unbundled 8B config.json, cold", cold(
            [README[0], unbundled(PLAN[1], Path(d)), *README[2:]]), 5.0))  # fmt: skip
        cache = os.path.join(d, "cache")
        run(PLAN, cache)
        rows.append(("8B, bundled catalog, warm", [run(PLAN, cache) for _ in range(n)], 3.0))
        old = os.path.join(d, "old")
        os.makedirs(old)
        stamp = "# frugal offers snapshot\n# retrieved: 2026-11-20T00:00:00Z\n# source: old\n"
        Path(old, "offers.csv").write_text(stamp + OLD.read_text())
        run(README, cache, old)  # the old catalog's GPUs' profiles too
        was = [run(README, cache, old) for _ in range(n)]
        now = [run(README, cache) for _ in range(n)]
        rows.append((f"README job, warm, {len(_rows(OLD))} offers (until 2026-11-20)", was, 3.0))
        rows.append(("README job, warm, bundled catalog", now, 3.0))
        ratio = statistics.median(now) / statistics.median(was)
        big = os.path.join(d, "offers.csv")
        synthetic(big, 10_000)
        args = [*PLAN, "--prices", big]
        rows.append(("8B, 10,000 offers, warm", [run(args, cache) for _ in range(n)], 10.0))
    print("| case | median s | min s | max s | target s |\n|---|---|---|---|---|")
    for name, times, target in rows:
        print(
            f"| {name} | {statistics.median(times):.2f} | {min(times):.2f} | "
            f"{max(times):.2f} | <= {target:g} |"
        )
    print(f"README job, cold: before / after = {gain:.1f}x")
    print(f"README job: bundled catalog / old catalog = {ratio:.2f}x (target <= 1.5x)")
    print(f"({n} runs each, {os.cpu_count()} CPUs; bundled: {len(bundled_offers())} offers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
