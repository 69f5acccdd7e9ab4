"""`frugal lifecycle MODEL`: over months of serving a load, serve the large model as it is,
train MODEL (fine-tune or distil) and serve that, or call an API: training dollars,
serving dollars a month, the total, dollars per million predictions, quality, and the
frontier (serve.lifecycle). The training is `frugal plan`'s plan of the job, the serving
`frugal serve plan`'s cheapest deployment of each model, the API the cheapest bundled one
serving the large model."""

from __future__ import annotations

import math
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from frugal.cli import console, print_json, show_prices
from frugal.cli.options import (
    JSON_HELP,
    MODEL_HELP,
    number,
    option,
    option_set,
    request_of,
    takes,
    token_count,
)
from frugal.config import DataConfig
from frugal.errors import FrugalError
from frugal.files import check_target
from frugal.formats import usd
from frugal.ledger.quality import MODEL_METRICS, Measured, measured
from frugal.models.specs import load_spec
from frugal.plan.plot import Point, check_plot_path, write_points
from frugal.plan.request import PlanOutcome, PlanRequest, make_plan
from frugal.serve import compare
from frugal.serve.lifecycle import Lifecycle, Way
from frugal.serve.plan import HOURS_PER_MONTH, Option
from frugal.serve.request import ServeOutcome, ServeRequest, make_serve_plan
from frugal.step.job import TrainJob

MONTHS = 240  # as `frugal tco`'s longest horizon


@option_set
class LifecycleOptions:
    """The options of `frugal lifecycle`, in the order `--help` shows them."""

    model: str = typer.Argument(..., help="The smaller model to train. " + MODEL_HELP)
    large: str | None = typer.Option(
        None, help="The large model, served as it is or by an API \\[default: --teacher]."
    )
    task: str = option(TrainJob, "task")
    teacher: str | None = option(TrainJob, "teacher")
    method: str = option(TrainJob, "method")
    tokens: float | None = token_count(None, "Training tokens per epoch, e.g. 20M.")
    dataset: str | None = typer.Option(None, help="Or: a .jsonl/.csv/.parquet file to count.")
    epochs: float | None = option(DataConfig, "epochs", unset="the plan chooses it")
    seq: int = option(TrainJob, "seq")
    rate: float | None = option(ServeRequest, "rate", help="Requests per second to serve.")
    requests_per_day: float | None = option(ServeRequest, "requests_per_day")
    input_len: int = option(ServeRequest, "input_len")
    output_len: int = option(ServeRequest, "output_len")
    ttft_ms: float | None = option(ServeRequest, "ttft_ms")
    itl_ms: float | None = option(ServeRequest, "itl_ms")
    months: int = number(12, "Months of serving to compare over.", ge=1, le=MONTHS, whole=True)
    train_every_months: int = number(
        0, "Train the smaller model again every K months (0: once).", ge=0, le=MONTHS, whole=True
    )
    metric: str = typer.Option(
        "loss", help=f"What quality is: {', '.join(MODEL_METRICS)} (from the books' runs)."
    )
    quality: list[str] | None = typer.Option(
        None,
        help="A way's quality where the books hold none: large=VALUE (the large model, as it "
        "is and by API) or trained=VALUE; repeat for both.",
    )
    providers: str | None = typer.Option(None, help="Comma-separated providers to consider.")
    plot: str | None = typer.Option(
        None, help="Chart $ per million predictions vs quality: FILE.png/.svg/.pdf or FILE.html."
    )
    force: bool = typer.Option(False, "--force", help="Replace --plot's file if it exists.")
    tag: list[str] | None = typer.Option(
        None, help="Ledger tag key=value of the training plan; repeat for more."
    )
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)


