"""`frugal train CONFIG [key=value ...]`: run a plan's config; live cost, budget guard, resume.

Exit codes: 0 completed or stopped cleanly (budget, time, early stopping); 2 bad input
(a missing required tag, a plan over a budget without --force); 75 (RESUMABLE_EXIT)
stopped by SIGTERM/SIGINT or by the idle watchdog with a checkpoint saved, or, in a run of
several processes or nodes, because another process is gone (its newest complete checkpoint
intact): run the same command (on every node) with `--resume auto` (the default) to continue
exactly where it stopped.
"""

from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from frugal import cli
from frugal.cli import print_json
from frugal.cli.options import number, option, option_set, takes
from frugal.config import RunConfig, load_run_config
from frugal.errors import INTERRUPTED_EXIT, RESUMABLE_EXIT, FrugalError
from frugal.run.launch import launch
from frugal.run.nodes import DEFAULT_PORT, Nodes, resolve
from frugal.run.outdir import check, held
from frugal.run.summary import RunSummary
from frugal.step.job import TrainJob

CONFIGS = "the run config's"


@option_set
class TrainOptions:
    """The options of `frugal train`, in the order `--help` shows them."""

    config: str = typer.Argument(..., help="Run config YAML (`frugal plan --write` makes one).")
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. training.max_steps=100 job.lora_r=8"
    )
    resume: str = typer.Option(
        "auto", help="auto (newest complete checkpoint, if any), never, or a checkpoint dir."
    )
    budget: float | None = option(RunConfig, "budget_usd", unset=CONFIGS)
    price_per_hour: float | None = option(RunConfig, "price_per_hour_usd", unset=CONFIGS)
    dry_run: int | None = number(
        None,
        "Run N steps only; print measured memory and tokens/s beside the estimate.",
        ge=1,
        le=1_000_000,
        whole=True,
    )
    output_dir: str | None = option(RunConfig, "output_dir", unset=CONFIGS)
    gpus: int | None = option(TrainJob, "gpus", unset=CONFIGS)
    quiet: bool = typer.Option(False, "--quiet", help="No progress display.")
    tag: list[str] | None = typer.Option(
        None, help="Ledger tag key=value (project, team, env, ...); repeat for more."
    )
    force: bool = typer.Option(
        False, "--force", help="Start even if the plan's estimate would cross a budget."
    )
    json_out: bool = typer.Option(False, "--json", help="Print the run summary as JSON.")
    nnodes: int | None = number(
        None,
        "Machines in a multi-node run (each runs this command) [default: SkyPilot's or "
        "Slurm's, else 1].",
        ge=1,
        le=4096,
        whole=True,
    )
    node_rank: int | None = number(
        None,
        "This machine's place, 0 (the head) to nnodes-1 [default: the rendezvous'].",
        ge=0,
        le=4095,
        whole=True,
    )
    master_addr: str | None = typer.Option(None, help="The head node's address.")
    master_port: int | None = number(
        None,
        f"The rendezvous port on the head node [default: {DEFAULT_PORT}].",
        ge=1,
        le=65535,
        whole=True,
    )
    rdzv_endpoint: str | None = typer.Option(
        None, help="HOST:PORT of the rendezvous, in place of --master-addr/--master-port."
    )
    rdzv_id: str | None = typer.Option(
        None,
        help="The job's name at the rendezvous [default: SkyPilot's task id, Slurm's "
        "job id, else frugal].",
    )


