"""Predicted vs measured peak memory for every third-party row we can reproduce.

Reads benchmarks/data/measured_memory.csv, estimates each row with frugal's estimator and
compares like with like (allocated with allocated, reserved with reserved). Prints a
markdown table; `--write FILE` also writes it. Usage:

    python benchmarks/estimate_accuracy.py [--write docs/accuracy.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from frugal.estimate.core import estimate
from frugal.hardware.csvdata import data_rows
from frugal.models.specs import load_spec
from frugal.step.job import FIXED_4BIT_INPUT, make_job

DATA = Path(__file__).parent / "data" / "measured_memory.csv"
KIND_KEY = {
    "allocated": "peak_allocated_gib",
    "reserved": "peak_reserved_gib",
    "device": "device_total_gib",
}


def rows() -> list[dict[str, str]]:
    return [r for _, r in data_rows(DATA.read_text())]


def predict(r: dict[str, str]) -> tuple[float, float]:
    """(predicted, measured) in GiB for one row."""
    job = make_job(
        method=r["method"],
        precision=r["precision"],
        lora_targets=r["targets"],
        lora_r=int(r["rank"]),
        lora_alpha=int(r["alpha"]),
        batch=int(r["batch"]),
        seq=int(r["seq"]),
        grad_checkpointing=r["grad_checkpointing"] == "true",
        gpus=int(r["gpus"]),
        sharding=r["sharding"],
        bitsandbytes=r["bitsandbytes"] or FIXED_4BIT_INPUT,  # blank: a current release
    )
    est = estimate(load_spec(r["model"]), job).to_json()
    measured = float(r["measured"]) * (1e9 / 2**30 if r["unit"] == "GB" else 1.0)
    return float(est[KIND_KEY[r["kind"]]]), measured


def table() -> tuple[str, list[tuple[str, float]]]:
    out = [
        "| row | model | method | batch x seq | GPUs | kind | scope | measured GiB "
        "| predicted GiB | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    errors = []
    for r in rows():
        pred, meas = predict(r)
        err = (pred - meas) / meas
        errors.append((r["scope"], err))
        out.append(
            f"| {r['id']} | {r['model'].split('/')[-1]} | {r['method']} r{r['rank']} "
            f"{r['targets']} {r['precision']} | {r['batch']} x {r['seq']} | "
            f"{r['gpus']} {r['sharding'] if int(r['gpus']) > 1 else ''} | "
            f"{r['kind']} | {r['scope']} | "
            f"{meas:.2f} | {pred:.2f} | {err:+.1%} |"
        )
    return "\n".join(out), errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", type=Path, help="also write the table to this markdown file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    body, errors = table()
    summary = "\n"
    for scope in ("core", "all"):
        errs = [e for s, e in errors if scope == "all" or s == scope]
        summary += (
            f"{scope}: {len(errs)} rows, median |error| "
            f"{statistics.median(abs(e) for e in errs):.1%}, worst under-prediction "
            f"{min(errs):+.1%}, worst over-prediction {max(errs):+.1%}\n"
        )
    summary += f"({time.perf_counter() - t0:.0f} s)\n"
    print(body + summary)
    if args.write:
        from _docs import write_block  # beside this script

        write_block(args.write, "accuracy", f"{body}\n{summary.rstrip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
