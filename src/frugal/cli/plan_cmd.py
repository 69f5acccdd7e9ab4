"""`frugal plan MODEL`: the cheapest GPU, provider and configuration that fits in time."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from frugal.cli.estimate_cmd import field_help
from frugal.data.count import count_tokens
from frugal.durations import parse_duration
from frugal.errors import FrugalError
from frugal.files import write_text_atomic
from frugal.hardware.gpus import MARGIN
from frugal.hardware.offers import KWH_USD, select_offers
from frugal.models.specs import load_spec
from frugal.plan.emit import hf_script, skypilot_task, to_run_config
from frugal.plan.plot import check_plot_path, write_plot
from frugal.plan.relax import Ask, explain
from frugal.plan.search import Constraints, Infeasible, search
from frugal.step.job import make_job


def _si(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def _parse_tokens(s: str) -> float:

    mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}
    t = s.strip().lower().replace("_", "").replace(",", "")
    try:
        v = float(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else float(t)
    except ValueError:
        v = -1
    if v <= 0:
        raise FrugalError(f"--tokens {s!r}: give a positive count like 20M or 2e7")
    return v


def _hours(flag: str, value: str | None) -> float | None:

    try:
        return None if value is None else parse_duration(value, "h")
    except ValueError as e:
        raise FrugalError(f"{flag} {e}") from None


def plan(
    model: str = typer.Argument(..., help="Bundled hub id, local dir or config.json, or hub id."),
    tokens: str | None = typer.Option(None, help="Training tokens per epoch, e.g. 20M."),
    dataset: str | None = typer.Option(None, help="Or: a .jsonl/.csv/.parquet file to count."),
    epochs: float = typer.Option(1.0, help="Passes over the data."),
    seq: int = typer.Option(2048, help=field_help("seq")),
    effective_batch: int = typer.Option(16, help="Sequences per optimizer step, all GPUs."),
    method: str = typer.Option("lora", help=field_help("method")),
    methods: str | None = typer.Option(None, help="Methods to compare, e.g. lora,qlora."),
    precision: str = typer.Option("bf16-mixed", help=field_help("precision")),
    optimizers: str = typer.Option(
        "adamw,adamw-8bit", help="Optimizers to try for full fine-tuning."
    ),
    lora_r: int | None = typer.Option(None, help=field_help("lora_r") + " [default: 16]"),
    lora_targets: str | None = typer.Option(None, help=field_help("lora_targets")),
    attention: str = typer.Option("sdpa", help=field_help("attention")),
    packing: bool = typer.Option(True, help=field_help("packing")),
    loss: str = typer.Option("ce", help=field_help("loss")),
    budget: float | None = typer.Option(None, help="Most you will spend, USD."),
    deadline: str | None = typer.Option(
        None, help="Time until the run must be done: 24h, 90m, 2d, 1h30m (a number is hours)."
    ),
    max_gpus: int = typer.Option(64, help="Most GPUs in one run."),
    providers: str | None = typer.Option(None, help="Comma-separated providers to consider."),
    spot: bool | None = typer.Option(
        None, "--spot/--no-spot", help="Only spot, or never spot [default: both]."
    ),
    spot_mtbi_hours: str | None = typer.Option(
        None,
        help="Mean time between spot interruptions, e.g. 12h or 3d (a number is hours; "
        "overrides the offers' buckets).",
    ),
    optimize: str = typer.Option("cost", help="Objective: cost or time."),
    margin: float = typer.Option(MARGIN, help="Share of usable GPU memory kept free."),
    prices: list[str] | None = typer.Option(
        None, help="Your own price CSV (or a SkyPilot vms.csv)."
    ),
    discount: list[str] | None = typer.Option(None, help="PROVIDER=PERCENT off, e.g. aws=15."),
    local: list[str] | None = typer.Option(None, help="Your own GPUs, e.g. '2x RTX 4090'."),
    kwh_usd: float = typer.Option(KWH_USD, help="Electricity price for --local, $/kWh."),
    write: str | None = typer.Option(None, help="Write the run config for `frugal train`."),
    emit: str | None = typer.Option(
        None, help="hf (a transformers Trainer script) or skypilot (a task YAML)."
    ),
    emit_file: str | None = typer.Option(
        None, help="Where --emit writes [default: train_hf.py for hf, sky.yaml for skypilot]."
    ),
    plot: str | None = typer.Option(
        None, help="Chart cost vs time: FILE.png/.svg/.pdf (matplotlib) or FILE.html."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The cheapest (or fastest) plan that fits and meets the deadline, with its reasons."""

    if (tokens is None) == (dataset is None):
        raise FrugalError("give the amount of training: --tokens N or --dataset FILE")
    if epochs <= 0:
        raise FrugalError("--epochs must be positive")
    if optimize not in ("cost", "time"):
        raise FrugalError(f"--optimize {optimize!r}: use cost or time")
    if emit not in (None, "hf", "skypilot"):
        raise FrugalError(f"--emit {emit!r}: use hf or skypilot")
    if plot:
        check_plot_path(plot)
    if budget is not None and budget <= 0:
        raise FrugalError("--budget must be positive")
    deadline_h = _hours("--deadline", deadline)
    mtbi_h = _hours("--spot-mtbi-hours", spot_mtbi_hours)
    if not 0 <= margin < 0.5:
        raise FrugalError("--margin is a share of GPU memory in [0, 0.5), e.g. 0.05")
    if effective_batch < 1 or max_gpus < 1:
        raise FrugalError("--effective-batch and --max-gpus must be at least 1")
    method_list = tuple(m.strip() for m in (methods or method).split(",") if m.strip())
    base = make_job(
        method=method_list[0],
        precision=precision,
        lora_r=lora_r,
        lora_targets=lora_targets,
        seq=seq,
        attention=attention,
        packing=packing,
        loss=loss,
    )
    for m in method_list:
        make_job(method=m)  # names a bad method in --methods
    opt_list = tuple(o.strip() for o in optimizers.split(",") if o.strip())
    for o in opt_list:
        make_job(optimizer=o)
    spec = load_spec(model)
    notes: list[str] = []
    if dataset:
        tc = count_tokens(dataset, model)
        per_epoch = float(tc.tokens)
        notes.append(f"{dataset}: {tc.rows:,} rows, {tc.tokens:,} tokens ({tc.how})")
    else:
        per_epoch = _parse_tokens(tokens or "")
    if spec.max_positions and seq > spec.max_positions:
        notes.append(f"--seq {seq} is beyond {spec.id}'s {spec.max_positions} positions")
    k = Constraints(
        tokens=per_epoch * epochs,
        effective_batch=effective_batch,
        budget_usd=budget,
        deadline_h=deadline_h,
        max_gpus=max_gpus,
        spot="auto" if spot is None else ("only" if spot else "never"),
        methods=method_list,
        optimizers=opt_list,
        margin=margin,
        mtbi_h=mtbi_h,
        objective=optimize,  # type: ignore[arg-type]
    )
    offers = select_offers(prices or [], discount or [], local or [], kwh_usd, providers)
    try:
        result = search(spec, base, offers, k)
    except Infeasible as e:  # say what came nearest and which changes would give a plan
        every = (
            select_offers(prices or [], discount or [], local or [], kwh_usd) if providers else None
        )
        raise FrugalError(explain(e, Ask(spec, base, offers, k), every)) from None
    result.notes[:0] = notes
    rec = result.recommendation
    out: dict[str, Any] = {
        "model": spec.id,
        "tokens": k.tokens,
        "recommendation": rec.to_json(),
        "frontier": [p.to_json() for p in result.frontier],
        "rejected": [r.to_json() for r in result.rejected],
        "feasible_plans": len(result.plans),
        "notes": result.notes,
    }

    run_cfg = to_run_config(spec.id, rec, k, dataset, per_epoch, epochs)
    if write:
        run_cfg.write(write)
        out["wrote"] = write
    if emit:
        path = emit_file or {"hf": "train_hf.py", "skypilot": "sky.yaml"}[emit]
        text = (
            hf_script(run_cfg, rec.speed.step_time_s)
            if emit == "hf"
            else skypilot_task(rec, write or "frugal.yaml")
        )
        write_text_atomic(path, text)
        out[f"wrote_{emit}"] = path
    if plot:
        write_plot(result, k, plot)
        out["wrote_plot"] = plot
    if json_out:
        print(json.dumps(out))
    else:
        render(out)


