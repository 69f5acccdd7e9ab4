"""`frugal gpus` and `frugal offers`: the catalogs that `estimate` and `plan` use."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from frugal.cli import print_json
from frugal.cli.options import JSON_HELP, number
from frugal.hardware.gpus import gpus as all_gpus
from frugal.hardware.offers import KWH_USD, select_offers


def gpus(json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """GPU specs: usable memory, dense tensor TFLOPS, bandwidth, bf16, interconnect."""

    rows = [g.to_json() for g in all_gpus()]
    if json_out:
        print_json({"gpus": rows})
        return

    t = Table(title="GPUs (dense tensor TFLOPS, no sparsity)")
    for col in ("GPU", "usable GiB", "bf16 TF", "fp16 TF", "GB/s", "bf16", "link", "W"):
        t.add_column(col, justify="left" if col in ("GPU", "link") else "right")
    for r in rows:
        t.add_row(
            str(r["name"]),
            f"{r['usable_gib']:.1f}",
            f"{r['bf16_tflops']:g}" if r["bf16_tflops"] else "-",
            f"{r['fp16_tflops']:g}" if r["fp16_tflops"] else "-",
            f"{r['bandwidth_gbps']:g}",
            "yes" if r["bf16"] else "no",
            f"{r['interconnect']} {r['interconnect_gbps']:g} GB/s",
            f"{r['tdp_w']:g}",
        )
    Console().print(t)


def offers(
    gpu: str | None = typer.Option(None, help="Only offers of this GPU (forgiving match)."),
    providers: str | None = typer.Option(None, help="Comma-separated providers to keep."),
    prices: list[str] | None = typer.Option(
        None, help="Your own price CSV (or a SkyPilot vms.csv)."
    ),
    discount: list[str] | None = typer.Option(
        None, help="PROVIDER=PERCENT off its prices, e.g. aws=15."
    ),
    local: list[str] | None = typer.Option(None, help="Your own GPUs, e.g. '2x RTX 4090'."),
    kwh_usd: float = number(KWH_USD, "Electricity price for --local, $/kWh.", ge=0, le=10),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """GPU offers: provider, instance, GPUs, on-demand and spot $/hour, terms."""

    rows = [
        o.to_json()
        for o in select_offers(prices or [], discount or [], local or [], kwh_usd, providers, gpu)
    ]
    if json_out:
        print_json({"offers": rows})
        return

    t = Table(title=f"{len(rows)} offers ($/hour for the whole instance)")
    for col in ("provider", "instance", "GPUs", "on-demand", "spot", "interrupt", "region"):
        t.add_column(col, justify="right" if col in ("on-demand", "spot") else "left")
    for r in sorted(rows, key=lambda r: (str(r["gpu"]), float(r["ondemand_usd_h"]))):  # type: ignore[arg-type]
        spot = r["spot_usd_h"]
        t.add_row(
            str(r["provider"]),
            str(r["instance"]),
            f"{r['gpus']}x {r['gpu']}",
            f"${r['ondemand_usd_h']:.3f}",
            f"${spot:.3f}" if spot is not None else "-",
            str(r["interruption"] or "-"),
            str(r["region"]),
        )
    Console().print(t)
