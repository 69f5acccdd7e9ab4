"""How fast `frugal estimate` answers from a cold start, and what one simulation costs.

Each figure is the median of several runs of the whole command in a fresh process (Python
start-up and imports included) with an empty profile cache. "before" turns the shipped
profiles off (FRUGAL_SHIPPED_PROFILES=off: every profile is simulated, as before they
shipped); "after" is what a user's first command does today. An unbundled model is a bundled
config with one more vocabulary row, given as a local config.json: no profile ships for it,
so before and after both simulate. The simulation table reads `--verbose`: ops per
simulated profile and the time per op. "warm" asks an already profiled model for another
(batch, seq). One unmeasured run first pages the installed packages into the OS file cache.
Usage: python benchmarks/estimate_speed.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _configs import unbundled  # beside this script

CASES = [
    ("8B QLoRA, bundled", ["meta-llama/Llama-3.1-8B", "--method", "qlora"], 3.0),
    ("70B QLoRA, bundled", ["meta-llama/Llama-3.1-70B", "--method", "qlora"], 4.0),
    ("70B full FSDP x8, bundled",
     ["meta-llama/Llama-3.1-70B", "--method", "full", "--gpus", "8", "--sharding", "fsdp"], 4.0),
    ("70B QLoRA, unbundled config.json", ["@meta-llama/Llama-3.1-70B", "--method", "qlora"], 4.0),
]  # fmt: skip
SIMULATED = re.compile(r"^simulated (\S+) (.*): .* ([\d,]+) ops in ([\d.]+) s", re.M)


def run(cmd: list[str], cache: str, shipped: bool = True) -> tuple[float, str]:
    env = {**os.environ, "FRUGAL_CACHE_DIR": cache}
    env["FRUGAL_SHIPPED_PROFILES"] = "on" if shipped else "off"
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", "--verbose", "estimate", *cmd, "--json"],
        check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return time.perf_counter() - t, done.stderr


def cold(cmd: list[str], n: int, shipped: bool) -> tuple[list[float], str]:
    times, said = [], ""
    for _ in range(n):
        with tempfile.TemporaryDirectory() as cache:
            t, said = run(cmd, cache, shipped)
            times.append(t)
    return times, said


def library_call(cache: str) -> float:
    os.environ["FRUGAL_CACHE_DIR"] = cache
    from frugal.estimate.core import estimate
    from frugal.models.specs import load_spec
    from frugal.step.job import make_job

    spec = load_spec("meta-llama/Llama-3.1-8B")
    times = []
    for b, s in [(2, 1024), (3, 3000), (5, 777), (8, 4096), (1, 8192)]:
        t = time.perf_counter()
        estimate(spec, make_job(method="qlora", batch=b, seq=s))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    n = ap.parse_args().runs
    with tempfile.TemporaryDirectory() as cache:  # page the installed files in, once
        run(["HuggingFaceTB/SmolLM2-135M"], cache)
    root = Path(tempfile.mkdtemp())
    print("| cold `frugal estimate` | before s | after s | ratio | target s |")
    print("|---|---|---|---|---|")
    sims: list[tuple[str, str, int, float]] = []
    for name, args, target in CASES:
        cmd = [unbundled(args[0][1:], root), *args[1:]] if args[0][0] == "@" else args
        before, said = cold(cmd, n, shipped=False)
        after, _ = cold(cmd, n, shipped=True)
        sims += [(m[1], m[2], int(m[3].replace(",", "")), float(m[4]))
                 for m in SIMULATED.finditer(said)]  # fmt: skip
        b, a = statistics.median(before), statistics.median(after)
        print(f"| {name} | {b:.2f} | {a:.2f} | {b / a:.1f}x | <= {target:g} |")
    print("\n| one simulated profile (2 depths x 3 lengths) | ops | s | ms per op |")
    print("|---|---|---|---|")
    for model, job, ops, secs in sims:
        print(f"| {model} {job} | {ops:,} | {secs:.2f} | {secs / ops * 1e3:.3f} |")
    with tempfile.TemporaryDirectory() as cache:
        base = ["meta-llama/Llama-3.1-8B", "--method", "qlora"]
        run(base, cache)
        warm = [run([*base, "--batch", "3", "--seq", "3000"], cache)[0] for _ in range(n)]
        lib = library_call(cache)
    print(f"\nwarm, another (batch, seq): whole command {statistics.median(warm):.2f} s, "
          f"library call {lib * 1e3:.1f} ms (target <= 50 ms)")  # fmt: skip
    print(f"({n} runs each, {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