def render(out: dict[str, Any]) -> None:

    con = Console()
    if not con.is_terminal:
        con = Console(width=120)
    r = out["recommendation"]
    spot = (
        " (spot"
        + (
            f", on-demand after {r['spot_fallback']['switch_to_ondemand_after_h']:.1f} h)"
            if r["spot_fallback"]
            else ")"
        )
        if r["spot"]
        else ""
    )
    con.print(
        f"[bold]{out['model']}[/] · {_si(out['tokens'])} tokens · "
        f"{out['feasible_plans']} feasible plans"
    )
    con.print(
        f"[bold green]plan:[/] {r['provider']} {r['instance']}{spot} · "
        f"{r['gpus']}x {r['gpu']} · {r['method']} · micro-batch {r['micro_batch']} x "
        f"accum {r['grad_accum']} · checkpointing {'on' if r['grad_checkpointing'] else 'off'}"
        f" · {r['optimizer']}"
    )
    con.print(
        f"      [bold]${r['est_cost_usd']:,.2f}[/] in [bold]{r['est_hours']:.2f} h[/] · "
        f"{r['tokens_per_s']:,.0f} tokens/s · {r['device_total_gib']:.1f} of "
        f"{r['usable_gib']:.1f} GiB per GPU"
    )
    for reason in r["reasons"]:
        con.print(f"  • {reason}")
    t = Table(title="cost vs time: the Pareto frontier")
    for col in ("plan", "GPUs", "method", "hours", "cost", "tokens/s"):
        t.add_column(col, justify="left" if col in ("plan", "method") else "right")
    for p in out["frontier"]:
        nodes = f"{p['nodes']}x " if p["nodes"] > 1 else ""
        t.add_row(
            f"{p['provider']} {nodes}{p['instance']}{' spot' if p['spot'] else ''}",
            f"{p['gpus']}x {p['gpu']}",
            p["method"],
            f"{p['est_hours']:.2f}",
            f"${p['est_cost_usd']:,.2f}",
            f"{p['tokens_per_s']:,.0f}",
        )
    con.print(t)
    if out["rejected"]:
        con.print("[bold]rejected[/]")
        for x in out["rejected"]:
            con.print(f"  ✗ {x['option']}: {x['why']}")
    for n in out["notes"]:
        con.print(f"[dim]note: {n}[/]")
    if out.get("wrote"):
        con.print(f"wrote {out['wrote']} (run it with: frugal train {out['wrote']})")
    if out.get("wrote_skypilot"):
        con.print(
            f"wrote {out['wrote_skypilot']} (launch with: sky jobs launch {out['wrote_skypilot']})"
        )
    if out.get("wrote_hf"):
        con.print(f"wrote {out['wrote_hf']} (run it with: python {out['wrote_hf']})")
