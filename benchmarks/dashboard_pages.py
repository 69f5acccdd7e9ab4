"""How fast the dashboard's pages answer with 10,000 runs in the ledger.

A SQLite ledger (in a temp dir) is filled as `ledger_report.py` fills it (runs over 90
days with tags, other costs) plus a budget and a recorded plan; each page is timed as a
browser loads it: its HTML, then the API call its script makes (through FastAPI's test
client, in process: no network in the figure). Median of --runs, after one warm-up.
Usage: python benchmarks/dashboard_pages.py [--runs 7] [--n 10000] [--write docs/dashboard.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _docs import timing_table  # beside this script
from ledger_report import fill, timed

TARGET_S = 0.3
PLAN = {"method": "lora", "provider": "runpod", "instance": "1x A100 80GB", "region": "",
        "gpu": "A100 80GB", "gpus": 1, "spot": False, "price_per_hour_usd": 1.19,
        "est_hours": 3.0, "est_cost_usd": 3.57}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--write", type=Path, help="Put the table into this Markdown file.")
    args = ap.parse_args()
    from fastapi.testclient import TestClient

    from frugal.ledger import budgets as B
    from frugal.ledger.store import Ledger
    from frugal.web.app import create_app

    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/ledger.sqlite"
        fill(url, args.n, datetime.now(UTC))
        led = Ledger(url)
        B.set_budget(led, "nlp", 5000.0, "month", {"team": "nlp"})
        plan_id = led.record_plan({"recommendation": PLAN, "frontier": [PLAN], "rejected": []},
                                  "meta-llama/Llama-3.1-8B", 2e7, {"project": "p"})  # fmt: skip
        run_id = led.runs()[-1].id
        c = TestClient(create_app(url))

        def page(html: str, api: str) -> object:
            def load() -> None:
                for path in (html, api):
                    r = c.get(path)
                    assert r.status_code == 200, (path, r.status_code)

            return load

        cases = [
            ("Overview (`/`, `/api/overview`)", page("/", "/api/overview")),
            ("Runs (`/runs`, `/api/runs`, 200 newest)", page("/runs", "/api/runs")),
            ("Run (`/runs/ID`, `/api/runs/ID`)", page(f"/runs/{run_id}", f"/api/runs/{run_id}")),
            ("Budgets (`/budgets`, `/api/budgets`)", page("/budgets", "/api/budgets")),
            ("Plan (`/plans/ID`, `/api/plans/ID`)",
             page(f"/plans/{plan_id}", f"/api/plans/{plan_id}")),
            ("Calibration (`/calibration`, `/api/calibration`, 2,000 newest)",
             page("/calibration", "/api/calibration")),
        ]  # fmt: skip
        rows = [(name, timed(fn, args.runs)) for name, fn in cases]  # type: ignore[arg-type]
    table = timing_table(
        f"{args.n:,} runs in SQLite, each page's HTML and its API call, median of {args.runs} "
        "(`python benchmarks/dashboard_pages.py`):",
        "page",
        [(n, ts, f"< {TARGET_S:g}") for n, ts in rows],
    )
    print(table)
    if args.write:
        from _docs import write_block

        write_block(args.write, "dashboard-pages", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
