"""How fast `frugal estimate` answers from a cold start, and what one simulation costs.

Each figure is the median of several runs of the whole command in a fresh process (Python
start-up and imports included) with an empty profile cache. "before" turns the shipped
profiles off (FRUGAL_SHIPPED_PROFILES=off: every profile is simulated, as before they
shipped); "after" is what a user's first command does today. An unbundled model is a bundled
config with one more vocabulary row, given as a local config.json: no profile ships for it,
so before and after both simulate. The simulation tables: the time per simulated op of
one profile, each in a fresh process, on torch's fake tensors (what the simulation ran on
before phantoms) and on phantoms; and, from `--verbose`, the ops and time per op of the
profiles the commands above simulated. "warm" asks an already profiled model for another
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
# one profile's simulation (two depths, three lengths) in a fresh process, on the tensors
# given: torch's fake tensors (the simulation before phantoms) or phantoms; the model is
# built once before the clock starts, so the imports it pays are not counted as ops
ONE_PROFILE = """
import sys, time
from frugal.estimate.core import base_length
from frugal.estimate.profile import grid
from frugal.estimate.simulate import simulate
from frugal.models.specs import load_spec
from frugal.step.job import make_job
from frugal.step.model import build_model
model, method, tensors = sys.argv[1:]
spec = load_spec(model)
job = make_job(method=method)
shapes = grid(base_length(spec, job.seq))
build_model(spec.config, job, "meta", n_layers=1)
t = time.perf_counter()
runs = [simulate(spec.config, job, n, shapes, tensors=tensors) for n in (1, 2)]
print(sum(len(tr.op_ids) - 1 for traces in runs for tr in traces), time.perf_counter() - t)
"""
PER_OP = [
    ("meta-llama/Llama-3.1-8B", "lora"),
    ("meta-llama/Llama-3.1-8B", "qlora"),
    ("meta-llama/Llama-3.1-70B", "qlora"),
    ("mistralai/Mixtral-8x7B-v0.1", "qlora"),
]


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


def per_op(model: str, method: str, tensors: str, n: int) -> tuple[int, float]:
    """Ops of one profile's simulation and the median seconds per op, each run cold."""
    times, ops = [], 0
    for _ in range(n):
        done = subprocess.run(
            [sys.executable, "-c", ONE_PROFILE, model, method, tensors],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        ops, secs = done.stdout.split()
        times.append(float(secs) / int(ops))
    return int(ops), statistics.median(times)


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
    print("\n| time per simulated op, cold | ops | fake tensors ms | phantoms ms | ratio |")
    print("|---|---|---|---|---|")
    for model, method in PER_OP:
        ops, fake = per_op(model, method, "fake", n)
        _, phantom = per_op(model, method, "phantom", n)
        print(f"| {model} {method} | {ops:,} | {fake * 1e3:.3f} | {phantom * 1e3:.3f} | "
              f"{fake / phantom:.1f}x |")  # fmt: skip
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