@takes(LifecycleOptions)
def lifecycle(ctx: typer.Context, o: LifecycleOptions) -> None:
    """Serve the large model as it is, train a smaller one and serve it, or call an API:
    each way's dollars over the months, per million predictions, and beside its quality."""
    if o.metric not in MODEL_METRICS:
        raise FrugalError(f"--metric {o.metric!r}: give {', '.join(MODEL_METRICS)}")
    given = _given_quality(o.quality or [])
    large = o.large or o.teacher
    if large is None:
        raise FrugalError("--large MODEL: the model to serve as it is (a distillation's "
                          "default is its --teacher)")  # fmt: skip
    try:
        load_spec(large)  # before the training plan
    except FrugalError as e:
        raise FrugalError(f"--large {large}: {e}") from None
    if o.plot:
        check_plot_path(o.plot)
        check_target(o.plot, "--plot", force=o.force)
    # a commitment longer than the horizon would still be owed after it: not priced
    terms = tuple(t for t in ServeRequest.model_fields["commitment_months"].default
                  if t <= o.months)  # fmt: skip
    asks = {m: request_of(ctx, ServeRequest, model=m, commitment_months=terms)
            for m in (large, o.model)}  # fmt: skip
    asks[large].ask()  # the load checked before the training plan is made and recorded
    trained = make_plan(request_of(ctx, PlanRequest))  # recorded, as every plan
    served = {m: make_serve_plan(q) for m, q in asks.items()}
    life = _lifecycle(o, large, trained, served, given)
    if o.plot:
        _plot(life, o.plot)
    if o.json_out:
        print_json(life.to_json() | {
            "training_plan": trained.to_json()["recommendation"],
            "plan_id": trained.plan_id, "notes": _notes(life, trained),
            "prices": served[large].basis.to_json(),
        })  # fmt: skip
    else:
        _render(life, trained, o.plot)
    show_prices(served[large].basis, o.json_out)


def _given_quality(flags: list[str]) -> dict[str, float]:
    out = {}
    for f in flags:
        name, _, value = f.partition("=")
        if name not in ("large", "trained") or not value:
            raise FrugalError(f"--quality {f!r}: give large=VALUE or trained=VALUE")
        try:
            out[name] = float(value)
        except ValueError:
            out[name] = math.nan
        if not math.isfinite(out[name]):
            raise FrugalError(f"--quality {f!r}: {value!r} is not a number")
    return out


def _lifecycle(
    o: LifecycleOptions, large: str, trained: PlanOutcome, served: dict[str, ServeOutcome],
    given: dict[str, float],
) -> Lifecycle:  # fmt: skip
    big, small = served[large].plan, served[o.model].plan
    month_requests = big.ask.billed_rate * 3600 * HOURS_PER_MONTH
    q_large, q_trained = _quality(o, large, given)
    rec = trained.result.recommendation
    job = rec.job
    how = "distilled" if job.teacher else "fine-tuned"  # (a teacher: only distillation's)
    trained_way = f"{_short(small.ask.spec.id)} {how}, {job.method}"
    ways = [
        _self_hosted(f"{_short(big.ask.spec.id)} as it is", big.best, q_large),
        _self_hosted(trained_way, small.best, q_trained, rec.cost_usd, rec.hours * rec.gpus),
    ]
    apis = compare.apis(big)
    if apis:
        a = apis[0]
        ways.append(Way(f"{_short(big.ask.spec.id)} by API, {a['provider']}", big.ask.spec.id,
                        f"{a['provider']} {a['api_model']}",
                        serving_usd_month=a["usd_per_month"],
                        quality=q_large[0], quality_from=q_large[1]))  # fmt: skip
    _, label, higher = MODEL_METRICS[o.metric]
    return Lifecycle(ways, o.months, month_requests, label, higher, o.train_every_months)


def _short(model: str) -> str:
    """A model's name without its owner (the table's; the lines below it say the whole)."""
    return model.rstrip("/").rsplit("/", 1)[-1]


def _self_hosted(
    name: str, best: Option, quality: tuple[float | None, str], training_usd: float = 0.0,
    training_gpu_h: float = 0.0,
) -> Way:  # fmt: skip
    gpus = best.instances * best.offer.gpus
    return Way(name, best.cap.d.spec.id, best.label(), training_usd, training_gpu_h,
               best.usd_per_month, gpus * HOURS_PER_MONTH, *quality)  # fmt: skip


def _quality(
    o: LifecycleOptions, large: str, given: dict[str, float]
) -> tuple[tuple[float | None, str], tuple[float | None, str]]:
    """The large model's and the trained one's quality: given, or the books' newest
    finished run that made the large model (a directory frugal trained) or trained the job
    (the same model, task and data)."""
    from frugal.ledger.lifetime import served
    from frugal.ledger.spool import attempt

    def seen(m: Measured | None) -> tuple[float | None, str]:
        return (m.value, f"run {m.run_id[:8]} on the books") if m else (None, "")

    def books(led: Any) -> tuple[Measured | None, Measured | None]:
        try:
            runs = served(led, large).runs
        except FrugalError:
            runs = ()
        big = measured(led, o.metric, runs=runs) if runs else None
        mine = measured(led, o.metric, model=o.model, task=o.task, data=o.dataset)
        return big, mine

    found, _ = attempt(books)
    big, mine = found or (None, None)
    out = []
    for key, m in (("large", big), ("trained", mine)):
        out.append((given[key], "--quality") if key in given else seen(m))
    return out[0], out[1]


