"""`frugal tco MODEL`: twelve months (or N) of training plus serving, every way to pay for it."""

from __future__ import annotations

from typing import Any, get_args

import typer
from rich.table import Table

from frugal.cli import console, print_json, show_prices
from frugal.cli.options import (
    JSON_HELP,
    MODEL_HELP,
    fields_of,
    number,
    option,
    option_set,
    takes,
    token_count,
)
from frugal.errors import FrugalError
from frugal.hardware.catalog import price_basis, select_offers
from frugal.hardware.offers import HOST_WATTS, KWH_USD
from frugal.plan.constraints import Constraints
from frugal.plan.plans import Infeasible
from frugal.plan.search import search
from frugal.serve import compare
from frugal.serve.plan import Option, plan
from frugal.serve.prices import api_prices, conservative_commitment, purchase_price
from frugal.serve.request import ServeRequest
from frugal.serve.tco import HOURS_PER_MONTH, Api, Hourly, Owned, Training, Workload, tco
from frugal.step.job import Method, make_job

MONTHS = 240  # the longest horizon: 20 years, past any GPU's working life
SPOT_OVERHEAD = 0.1  # serving on spot: a share of hours lost to interruptions and reboots


@option_set
class TcoOptions:
    """The options of `frugal tco`, in the order `--help` shows them."""

    model: str = typer.Argument(..., help=MODEL_HELP)
    rate: float | None = option(ServeRequest, "rate", help="Requests per second to serve.")
    requests_per_day: float | None = option(ServeRequest, "requests_per_day")
    input_len: int = option(ServeRequest, "input_len")
    output_len: int = option(ServeRequest, "output_len")
    ttft_ms: float | None = option(ServeRequest, "ttft_ms")
    itl_ms: float | None = option(ServeRequest, "itl_ms")
    quant: str = option(ServeRequest, "quant", listed=True)
    months: int = number(12, "Months to compare.", ge=1, le=MONTHS, whole=True)
    train_tokens: float | None = token_count(
        None, "Fine-tune on this many tokens first, e.g. 20M (planned as `frugal plan`)."
    )
    train_method: str = typer.Option(
        "lora", help=f"The fine-tune's method: {', '.join(get_args(Method))}."
    )
    train_every_months: int = number(
        0, "Fine-tune again every K months (0: once).", ge=0, le=MONTHS, whole=True
    )
    engineering_usd_h: float = number(0.0, "What an engineering hour costs, USD.", ge=0, le=1e5)
    self_hosted_hours: float = number(
        20.0, "Engineering hours a month to run your own servers.", ge=0, le=HOURS_PER_MONTH
    )
    api_hours: float = number(
        2.0, "Engineering hours a month to use an API.", ge=0, le=HOURS_PER_MONTH
    )
    own_gpu_usd: float | None = number(
        None,
        "Your purchase price per GPU, host share included [default: the catalog's].",
        gt=0,
        le=1e7,
    )
    own_years: float = number(3.0, "Years to amortize bought GPUs over.", gt=0, le=20)
    own_utilization: float = number(0.5, "Share of hours your own GPUs are busy.", gt=0, le=1)
    kwh_usd: float = number(KWH_USD, "Electricity price for owned GPUs, $/kWh.", ge=0, le=10)
    providers: str | None = typer.Option(None, help="Comma-separated providers to consider.")
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)


@takes(TcoOptions)
def tco_cmd(ctx: typer.Context, o: TcoOptions) -> None:
    """Self-hosted on-demand, committed, managed, hosted API and your own GPUs over N months:
    the cheapest option each month and where the totals cross."""
    if o.train_method not in get_args(Method):  # checked whether or not there is training
        raise FrugalError(f"--train-method {o.train_method!r}: give {', '.join(get_args(Method))}")
    serving = fields_of(ctx, ServeRequest) | {"commitment_months": ()}
    ask = ServeRequest.model_validate(serving).ask()  # what `frugal serve plan` is asked
    spec, arriving = ask.spec, ask.rate
    offers = select_offers(providers_csv=o.providers)
    p = plan(ask, offers)
    best = p.best
    w = Workload(
        months=o.months,
        replicas=best.replicas,
        gpus_per_replica=best.cap.d.tp,
        input_mtok_per_month=arriving * 3600 * HOURS_PER_MONTH * o.input_len / 1e6,
        output_mtok_per_month=arriving * 3600 * HOURS_PER_MONTH * o.output_len / 1e6,
        output_tokens_per_s=best.cap.rate * o.output_len,
        engineering_usd_h=o.engineering_usd_h,
        training=_training(
            spec,
            o.train_tokens,
            o.train_method,
            o.train_every_months,
            offers,
        ),
    )
    options = _options(p.best, compare.platforms(p), w, spec.id, o.self_hosted_hours, o.api_hours)
    options.append(
        _owned(best, o.own_gpu_usd, o.own_years, o.own_utilization, o.kwh_usd, o.self_hosted_hours)
    )
    result = tco(w, [x for x in options if x is not None])
    out = result.to_json() | {
        "model": spec.id,
        "rate_requests_per_s": arriving,
        "serving": best.to_json(),
        "training": None if w.training is None else vars(w.training),
        "prices": (basis := price_basis(offers)).to_json(),
    }
    if o.json_out:
        print_json(out)
    else:
        render(result, out)
    show_prices(basis, o.json_out)


