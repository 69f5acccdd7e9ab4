"""Every bundled model answers with defaults, and fast: a first `frugal estimate` and a first
`frugal plan` of each, cold.

Each figure is the median of several runs of a fresh process with an empty profile cache
(the shipped profiles on, as a user's first command finds them): `frugal estimate MODEL`
and `frugal plan MODEL --tokens 20M` over the bundled catalog, everything else at its
default. A command that exits non-zero is a failure (an error is never an answer); a plan
that finds nothing (exit 2, "nothing fits", a 671B model on the catalog's largest machine)
is an answer and says so. The target (issue 42): at most 3 s for a cold plan.

Usage: python benchmarks/bundled_cold.py [--runs 5] [MODEL ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_S = 3.0


def timed(args: list[str]) -> tuple[float, int, str]:
    """Seconds, exit code and last stderr line of one cold run of `frugal ARGS`."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "FRUGAL_CACHE_DIR": cache, "FRUGAL_SHIPPED_PROFILES": "on"}
        t = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "frugal.cli.main", *args, "--json"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        took = time.perf_counter() - t
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return took, done.returncode, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="*", help="bundled model ids (default: every one)")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    from frugal.models.specs import bundled_model_ids

    models = a.models or bundled_model_ids()
    print("| model | estimate (s) | plan (s) | plan answer |")
    print("|---|---:|---:|---|")
    worst, failed = 0.0, []
    for model in models:
        medians, answer = [], ""
        for args in (["estimate", model], ["plan", model, "--tokens", "20M"]):
            runs = [timed(args) for _ in range(a.runs)]
            medians.append(statistics.median(t for t, _, _ in runs))
            rc, last = runs[0][1], runs[0][2]
            if rc == 2 and last.startswith("error: nothing fits"):
                answer = "nothing fits the catalog"
            elif rc != 0:
                failed.append(f"{' '.join(args)}: exit {rc}: {last}")
                answer = f"exit {rc}"
        worst = max(worst, medians[1])
        print(f"| {model} | {medians[0]:.2f} | {medians[1]:.2f} | {answer or 'a plan'} |")
    print(f"\nslowest cold plan: {worst:.2f} s (target {TARGET_S:g} s); "
          f"{len(failed)} commands failed")  # fmt: skip
    for f in failed:
        print(f"  {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