def _notes(life: Lifecycle, trained: PlanOutcome) -> list[str]:
    notes = []
    train = next(w for w in life.ways if w.training_usd)
    for other in life.ways:
        if other is train:
            continue
        m = life.pays_back_months(train, other)
        if m is None:
            notes.append(f"training never pays back against {other.name}: its serving costs "
                         f"{usd(other.serving_usd_month)} a month, no more than the trained "
                         f"model's {usd(train.serving_usd_month)}")  # fmt: skip
        elif life.retrain_every and m > life.retrain_every:
            notes.append(f"each training costs more than the {life.retrain_every} months of "
                         f"serving it saves against {other.name}")  # fmt: skip
        else:
            when = f"{m:,.1f} months" if m >= 1 else f"{m * 30.44:,.1f} days"
            notes.append(f"training pays for itself against {other.name} after {when} of "
                         "serving")  # fmt: skip
    known = sum(w.quality is not None for w in life.ways)
    if not known:
        notes.append("no quality on the books for these models: train and evaluate them "
                     "(frugal train), or give --quality large=VALUE and trained=VALUE")  # fmt: skip
    elif known < len(life.ways):
        notes.append(f"the frontier is of the ways whose quality is known ({known} of "
                     f"{len(life.ways)}); give the others' with --quality")  # fmt: skip
    notes.append("serving: each model's cheapest deployment for the load (frugal serve plan), "
                 "billed every hour of the month; training: frugal plan's plan (plan "
                 f"{trained.plan_id or 'not recorded'})")  # fmt: skip
    return notes


def _render(life: Lifecycle, trained: PlanOutcome, plot: str | None) -> None:
    con = console()
    rec = trained.result.recommendation
    t = Table(title=f"{life.months} months of {life.requests_per_month:,.0f} requests a month")
    for c in ("way", "training", "serving/mo", "total", "$/M pred.", "GPU-h", "quality",
              "frontier"):  # fmt: skip
        t.add_column(c, justify="left" if c == "way" else "right")
    front = life.frontier
    for w in life.ways:
        q = "-" if w.quality is None else f"{w.quality:.4g}"
        t.add_row(escape(w.name), usd(w.training_usd * life.trainings), usd(w.serving_usd_month),
                  usd(life.total_usd(w)), usd(life.usd_per_million(w)),
                  f"{life.gpu_hours(w):,.0f}", q, "yes" if w in front else "")  # fmt: skip
    con.print(t)
    for w in life.ways:
        con.print(
            escape(
                f"{w.name}: {w.serving}"
                + (f"; quality from {w.quality_from}" if w.quality_from else "")
            )
        )
    better = "higher" if life.higher_is_better else "lower"
    con.print(
        escape(
            f"quality: {life.metric} ({better} is better); $/M pred.: total dollars "
            "per million requests served"
        )
    )
    every = "month" if life.retrain_every == 1 else f"{life.retrain_every} months"
    times = f", {life.trainings} times (every {every})" if life.trainings > 1 else ""
    con.print(escape(f"training: {rec.label()}, {rec.hours:.2f} h, {usd(rec.cost_usd)}{times}"))
    con.print(escape(f"cheapest over {life.months} months: {life.cheapest.name}"))
    for n in _notes(life, trained):
        con.print(escape(f"note: {n}"))
    if plot:
        con.print(escape(f"wrote {plot}: $ per million predictions against {life.metric}"))


def _plot(life: Lifecycle, path: str) -> None:
    known = [w for w in life.ways if w.quality is not None]
    if not known:
        raise FrugalError(
            f"--plot {path}: no way has a known quality to draw against: give --quality "
            "large=VALUE and trained=VALUE (nothing was written)"
        )
    front = life.frontier
    points = [Point(w.quality, life.usd_per_million(w), w.name, w in front)
              for w in known if w.quality is not None]  # fmt: skip
    better = "higher" if life.higher_is_better else "lower"
    write_points(path, points, f"frugal lifecycle: {life.months} months",
                 f"{life.metric} ({better} is better)", "USD per million predictions")  # fmt: skip
