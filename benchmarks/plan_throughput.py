"""Predicted vs measured training throughput for every third-party row we can reproduce.

Reads benchmarks/data/measured_speed.csv, predicts tokens/s with frugal's throughput model
(the estimator's FLOPs and bytes on the row's GPU) and prints a markdown table with the
error of each row. `--write FILE` replaces the table between the accuracy markers of FILE.

    python benchmarks/plan_throughput.py [--write docs/plan.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from frugal.estimate.core import get_profile
from frugal.estimate.job import make_job
from frugal.hardware.csvdata import data_rows
from frugal.hardware.gpus import find_gpu
from frugal.models.specs import load_spec
from frugal.plan.throughput import SpeedConstants, load_speed_constants, step_time

HERE = Path(__file__).parent
DATA = HERE / "data" / "measured_speed.csv"


def rows() -> list[dict[str, str]]:
    return [r for _, r in data_rows(DATA.read_text())]


def setup(r: dict[str, str]) -> tuple[Any, ...]:
    lora = {}
    if r["method"] != "full":
        lora = {"lora_targets": r["targets"], "lora_r": int(r["rank"])}
    job = make_job(
        method=r["method"],
        precision=r["precision"],
        batch=int(r["batch"]),
        seq=int(r["seq"]),
        grad_accum=int(r["grad_accum"]),
        grad_checkpointing=r["grad_checkpointing"] == "true",
        attention=r["attention"],
        gpus=int(r["gpus"]),
        sharding=r["sharding"],
        **lora,
    )
    model = r["model"]
    if model.startswith("benchmarks/"):
        model = str(HERE.parent / model)
    spec = load_spec(model)
    return get_profile(spec, job, job.seq), job, find_gpu(r["gpu"]), spec.hidden_size


def predict(args: tuple[Any, ...], c: SpeedConstants | None = None) -> float:
    speed = step_time(*args, c=c)
    assert speed is not None
    return speed.tokens_per_s


def fit(cases: list[tuple[Any, ...]], measured: list[float]) -> SpeedConstants:
    """Coordinate descent on the mean |log error| over all rows (in-sample)."""

    def loss(c: SpeedConstants) -> float:
        return statistics.mean(
            abs(math.log(predict(a, c) / m)) for a, m in zip(cases, measured, strict=True)
        )

    best = load_speed_constants()
    cur = loss(best)
    for _ in range(4):
        for f in fields(SpeedConstants):
            base = getattr(best, f.name)
            for scale in (0.5, 0.7, 0.85, 1.15, 1.4, 2.0):
                trial = replace(best, **{f.name: base * scale})
                if f.name.startswith(("eff", "link_eff", "overlap", "dequant")) and (
                    getattr(trial, f.name) > 1
                ):
                    continue
                v = loss(trial)
                if v < cur - 1e-4:
                    best, cur = trial, v
    print(f"fitted: mean |log error| {cur:.3f}", file=sys.stderr)
    for f in fields(SpeedConstants):
        print(f"  {f.name} = {getattr(best, f.name):.4g}", file=sys.stderr)
    return best


def table(c: SpeedConstants | None = None) -> tuple[str, list[float]]:
    out = [
        "| row | model | method | batch x seq x accum | GPUs | measured tok/s "
        "| predicted tok/s | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    errors = []
    for r in rows():
        pred = predict(setup(r), c)
        meas = float(r["tokens_per_s"])
        err = pred / meas - 1
        errors.append(err)
        model = Path(r["model"]).stem if r["model"].startswith("benchmarks/") else r["model"]
        out.append(
            f"| {r['id']} | {model.split('/')[-1]} | {r['method']} | "
            f"{r['batch']} x {r['seq']} x {r['grad_accum']} | {r['gpus']}x {r['gpu']} "
            f"{r['sharding'] if int(r['gpus']) > 1 else ''} | {meas:,.0f} | {pred:,.0f} | "
            f"{err:+.1%} |"
        )
    return "\n".join(out), errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", type=Path, help="markdown file whose speed table to replace")
    ap.add_argument("--fit", action="store_true", help="fit the constants and print them")
    args = ap.parse_args()
    t = time.perf_counter()
    c = None
    if args.fit:
        rs = rows()
        c = fit([setup(r) for r in rs], [float(r["tokens_per_s"]) for r in rs])
    text, errors = table(c)
    abs_err = [abs(e) for e in errors]
    summary = (
        f"{len(errors)} rows: median |error| {statistics.median(abs_err):.1%}, "
        f"within 25%: {sum(e <= 0.25 for e in abs_err)}/{len(errors)}, "
        f"worst {max(errors, key=abs):+.1%}\n({time.perf_counter() - t:.0f} s)"
    )
    print(text)
    print()
    print(summary)
    if args.write:
        from _docs import write_block  # beside this script

        write_block(args.write, "speed", f"{text}\n\n{summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