def _training(
    spec: Any, tokens: float | None, method: str, every: int, offers: list[Any]
) -> Training | None:
    """The training plan's GPU-hours and price, when there is training."""
    if tokens is None:
        return None
    job = make_job(method=method)
    try:
        rec = search(spec, job, offers, Constraints.build(tokens=tokens, methods=(method,)))
    except Infeasible as e:
        raise FrugalError(f"no training plan: {e}") from None
    r = rec.recommendation
    gpus = r.gpus
    return Training(r.hours * gpus, r.cost_usd / (r.hours * gpus), every)


def _options(
    best: Option,
    platforms: list[dict[str, Any]],
    w: Workload,
    model: str,
    self_h: float,
    api_h: float,
) -> list[Any]:
    """Renting (on-demand, spot, committed within the horizon), a managed platform, and the
    API that is cheapest for this workload."""
    per_replica = best.usd_h / best.replicas  # the plan's whole bill over the replicas it needs
    out: list[Any] = [Hourly("on-demand", per_replica, engineering_h_month=self_h)]
    o = best.offer
    if o.spot_usd_h is not None:  # serving on spot: restarts re-bill their boot (10%)
        spot = per_replica * o.spot_usd_h / o.ondemand_usd_h
        out.append(Hourly("spot", spot, overhead=SPOT_OVERHEAD, engineering_h_month=self_h))
    for term in (12, 36):
        c = conservative_commitment(o.provider, term)
        if c is not None and term <= w.months:  # a longer term would still be owed after
            out.append(
                Hourly(
                    f"commitment {term} months",
                    c.usd_h(per_replica),
                    always_on=True,
                    term_months=term,
                    engineering_h_month=self_h,
                )
            )
    if platforms:
        m = platforms[0]
        out.append(
            Hourly(
                f"managed {m['platform']}",
                m["usd_h_total"] / best.replicas,
                engineering_h_month=self_h / 2,
            )
        )
    apis = api_prices(model)
    if apis:
        a = min(apis, key=lambda a: a.cost_usd(w.input_mtok_per_month, w.output_mtok_per_month))
        out.append(
            Api(
                f"API {a.provider}",
                a.input_usd_per_mtok,
                a.output_usd_per_mtok,
                engineering_h_month=api_h,
            )
        )
    return out


def _owned(
    best: Option, price: float | None, years: float, util: float, kwh: float, self_h: float
) -> Owned | None:
    """Buying the GPUs the plan rents: the catalog's purchase price unless given."""
    gpu = best.cap.d.gpu
    if price is None:
        bought = purchase_price(gpu.name)
        if bought is None:
            return None
        price = bought.per_gpu_usd
    watts = gpu.tdp_w + HOST_WATTS / max(best.offer.gpus, 1)
    return Owned(
        f"own {gpu.name}", price, watts, kwh, years, util, engineering_h_month=self_h * 1.5
    )


def render(result: Any, out: dict[str, Any]) -> None:
    con = console()
    s = out["serving"]
    con.print(
        f"[bold]{out['model']}[/] · {out['rate_requests_per_s']:g} requests/s on "
        f"{s['replicas']} x {s['gpus_per_replica']}x {s['gpu']} ({s['quant']}) · "
        f"{result.months} months"
    )
    if out["training"]:
        tr = out["training"]
        again = f", again every {tr['every_months']} months" if tr["every_months"] else ""
        con.print(
            f"training: {tr['gpu_hours']:,.1f} GPU-hours at ${tr['usd_per_gpu_h']:,.2f} "
            f"(`frugal plan`'s choice) in month 1{again}, in every option"
        )
    t = Table(title="cumulative cost, USD")
    marks = sorted(
        m for m in {1, 3, 6, result.months // 2, result.months} if 1 <= m <= result.months
    )
    t.add_column("option")
    for m in marks:
        t.add_column(f"month {m}", justify="right")
    for o in result.options:
        t.add_row(o.name, *(f"${o.cumulative_usd[m - 1]:,.0f}" for m in marks))
    con.print(t)
    con.print(f"[bold green]cheapest over {result.months} months:[/] {result.cheapest_total}")
    runs = [(m + 1, name) for m, name in enumerate(result.cheapest_by_month)]
    firsts = [f"{name} from month {m}" for m, name in runs if m == 1 or runs[m - 2][1] != name]
    con.print("  • cheapest each month: " + ", ".join(firsts))
    for c in result.crossovers:
        con.print(f"  • month {c.month}: {c.cheaper} becomes cheaper in total than {c.dearer}")
    for b in result.breakeven:
        con.print(f"  • {b.option}: {b.reason}")
