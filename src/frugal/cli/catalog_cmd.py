"""`frugal gpus` and `frugal offers [update]`: the catalogs that `estimate` and `plan` use."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn
from rich.table import Table

from frugal.cli import console, print_json, show_prices
from frugal.cli.options import JSON_HELP, OFFERS_HELP, number, option_set, takes
from frugal.errors import FrugalError
from frugal.hardware.catalog import price_basis, select_offers
from frugal.hardware.gpus import gpus as all_gpus
from frugal.hardware.offers import KWH_USD, base
from frugal.hardware.refresh import SKYPILOT_FILES
from frugal.hardware.refresh import update as refresh


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


offers_app = typer.Typer(
    help="GPU offers: provider, instance, GPUs, on-demand and spot $/hour, terms; "
    "`frugal offers update` refreshes them.",
    invoke_without_command=True,
)


@option_set
class OffersOptions:
    """The options of `frugal offers`, in the order `--help` shows them."""

    gpu: str | None = typer.Option(None, help="Only offers of this GPU (forgiving match).")
    providers: str | None = typer.Option(None, help="Comma-separated providers to keep.")
    prices: list[str] | None = typer.Option(None, "--offers", "--prices", help=OFFERS_HELP)
    discount: list[str] | None = typer.Option(
        None, help="PROVIDER=PERCENT off its prices, e.g. aws=15."
    )
    local: list[str] | None = typer.Option(None, help="Your own GPUs, e.g. '2x RTX 4090'.")
    kwh_usd: float = number(KWH_USD, "Electricity price for --local, $/kWh.", ge=0, le=10)
    suspicious_only: bool = typer.Option(
        False,
        "--suspicious",
        help="Only the offers whose price is an error (left out of plans) or stands far from "
        "its peers' (kept, a finding), and why.",
    )
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)


@offers_app.callback()
@takes(OffersOptions)
def offers(ctx: typer.Context, o: OffersOptions) -> None:
    """GPU offers: provider, instance, GPUs, on-demand and spot $/hour, terms."""

    if ctx.invoked_subcommand is not None:
        return
    chosen = select_offers(
        o.prices or [],
        o.discount or [],
        o.local or [],
        o.kwh_usd,
        o.providers,
        o.gpu,
        include_suspicious=o.suspicious_only,
    )
    b = base()
    why = b.findings | b.errors
    if o.suspicious_only:
        chosen = [offer for offer in chosen if offer.key in why]
    basis = price_basis(chosen, o.prices or [])
    rows = [
        x.to_json()
        | ({"suspicious": why[x.key], "left_out": x.key in b.errors} if x.key in why else {})
        for x in chosen
    ]
    if o.json_out:
        print_json({"offers": rows, "prices": basis.to_json()})
        show_prices(basis, o.json_out)
        return

    con = console()
    what = (
        "offers with a price error (left out) or finding (kept)" if o.suspicious_only else "offers"
    )
    t = Table(title=f"{len(rows)} {what} ($/hour for the whole instance)")
    cols = ("provider", "instance", "GPUs", "on-demand", "spot", "interrupt", "region", "why")
    for col in cols if o.suspicious_only else cols[:-1]:
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
            *((_why(r),) if o.suspicious_only else ()),
        )
    con.print(t)
    show_prices(basis)


def _why(row: dict[str, object]) -> str:
    """A listed offer's verdict: left out of plans (a price error) or kept (a finding)."""
    return ("left out: " if row["left_out"] else "kept: ") + str(row["suspicious"])


@offers_app.command("update")
def update(
    source: str = typer.Option(
        "skypilot",
        help="skypilot (SkyPilot's catalogs), gpuhunt (dstack's; pip install "
        "'frugal-ft[gpuhunt]'), a URL or directory of SkyPilot's layout, or a CSV file of offers.",
    ),
    providers: str | None = typer.Option(
        None, help=f"Comma-separated providers to update \\[default: {', '.join(SKYPILOT_FILES)}]."
    ),
    force: bool = typer.Option(
        False, help="Take a provider's catalog even if it lost over half of its offers."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Download today's prices into frugal's cache; plans use them from then on."""

    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        console=err,
        transient=True,
        disable=json_out or not err.is_terminal,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def shown(where: str, got: int, total: int | None) -> None:
            if where not in tasks:
                tasks[where] = bar.add_task(where.rsplit("/", 3)[-2] if "/" in where else where)
            bar.update(tasks[where], completed=got, total=total)

        try:
            done = refresh(source, providers, shown, force=force)
        except FrugalError as e:  # nothing was installed: say what the plans price from
            kept = base().snapshot.describe()
            raise FrugalError(f"{e}; plans keep the prices of the {kept}") from None

    if json_out:
        print_json(done.to_json())
        return
    t = Table(title=f"prices of {done.retrieved:%Y-%m-%d %H:%M} UTC")
    for col in ("provider", "offers", "GPUs", "regions", "left out"):
        t.add_column(col, justify="right" if col in ("offers", "regions") else "left")
    for f in done.fetched:
        j = f.to_json()
        t.add_row(
            f.provider,
            str(len(f.offers)),
            ", ".join(j["gpus"]),  # type: ignore[arg-type]
            str(j["regions"]),
            f.left_out or "-",
        )
    con = console()
    con.print(t)
    kept = f"; {done.kept} offers of other providers kept" if done.kept else ""
    con.print(f"wrote {done.path} (the snapshot before it kept beside it){kept}")
