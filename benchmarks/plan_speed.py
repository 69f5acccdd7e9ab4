"""How fast `frugal plan` answers: the bundled catalog for an 8B model, and 10,000 offers.

Each figure is the median of several runs. "cold" is a fresh process with an empty profile
cache (the estimator simulates the model first); "warm" reuses the profiles, so the time is
the catalog search itself. The synthetic catalog repeats the bundled offers with jittered
prices under distinct instance names. Usage: python benchmarks/plan_speed.py [--runs N]
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

PLAN = ["plan", "meta-llama/Llama-3.1-8B", "--tokens", "20M", "--deadline", "24", "--json"]


def run(args: list[str], cache: str) -> float:
    env = {**os.environ, "FRUGAL_CACHE_DIR": cache}
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def synthetic(path: str, n: int) -> None:
    from frugal.hardware.offers import bundled_offers

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
    ap.add_argument("--runs", type=int, default=3)
    n = ap.parse_args().runs
    rows = []
    with tempfile.TemporaryDirectory() as d:
        run(["gpus", "--json"], d)  # page the installed packages in once
        cold = []
        for _ in range(n):
            with tempfile.TemporaryDirectory() as cache:
                cold.append(run(PLAN, cache))
        rows.append(("8B, bundled catalog, cold (empty profile cache)", cold, 3.0))
        cache = os.path.join(d, "cache")
        run(PLAN, cache)
        rows.append(("8B, bundled catalog, warm", [run(PLAN, cache) for _ in range(n)], 3.0))
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
    print(f"({n} runs each, {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