@takes(TrainOptions)
def train(ctx: typer.Context, o: TrainOptions) -> None:
    """Fine-tune with LoRA, QLoRA or full training, as planned, keeping the money in view."""

    flags = {
        "budget_usd": o.budget,
        "price_per_hour_usd": o.price_per_hour,
        "output_dir": o.output_dir,
        "job.gpus": o.gpus,
    }
    cfg = load_run_config(
        o.config, list(o.overrides or []), {k: v for k, v in flags.items() if v is not None}
    )
    if "LOCAL_RANK" in os.environ:  # a worker: of frugal's launcher, or of torchrun's
        nodes = Nodes(worker=True)
    else:
        nodes = resolve(
            o.nnodes, o.node_rank, o.master_addr, o.master_port, o.rdzv_endpoint, o.rdzv_id
        )
    if not nodes.worker and (cfg.job.gpus > 1 or nodes.count > 1):
        from frugal.run.books import preflight  # the ledger: SQLAlchemy

        here = nodes.per_node(cfg.job.gpus)
        if nodes.count > 1:
            print(nodes.line(cfg.job.gpus), file=sys.stderr)
        out_dir = Path(cfg.output_dir)
        check(out_dir)  # frugal's, or refused before any process starts
        out = out_dir / ("dry-run" if o.dry_run else "")
        preflight(
            cfg, list(o.tag or []), o.force, out, bool(o.dry_run)
        )  # before any process starts

        def hold(rank: int) -> AbstractContextManager[Any]:
            """The head node holds the output directory (shared by every node) for its
            workers, and every other node checks that it sees the head's files there."""
            return held(out_dir) if rank == 0 else nullcontext()

        code = launch(here, cli.ARGV, nodes=nodes, hold=hold, shared=out_dir)
        raise typer.Exit(code)

    from frugal.run.recipe import train as run_train

    summary = run_train(
        cfg,
        resume=o.resume,
        dry_run=o.dry_run,
        quiet=o.quiet or o.json_out,
        tags=list(o.tag or []),
        force=o.force,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        if o.json_out:
            print_json(summary.model_dump(mode="json"))
        else:
            render(summary, o.dry_run is not None)
    if summary.interrupted:
        raise typer.Exit(INTERRUPTED_EXIT)
    if summary.resumable:
        raise typer.Exit(RESUMABLE_EXIT)
    if summary.outcome == "failed":
        raise FrugalError(f"training stopped: {summary.reason}")


def render(s: RunSummary, dry: bool) -> None:
    c = Console()
    colour = {"completed": "green", "preempted": "yellow"}.get(s.outcome, "red")
    c.print(
        f"[bold {colour}]{s.outcome}[/]: {s.reason} · step {s.steps}/{s.total_steps} · "
        f"micro-batch {s.micro_batch} x accum {s.grad_accum} · {s.precision}"
    )
    t = Table(title="dry run: measured vs estimate" if dry else "predicted vs actual")
    t.add_column("")
    t.add_column("predicted", justify="right")
    t.add_column("actual", justify="right")
    p, a = s.predicted.model_dump(), s.actual.model_dump()
    for key, label in (
        ("tokens_per_s", "tokens/s"),
        ("peak_allocated_gib", "peak allocated GiB"),
        ("peak_reserved_gib", "peak reserved GiB"),
        ("hours", "hours"),
        ("cost_usd", "cost USD"),
    ):
        if p.get(key) is not None or a.get(key) is not None:
            t.add_row(label, _fmt(p.get(key)), _fmt(a.get(key)))
    c.print(t)
    if s.best_eval_loss is not None:
        m = s.best_metrics
        also = (
            f", accuracy {m['accuracy']:.3f}, macro-F1 {m['macro_f1']:.3f}"
            if "accuracy" in m
            else ""
        )
        if "reward_margin" in m:  # preference tuning's
            also += f", reward margin {m['reward_margin']:.3f}"
        if "preference_accuracy" in m:
            also += f", preference accuracy {m['preference_accuracy']:.3f}"
        if "label_loss" in m:  # a distilled student's loss on the labels alone
            also += f", label loss {m['label_loss']:.4f}"
        c.print(f"best eval loss {s.best_eval_loss:.4f}{also} at step {s.best_step}")
    for k, v in s.outputs.items():
        c.print(f"{k}: {v}")
    if s.interrupted:
        c.print("run the same command again to resume from the newest checkpoint it kept")
    elif s.resumable and s.steps == 0:
        c.print("no checkpoint (nothing was trained yet): run the same command again to start")
    elif s.resumable:
        c.print(
            f"checkpoint of step {s.steps} saved: run the same command again to resume "
            "(--resume auto)"
        )


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)
