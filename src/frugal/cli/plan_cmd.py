"""`frugal plan MODEL`: the cheapest GPU, provider and configuration that fits in time."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from frugal.cli import console, print_json, show_prices
from frugal.cli.jobs_cmd import run_jobs
from frugal.cli.options import (
    request_of,
    takes,
)
from frugal.cli.plan_options import PlanOptions
from frugal.errors import FrugalError
from frugal.files import check_target
from frugal.formats import as_count
from frugal.plan.plans import Plan
from frugal.plan.plot import check_plot_path
from frugal.plan.request import PlanOutcome, PlanRequest, files, make_plan


@takes(PlanOptions)
def plan(ctx: typer.Context, o: PlanOptions) -> None:
    """The cheapest (or fastest) plan that fits and meets the deadline, with its reasons."""

    if o.jobs is not None:
        run_jobs(o, o.jobs)
        return
    if o.price_history or o.now:
        raise FrugalError("--price-history and --now time the VMs of --jobs: add --jobs FILE")
    if o.model is None:
        raise FrugalError("give MODEL (a hub id, directory or config.json), or --jobs FILE")
    targets = _targets(o.write, o.emit, o.emit_file, o.plot, o.force)  # checked before any work
    out = make_plan(request_of(ctx, PlanRequest))
    wrote = files(out, targets)
    if o.json_out:
        print_json(out.to_json(wrote) | {"plan_id": out.plan_id, "tags": out.tags})
    else:
        render(out, wrote)
    show_prices(out.basis, o.json_out)


EMITTED = {
    "hf": "train_hf.py",
    "skypilot": "sky.yaml",
    "modal": "modal_app.py",
    "slurm": "train.sbatch",
    "torchrun": "nodes.sh",
}
FLAGS = {"run config": "--write", **dict.fromkeys(EMITTED, "--emit-file"), "plot": "--plot"}
LAUNCHERS = ("skypilot", "modal", "slurm", "torchrun")  # they launch `frugal train` on the config
KINDS = "hf, skypilot, modal, slurm or torchrun"
USE = {
    "hf": "run it with: python {}",
    "skypilot": "launch with: sky jobs launch {}",
    "modal": "launch with: modal run {}",
    "slurm": "submit with: sbatch {}",
    "torchrun": "on each node: bash {} NODE_RANK HEAD_ADDRESS",
    "plot": "cost against time of every feasible plan",
}


def _use(what: str, path: str, plan: Plan) -> str:
    """How a file the plan wrote is used: the words after `wrote PATH`, its path quoted
    for the shell that runs them."""
    path = shlex.quote(path)
    if what != "run config":
        return USE[what].format(path)
    if plan.nodes == 1:
        return f"run it with: frugal train {path}"
    return (
        f"run it on each of the {plan.nodes} nodes with: frugal train {path} --nnodes "
        f"{plan.nodes} --node-rank NODE_RANK --master-addr HEAD_ADDRESS"
    )


def _targets(
    write: str | None, emit: str | None, emit_file: str | None, plot: str | None, force: bool
) -> dict[str, str]:
    """The files this plan will write, in order, each checked before the search: writable,
    and not a file that exists unless --force. A SkyPilot task trains the run config
    written beside it in the same call, so it needs --write."""
    if emit is not None and emit not in EMITTED:
        raise FrugalError(f"--emit {emit!r}: use {KINDS}")
    if emit_file and not emit:
        raise FrugalError(f"--emit-file names where --emit writes: add --emit {KINDS}")
    if emit in LAUNCHERS and not write:
        raise FrugalError(
            f"--emit {emit} launches `frugal train` on this plan's run config: add --write "
            "FILE (the task trains that file)"
        )
    out = {"run config": write} if write else {}
    if emit:
        out[emit] = emit_file or EMITTED[emit]
    if plot:
        check_plot_path(plot)
        out["plot"] = plot
    paths = [Path(p).resolve() for p in out.values()]
    if len(set(paths)) < len(paths):
        raise FrugalError("--write, --emit-file and --plot name the same file: give each its own")
    for what, path in out.items():
        check_target(path, FLAGS[what], force=force)
    return out


def render(out: PlanOutcome, wrote: dict[str, str]) -> None:
    con, k, result = console(), out.k, out.result
    r, o, j = result.recommendation, result.recommendation.offer, result.recommendation.job
    fallback = r.fallback if r.fallback and r.fallback.spot_share < 1 else None
    spot = ""
    if r.spot:
        spot = f" (spot, on-demand after {fallback.switch_at_h:.1f} h)" if fallback else " (spot)"
    feasible = f"{len(result.plans)} feasible plans"
    con.print(f"[bold]{out.spec.id}[/] · {as_count(k.tokens)} tokens · {feasible}")
    where = f" in {o.region}" if o.region and o.region not in ("any", "default", "here") else ""
    nodes = f"{r.nodes}x " if r.nodes > 1 else ""  # as the frontier and rejected lines say it
    con.print(
        f"[bold green]plan:[/] {o.provider} {nodes}{o.instance}{where}{spot} · {j.gpus}x "
        f"{o.gpu.name} · "
        f"{j.method} · micro-batch {j.batch} x accum {j.grad_accum} · checkpointing "
        f"{'on' if j.grad_checkpointing else 'off'} · {j.optimizer}"
    )
    usd_h = k.value_of_time_usd_h
    rate = f"${usd_h:,.2f}".removesuffix(".00")
    weighed = f" (weighed ${r.weighed_cost_usd:,.2f} with time at {rate}/h)" if usd_h else ""
    (c_lo, c_hi), (h_lo, h_hi) = r.cost_range, r.hours_range
    t_lo, t_hi = r.speed.tokens_per_s_range
    con.print(
        f"      [bold]${r.cost_usd:,.2f}[/] (${c_lo:,.2f}-{c_hi:,.2f}) in [bold]{r.hours:.2f} "
        f"h[/] ({h_lo:.2f}-{h_hi:.2f}){weighed} · {r.speed.tokens_per_s:,.0f} tokens/s "
        f"({t_lo:,.0f}-{t_hi:,.0f}) · {r.device_total_gib:.1f} of {o.gpu.usable_gib:.1f} GiB "
        "per GPU"
    )
    for reason in r.reasons:
        con.print(f"  • {reason}")
    con.print("[bold]settings[/]")
    for c in out.settings:
        con.print(f"  • {escape(c.line)}")
    t = Table(
        title="cost vs time: the Pareto frontier"
        + (f" (weighed = cost + hours x {rate})" if usd_h else "")
    )
    cols = ("plan", "GPUs", "method", "hours", "cost", *(("weighed",) if usd_h else ()))
    for col in (*cols, "tokens/s"):
        t.add_column(col, justify="left" if col in ("plan", "method") else "right")
    for p in result.frontier:
        nodes = f"{p.nodes}x " if p.nodes > 1 else ""
        t.add_row(
            f"{p.offer.provider} {nodes}{p.offer.instance}{' spot' if p.spot else ''}",
            f"{p.gpus}x {p.offer.gpu.name}",
            p.job.method,
            f"{p.hours:.2f}",
            f"${p.cost_usd:,.2f}",
            *((f"${p.weighed_cost_usd:,.2f}",) if usd_h else ()),
            f"{p.speed.tokens_per_s:,.0f}",
        )
    con.print(t)
    if result.rejected:
        con.print("[bold]rejected[/]")
        for x in result.rejected:
            con.print(f"  ✗ {x.label}: {x.why}")
    for n in result.notes:
        con.print(f"[dim]note: {n}[/]")
    for what, path in wrote.items():
        con.print(f"wrote {path} ({_use(what, path, result.recommendation)})")
