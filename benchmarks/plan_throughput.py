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
from frugal.estimate.throughput import SpeedConstants, load_speed_constants, step_time
from frugal.hardware.csvdata import data_rows
from frugal.hardware.gpus import find_gpu
from frugal.models.specs import load_spec
from frugal.step.job import make_job

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


# Round values a reader would guess before seeing any measurement: the starting point of
# the cross-validation fits, so a held-out row never leaks in through the shipped constants.
PRIOR = SpeedConstants(
    eff_max_datacenter=0.5,
    eff_max_workstation=0.5,
    eff_max_consumer=0.5,
    t_half=64.0,
    launch_s_per_layer=0.002,
    dequant_eff=0.5,
    link_eff_nvlink=0.75,
    link_eff_pcie=0.5,
    overlap=0.5,
    elem_bytes=64.0,
    step_fixed_s=0.1,
)


def fit(
    cases: list[tuple[Any, ...]],
    measured: list[float],
    start: SpeedConstants | None = None,
    verbose: bool = True,
) -> SpeedConstants:
    """Coordinate descent on the mean |log error| over the given rows."""

    def loss(c: SpeedConstants) -> float:
        return statistics.mean(
            abs(math.log(predict(a, c) / m)) for a, m in zip(cases, measured, strict=True)
        )

    best = start or load_speed_constants()
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
    if verbose:
        print(f"fitted: mean |log error| {cur:.3f}", file=sys.stderr)
        for f in fields(SpeedConstants):
            print(f"  {f.name} = {getattr(best, f.name):.4g}", file=sys.stderr)
    return best


def cross_validate() -> str:
    """Out-of-sample errors: each row predicted by constants fitted without it.

    Leave-one-row-out refits on the other rows; leave-one-source-out refits without the
    row's whole source (its GPUs, framework and habits), the harder and more honest test.
    Both start from PRIOR, not from the shipped constants, which saw every row.
    """
    rs = rows()
    cases = [setup(r) for r in rs]
    measured = [float(r["tokens_per_s"]) for r in rs]

    def held_out(group: list[str]) -> list[float]:
        errors = [0.0] * len(rs)
        for g in dict.fromkeys(group):
            train = [i for i, x in enumerate(group) if x != g]
            c = fit([cases[i] for i in train], [measured[i] for i in train], PRIOR, verbose=False)
            for i, x in enumerate(group):
                if x == g:
                    errors[i] = predict(cases[i], c) / measured[i] - 1
        return errors

    lines = []
    for name, group in (
        ("in-sample (shipped constants)", None),
        ("leave one row out", [r["id"] for r in rs]),
        ("leave one source out", [r["source"] for r in rs]),
    ):
        errs = (
            [predict(a) / m - 1 for a, m in zip(cases, measured, strict=True)]
            if group is None
            else held_out(group)
        )
        by_source: dict[str, list[float]] = {}
        for r, e in zip(rs, errs, strict=True):
            by_source.setdefault(r["source"], []).append(abs(e))
        per = ", ".join(f"{s} {statistics.median(v):.0%}" for s, v in by_source.items())
        a = [abs(e) for e in errs]
        lines.append(
            f"| {name} | {statistics.median(a):.1%} | {sum(x <= 0.25 for x in a)}/{len(a)} "
            f"| {max(errs, key=abs):+.0%} | {per} |"
        )
    head = (
        "| constants fitted on | median abs error | within 25% | worst "
        "| median abs error by source |\n|---|---|---|---|---|\n"
    )
    return head + "\n".join(lines)


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
    ap.add_argument(
        "--cross-validate",
        action="store_true",
        help="also print out-of-sample errors (leave one row / one source out)",
    )
    args = ap.parse_args()
    t = time.perf_counter()
    cv = cross_validate() if args.cross_validate else ""
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
    if cv:
        print()
        print(cv)
    if args.write:
        from _docs import write_block  # beside this script

        write_block(args.write, "speed", f"{text}\n\n{summary}")
        if cv:
            write_block(args.write, "speed-cv", cv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
