"""How fast the ledger's reports answer over 100,000 recorded runs.

A SQLite ledger (in a temp dir) is filled through SQLAlchemy core with N runs over the last
90 days (tags project, team and model; outcomes, GPUs, providers, methods varied; most with
an estimate) and N/20 other costs, 5% of them matched to runs. Each report is timed in
process on the whole history (`--period all`, the largest) as `frugal costs report` computes
it, without printing: the median of --runs runs each, after one warm-up.
The last rows time the whole command in a new process, and the CLI's start-up alone.
Usage: python benchmarks/ledger_report.py [--runs 5] [--n 100000] [--write docs/ledger.md]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _docs import timing_table  # beside this script

TARGET_S = 1.0
OUTCOMES = [("completed", 0.8), ("failed", 0.08), ("preempted", 0.06), ("budget-stopped", 0.03),
            ("idle-stopped", 0.02), (None, 0.01)]  # fmt: skip
GPUS = [("H100 SXM", 3.0), ("A100 80GB", 1.8), ("L40S", 1.0), ("RTX 4090", 0.4)]
PROVIDERS = ["aws", "runpod", "lambda", "gcp", "local"]
MODELS = ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B", "mistralai/Mistral-7B-v0.3",
          "meta-llama/Llama-3.2-1B"]  # fmt: skip
PROJECTS = [f"project-{i}" for i in range(20)]
TEAMS = ["nlp", "vision", "search", "ads", "research", "platform"]


def fill(url: str, n: int, now: datetime) -> None:
    from sqlalchemy import insert

    from frugal.ledger.schema import CostEntry, RunRecord, Tag
    from frugal.ledger.store import Ledger

    rng = random.Random(0)
    led = Ledger(url)
    runs, tags, costs = [], [], []
    outcomes, weights = zip(*OUTCOMES, strict=True)
    for _ in range(n):
        rid = str(uuid.UUID(int=rng.getrandbits(128)))
        start = now - timedelta(days=90 * rng.random())
        gpu, price = rng.choice(GPUS)
        gpus = rng.choice([1, 1, 1, 2, 4, 8])
        hours = rng.lognormvariate(0.5, 1.0)
        cost = hours * price * gpus
        est = cost * rng.lognormvariate(0, 0.25) if rng.random() < 0.9 else None
        outcome = rng.choices(outcomes, weights)[0]
        end = start + timedelta(hours=hours)
        runs.append({
            "id": rid, "plan_id": None, "started_at": start, "heartbeat_at": end,
            "ended_at": end if outcome else None, "outcome": outcome, "dry_run": False,
            "model": rng.choice(MODELS), "method": rng.choice(["lora", "qlora", "full"]),
            "provider": rng.choice(PROVIDERS), "instance": f"{gpus}x {gpu}", "region": "",
            "gpu": gpu, "gpus": gpus, "spot": rng.random() < 0.3, "price_per_hour_usd": price,
            "step": 1000, "tokens": hours * 3.6e6, "cost_usd": cost, "hours": hours,
            "config": {}, "predicted": {}, "actual": {}, "output_dir": "", "est_hours": None,
            "resource_id": f"host-{rng.randrange(500)}", "est_cost_usd": est,
        })  # fmt: skip
        for key, values in (("project", PROJECTS), ("team", TEAMS), ("model", MODELS)):
            tags.append({"kind": "run", "ref": rid, "key": key, "value": rng.choice(values)})
    for i in range(n // 20):
        at = now - timedelta(days=90 * rng.random())
        run = runs[rng.randrange(n)]["id"] if rng.random() < 0.05 else None
        costs.append({
            "id": i + 1, "at": at, "kind": rng.choice(["storage", "compute", "network"]),
            "amount_usd": rng.lognormvariate(2, 1), "description": "", "resource_id": "",
            "source": "benchmark", "run_id": run, "provider": rng.choice(PROVIDERS),
            "gpu_hours": 0.0, "period_end": at + timedelta(days=1),
        })  # fmt: skip
        tags.append({"kind": "cost", "ref": str(i + 1), "key": "team", "value": rng.choice(TEAMS)})
    with led.engine.begin() as conn:
        for table, rows in ((RunRecord, runs), (CostEntry, costs), (Tag, tags)):
            for i in range(0, len(rows), 10_000):
                conn.execute(insert(table.__table__), rows[i : i + 10_000])  # type: ignore[attr-defined]


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    fn()  # warm: the first query pages the file in
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--write", type=Path, help="Put the table into this Markdown file.")
    args = ap.parse_args()
    from frugal.ledger import report as rep
    from frugal.ledger.store import Ledger

    now = datetime.now(UTC)
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/ledger.sqlite"
        t = time.perf_counter()
        fill(url, args.n, now)
        print(f"filled {args.n:,} runs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        led = Ledger(url)

        def groups(by: str) -> Callable[[], Any]:
            return lambda: rep.report(led, by=by, period="all", at=now, extras=False)

        def in_session(fn: Callable[..., Any]) -> Callable[[], Any]:
            def call() -> Any:
                with led.session() as s:
                    return fn(s)

            return call

        cases: list[tuple[str, Callable[[], Any]]] = [
            ("report --by project", groups("project")),
            ("report --by tag:team", groups("tag:team")),
            ("report --by gpu", groups("gpu")),
            ("report --by model (tag, else the run's)", groups("model")),
            ("month-end projection", in_session(lambda s: rep.projection(s, now))),
            ("anomalies, 90 days", in_session(lambda s: rep.anomalies(s, None, None, now))),
            ("showback, last week", lambda: rep.showback(led, "last", now).to_markdown()),
            ("report --by project, with projection and anomalies",
             lambda: rep.report(led, by="project", period="all", at=now)),
        ]  # fmt: skip
        rows = [(name, timed(fn, args.runs)) for name, fn in cases]
        env = {**os.environ, "FRUGAL_DB_URL": url}

        def command(*argv: str) -> Callable[[], Any]:
            cmd = [sys.executable, "-m", "frugal.cli.main", *argv]
            return lambda: subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)

        rows += [
            ("`frugal costs report --period all --json`, a new process",
             timed(command("costs", "report", "--period", "all", "--json"), args.runs)),
            ("`frugal --help`, a new process (the start-up alone)",
             timed(command("--help"), args.runs)),
        ]  # fmt: skip
    table = timing_table(
        f"{args.n:,} runs and {args.n // 20:,} other costs over 90 days in SQLite, the whole "
        f"history, median of {args.runs} runs (`python benchmarks/ledger_report.py`):",
        "report",
        [(n, ts, "" if "process" in n else f"< {TARGET_S:g}") for n, ts in rows],
    )
    print(table)
    if args.write:
        from _docs import write_block

        write_block(args.write, "ledger-report", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
