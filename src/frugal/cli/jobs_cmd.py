"""`frugal plan --jobs JOBS.yaml`: the jobs of a file packed onto shared VMs, beside one VM
per job; `--write DIR` a run config per job and a SkyPilot task per VM."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from frugal.cli import console, print_json, show_prices
from frugal.cli.plan_options import PlanOptions
from frugal.config import apply_overrides, validate_run_config
from frugal.errors import FrugalError
from frugal.files import check_dir, check_target, write_text_atomic
from frugal.hardware.catalog import price_basis, select_offers
from frugal.plan.constraints import Constraints, spot_mode
from frugal.plan.emit import skypilot_jobs_task, to_run_config
from frugal.plan.jobs import Packing
from frugal.plan.sweep import Planned, plan_jobs, read_jobs
from frugal.plan.timing import read_price_history
from frugal.times import parse_time


def parse_now(text: str | None) -> datetime:
    """--now as an ISO 8601 time (naive = UTC), or the clock."""
    if text is None:
        return datetime.now(UTC)
    try:
        return parse_time(text)
    except ValueError as e:
        raise FrugalError(f"--now {e}") from None


def run_jobs(o: PlanOptions, path: str) -> None:
    """`frugal plan --jobs PATH`: the options that do not plan its jobs are refused."""
    if o.model is not None or o.tokens is not None or o.dataset is not None:
        raise FrugalError("--jobs plans the jobs of its file: drop MODEL, --tokens, --dataset")
    if o.emit or o.emit_file or o.plot:
        raise FrugalError("--jobs writes a task per VM with --write DIR: drop --emit, --plot")
    offers = select_offers(
        o.offers or [],
        o.discount or [],
        o.local or [],
        o.kwh_usd,
        o.providers,
        include_suspicious=o.include_suspicious,
    )
    write, force = o.write, o.force
    jobs = read_jobs(path)
    if write:  # the directory and each job's run config, before any planning
        check_dir(write, "--write")
        for job in jobs if Path(write).is_dir() else ():  # a new directory holds nothing
            check_target(Path(write) / f"{job.name}.yaml", "--write", force=force)
    history = read_price_history(o.price_history) if o.price_history else None
    packing, planned, notes = plan_jobs(jobs, offers, history, parse_now(o.now), spot_mode(o.spot))
    out = to_json(packing, planned, notes)
    basis = price_basis(offers, o.offers or [])
    out["prices"] = basis.to_json()
    if write:
        for i in range(1, len(packing.vms) + 1) if Path(write).is_dir() else ():
            check_target(Path(write) / f"vm{i}.sky.yaml", "--write", force=force)
        out["wrote"] = write_all(packing, planned, Path(write))
    if o.json_out:
        print_json(out)
    else:
        render(packing, out)
    show_prices(basis, o.json_out)


def to_json(packing: Packing, planned: list[Planned], notes: list[str]) -> dict[str, Any]:
    alone = packing.alone
    return {
        "jobs": len(planned),
        "vms": [vm.to_json() for vm in packing.vms],
        "total_usd": round(packing.usd, 2),
        "one_vm_per_job_usd": round(packing.alone_usd, 2),
        "saving_usd": round(packing.alone_usd - packing.usd, 2),
        "one_vm_per_job": [
            {
                "name": name,
                "provider": r.plan.offer.provider,
                "instance": r.plan.offer.instance,
                "spot": r.plan.spot,
                "cost_usd": round(r.alone_usd(), 2),
                "data_in": r.data_in.reason,
                "data_out": r.data_out.reason,
            }
            for name, r in alone.items()
        ],
        "data": [
            {
                "name": p.job.name,
                "size_gb": round(p.size_gb, 3),
                "size": p.size_note,
                "location": p.job.data,
            }
            for p in planned
        ],
        "notes": notes,
    }


def write_all(packing: Packing, planned: list[Planned], where: Path) -> list[str]:
    """A run config per job and a SkyPilot task per VM, under `where`."""
    where.mkdir(parents=True, exist_ok=True)
    by_name = {p.job.name: p for p in planned}
    wrote = []
    for i, vm in enumerate(packing.vms, 1):
        configs = {}
        for r in vm.runs:
            p = by_name[r.job]
            k = Constraints.build(tokens=p.tokens, methods=(p.job.method,))
            cfg = to_run_config(r.model, r.plan, k, p.job.dataset, p.per_epoch, p.job.epochs)
            data = cfg.model_dump(mode="json") | {"tags": dict(p.job.tags)}
            data["output_dir"] = f"runs/{r.job}"
            cfg = validate_run_config(apply_overrides(data, p.job.overrides), f"job {r.job}")
            path = where / f"{r.job}.yaml"
            cfg.write(str(path))
            configs[r.job] = str(path)  # as the task launched from here finds it
            wrote.append(str(path))
        task = where / f"vm{i}.sky.yaml"
        write_text_atomic(task, skypilot_jobs_task(vm, configs, f"frugal-vm{i}"))
        wrote.append(str(task))
    return wrote


def render(packing: Packing, out: dict[str, Any]) -> None:
    con = console()
    saving = out["saving_usd"]
    con.print(
        f"[bold]{out['jobs']} jobs[/] on {len(packing.vms)} VMs: [bold]${out['total_usd']:,.2f}"
        f"[/] · one VM per job: ${out['one_vm_per_job_usd']:,.2f} · saving "
        f"[bold green]${saving:,.2f}[/]"
    )
    t = Table(title="VMs and their jobs, in order (hours from now)")
    for col in ("VM", "offer", "jobs", "start", "hours", "cost"):
        t.add_column(col, justify="right" if col in ("start", "hours", "cost") else "left")
    for i, vm in enumerate(out["vms"], 1):
        jobs = ", ".join(
            f"{j['name']} ({j['start_h']:.1f}-{j['end_h']:.1f}"
            + (f" by {j['deadline_h']:g}" if j["deadline_h"] is not None else "")
            + ")"
            for j in vm["jobs"]
        )
        offer = f"{vm['provider']} {vm['instance']}{' spot' if vm['spot'] else ''}"
        t.add_row(
            f"vm{i}",
            offer,
            jobs,
            f"{vm['start_h']:.1f}",
            f"{vm['hours']:.2f}",
            f"${vm['cost_usd']:,.2f}",
        )
    con.print(t)
    for note in out["notes"]:
        con.print(f"  • {note}")
    for path in out.get("wrote", []):
        con.print(f"wrote {path}")
