"""How fast `frugal estimate` answers, from a cold start and from a cached profile.

Each figure is the median of several runs of the whole command in a fresh process (Python
start-up and imports included). "cold" uses an empty profile cache; "cached" asks an
already profiled model for another (batch, seq), both as a whole command and as the library
call alone. One unmeasured run first pages the installed packages into the OS file cache, so
every case starts as it would on a machine where frugal has run before.
Usage: python benchmarks/estimate_speed.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = [
    ("8B QLoRA, cold", ["meta-llama/Llama-3.1-8B", "--method", "qlora"], 5.0),
    ("70B QLoRA, cold", ["meta-llama/Llama-3.1-70B", "--method", "qlora"], 10.0),
    (
        "70B full FSDP x8, cold",
        ["meta-llama/Llama-3.1-70B", "--method", "full", "--gpus", "8", "--sharding", "fsdp"],
        10.0,
    ),
]


def run(args: list[str], cache: str) -> float:
    env = {**os.environ, "FRUGAL_CACHE_DIR": cache}
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", "estimate", *args, "--json"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


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
    ap.add_argument("--runs", type=int, default=3)
    n = ap.parse_args().runs
    rows = []
    with tempfile.TemporaryDirectory() as cache:  # page the installed files in, once
        run(["HuggingFaceTB/SmolLM2-135M"], cache)
    for name, args, target in CASES:
        times = []
        for _ in range(n):
            with tempfile.TemporaryDirectory() as cache:
                times.append(run(args, cache))
        rows.append((name, statistics.median(times), min(times), max(times), target))
    with tempfile.TemporaryDirectory() as cache:
        run(["meta-llama/Llama-3.1-8B", "--method", "qlora"], cache)
        warm = [
            run(
                ["meta-llama/Llama-3.1-8B", "--method", "qlora", "--batch", "3", "--seq", "3000"],
                cache,
            )
            for _ in range(n)
        ]
        rows.append(
            (
                "8B QLoRA, another (batch, seq), whole command",
                statistics.median(warm),
                min(warm),
                max(warm),
                None,
            )
        )
        lib = library_call(cache)
        rows.append(("8B QLoRA, another (batch, seq), library call", lib, lib, lib, 0.05))
    print("| case | median s | min s | max s | target s |\n|---|---|---|---|---|")
    for name, med, lo, hi, target in rows:
        tgt = f"<= {target:g}" if target else "-"
        print(f"| {name} | {med:.3f} | {lo:.3f} | {hi:.3f} | {tgt} |")
    print(f"({n} runs each, {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
