"""`frugal train CONFIG [key=value ...]`: run a plan's config; live cost, budget guard, resume.

Exit codes: 0 completed or stopped cleanly (budget, time, early stopping); 2 bad input;
75 (RESUMABLE_EXIT) stopped by SIGTERM/SIGINT with a checkpoint saved: run the same command
with `--resume auto` (the default) to continue exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from typing import Any

import psutil
import typer
from rich.console import Console
from rich.table import Table

from frugal import cli
from frugal.cli.options import option
from frugal.config import RunConfig, load_run_config
from frugal.errors import RESUMABLE_EXIT, FrugalError
from frugal.run.summary import RunSummary
from frugal.step.job import TrainJob

CONFIGS = "the run config's"


def train(
    config: str = typer.Argument(..., help="Run config YAML (`frugal plan --write` makes one)."),
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. training.max_steps=100 job.lora_r=8"
    ),
    resume: str = typer.Option(
        "auto", help="auto (newest complete checkpoint, if any), never, or a checkpoint dir."
    ),
    budget: float | None = option(RunConfig, "budget_usd", unset=CONFIGS),
    price_per_hour: float | None = option(RunConfig, "price_per_hour_usd", unset=CONFIGS),
    dry_run: int | None = typer.Option(
        None, help="Run N steps only; print measured memory and tokens/s beside the estimate."
    ),
    output_dir: str | None = option(RunConfig, "output_dir", unset=CONFIGS),
    gpus: int | None = option(TrainJob, "gpus", unset=CONFIGS),
    quiet: bool = typer.Option(False, "--quiet", help="No progress display."),
    json_out: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
) -> None:
    """Fine-tune with LoRA, QLoRA or full training, as planned, keeping the money in view."""

    if dry_run is not None and dry_run < 1:
        raise FrugalError("--dry-run N: N is a number of steps, at least 1")
    flags = {"budget_usd": budget, "price_per_hour_usd": price_per_hour,
             "output_dir": output_dir, "job.gpus": gpus}  # fmt: skip
    cfg = load_run_config(
        config, list(overrides or []), {k: v for k, v in flags.items() if v is not None}
    )
    if cfg.job.gpus > 1 and "LOCAL_RANK" not in os.environ:
        raise typer.Exit(_launch(cfg.job.gpus))

    from frugal.run.recipe import train as run_train

    summary = run_train(cfg, resume=resume, dry_run=dry_run, quiet=quiet or json_out)
    if int(os.environ.get("RANK", "0")) == 0:
        if json_out:
            print(summary.model_dump_json())
        else:
            render(summary, dry_run is not None)
    if summary.outcome == "preempted":
        raise typer.Exit(RESUMABLE_EXIT)
    if summary.outcome == "failed":
        raise FrugalError(f"training stopped: {summary.reason}")


def _launch(n: int) -> int:
    """One process per GPU through torchrun (gloo on CPU, NCCL on CUDA), same arguments.
    SIGTERM/SIGINT go straight to the workers, which checkpoint and stop however long that
    takes; torchrun ignores them (it would give the workers 30 s, then kill them, and exit
    1). The exit code is the workers' (75 if they stopped resumably); torchrun's own
    traceback is not shown."""

    args = [a for a in cli.ARGV if a != "--debug"]
    own = ["--signals-to-handle=SIGHUP,SIGQUIT"] if _torchrun_can_leave_signals() else []
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={n}", *own, "-m", "frugal.cli.main", *args]  # fmt: skip
    stops = (signal.SIGTERM, signal.SIGINT)
    old = {s: signal.signal(s, signal.SIG_IGN) for s in stops}  # inherited by torchrun
    try:
        child = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, bufsize=1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)

    def forward(signum: int, frame: Any) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            workers = psutil.Process(child.pid).children()  # each in a session of its own
            if not workers:  # still starting: nothing to save
                child.kill()
            for worker in workers:
                with contextlib.suppress(psutil.NoSuchProcess):
                    worker.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in stops}
    held: list[str] = []  # torchrun's own report, from its first log or traceback line on
    errors: list[str] = []
    try:
        assert child.stderr is not None
        for line in child.stderr:
            if TORCHRUN_BANNER.match(line):
                continue
            if held or TORCHRUN_NOISE.match(line):
                held.append(line)
            elif line.startswith("error: "):
                if line not in errors:  # every worker prints the same one-line error
                    errors.append(line)
                    sys.stderr.write(line)
            else:
                sys.stderr.write(line)
        child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if child.returncode == 0:
        return 0
    codes = _worker_codes("".join(held))
    if RESUMABLE_EXIT in codes:
        return RESUMABLE_EXIT
    if errors:
        return 2
    sys.stderr.write("".join(held[-40:]))
    return 1


TORCHRUN_BANNER = re.compile(r"^(\*+\s*$|Setting OMP_NUM_THREADS)")
TORCHRUN_NOISE = re.compile(r"^(Traceback|[WEI]\d{4} |\[[WEI] |W\d|E\d|torch\.distributed)")


def _torchrun_can_leave_signals() -> bool:
    """Whether this torchrun takes --signals-to-handle (torch 2.9 on). An older one handles
    SIGTERM/SIGINT itself, but only when they reach it directly (a Ctrl-C in its terminal,
    a shutdown signalling every process), since the launcher signals the workers alone.
    Read from its source: importing torch to ask would cost the launcher a second."""

    try:
        run = distribution("torch").locate_file("torch/distributed/run.py")
        return "--signals-to-handle" in run.read_text()
    except (PackageNotFoundError, OSError):
        return False


def _worker_codes(text: str) -> set[int]:
    return {int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", text)}


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
        c.print(f"best eval loss {s.best_eval_loss:.4f} at step {s.best_step}")
    for k, v in s.outputs.items():
        c.print(f"{k}: {v}")
    if s.resumable:
        c.print("checkpoint saved: run the same command again to resume (--resume auto)")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)
