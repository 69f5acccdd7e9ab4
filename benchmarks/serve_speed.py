"""How fast `frugal serve` answers: one estimate, a plan over the bundled catalog, and the
whole `serve plan` and `tco` commands in a fresh process.

Each figure is over several runs (median, min, max). Usage:
    python benchmarks/serve_speed.py [--runs N] [--write docs/serve.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from frugal.hardware.catalog import select_offers
from frugal.hardware.gpus import find_gpu
from frugal.models.specs import load_spec
from frugal.serve.engines import find_engine
from frugal.serve.estimate import Deployment, estimate
from frugal.serve.plan import ServeAsk, plan
from frugal.serve.speed import Load
from frugal.serve.weights import find_format

sys.path.insert(0, str(Path(__file__).parent))
from _docs import timing_table, write_block

LOAD = ["--rate", "20", "--input-len", "1000", "--output-len", "200", "--ttft-ms", "500"]
MODEL = "meta-llama/Llama-3.1-8B"


def timed(f: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return out


def command(args: list[str]) -> Callable[[], object]:
    return lambda: subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", *args, "--json"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--write", type=Path, help="markdown file whose serve-speed block to replace")
    args = ap.parse_args()
    spec, offers = load_spec(MODEL), select_offers()
    d = Deployment(spec, find_gpu("H100"), 1, find_engine("vllm"), find_format("bf16"))
    ask = ServeAsk(spec, 20, 1000, 200, ttft_s=0.5)
    rows = [
        ("100 estimates of one deployment at a rate (in process)",
         timed(lambda: [estimate(d, 1000, 200, Load(rate=20)) for _ in range(100)], args.runs),
         "-"),
        ("plan over the bundled catalog (in process)", timed(lambda: plan(ask, offers), args.runs),
         "1"),
        ("`frugal serve plan` (new process)", timed(command(["serve", "plan", MODEL, *LOAD]),
                                                    args.runs), "3"),
        ("`frugal tco` (new process, no training)",
         timed(command(["tco", MODEL, *LOAD, "--providers", "aws"]), args.runs), "3"),
    ]  # fmt: skip
    text = timing_table(
        f"`python benchmarks/serve_speed.py --runs {args.runs}` ({MODEL}, 20 requests/s):",
        "case",
        rows,
    )
    print(text)
    if args.write:
        write_block(args.write, "serve-speed", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
