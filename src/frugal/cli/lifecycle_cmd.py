"""`frugal lifecycle MODEL`: over months of serving a load, serve the large model as it is,
train MODEL (fine-tune or distil) and serve that, or call an API: training dollars,
serving dollars a month, the total, dollars per million predictions, quality, and the
frontier (serve.lifecycle). The training is `frugal plan`'s plan of the job, the serving
`frugal serve plan`'s cheapest deployment of each model, the API the cheapest bundled one
serving the large model."""

from __future__ import annotations

import math

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
from frugal.ledger.quality import MODEL_METRICS
from frugal.models.specs import load_spec
from frugal.plan.plot import Point, check_plot_path, write_points
from frugal.plan.request import PlanOutcome, PlanRequest, make_plan
from frugal.serve.lifecycle import Lifecycle, Training, lifecycle_of, qualities
from frugal.serve.request import ServeRequest, make_serve_plan
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
        raise FrugalError(
            "--large MODEL: the model to serve as it is (a distillation's default is its --teacher)"
        )
    try:
        load_spec(large)  # before the training plan
    except FrugalError as e:
        raise FrugalError(f"--large {large}: {e}") from None
    if o.plot:
        check_plot_path(o.plot)
        check_target(o.plot, "--plot", force=o.force)
    # a commitment longer than the horizon would still be owed after it: not priced
    terms = tuple(
        t for t in ServeRequest.model_fields["commitment_months"].default if t <= o.months
    )
    asks = {
        m: request_of(ctx, ServeRequest, model=m, commitment_months=terms) for m in (large, o.model)
    }
    asks[large].ask()  # the load checked before the training plan is made and recorded
    trained = make_plan(request_of(ctx, PlanRequest))  # recorded, as every plan
    served = {m: make_serve_plan(q) for m, q in asks.items()}
    quality = qualities(o.metric, large, o.model, o.task, o.dataset, given)
    life = lifecycle_of(
        served[large].plan,
        served[o.model].plan,
        _training(trained),
        quality,
        o.metric,
        o.months,
        o.train_every_months,
    )
    if o.plot:
        _plot(life, o.plot)
    if o.json_out:
        print_json(
            life.to_json()
            | {
                "training_plan": trained.to_json()["recommendation"],
                "plan_id": trained.plan_id,
                "notes": life.notes(),
                "prices": served[large].basis.to_json(),
            }
        )
    else:
        _render(life, o.plot)
    show_prices(served[large].basis, o.json_out)


def _training(trained: PlanOutcome) -> Training:
    rec = trained.result.recommendation
    return Training(
        rec.cost_usd,
        rec.hours * rec.gpus,
        rec.hours,
        rec.label(),
        rec.job.method,
        distilled=rec.job.teacher is not None,
        plan_id=trained.plan_id,
    )


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


def _render(life: Lifecycle, plot: str | None) -> None:
    con = console()
    training = life.training
    assert training is not None
    t = Table(title=f"{life.months} months of {life.requests_per_month:,.0f} requests a month")
    for c in (
        "way",
        "training",
        "serving/mo",
        "total",
        "$/M pred.",
        "GPU-h",
        "quality",
        "frontier",
    ):
        t.add_column(c, justify="left" if c == "way" else "right")
    front = life.frontier
    for w in life.ways:
        q = "-" if w.quality is None else f"{w.quality:.4g}"
        t.add_row(
            escape(w.name),
            usd(w.training_usd * life.trainings),
            usd(w.serving_usd_month),
            usd(life.total_usd(w)),
            usd(life.usd_per_million(w)),
            f"{life.gpu_hours(w):,.0f}",
            q,
            "yes" if w in front else "",
        )
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
    con.print(
        escape(f"training: {training.label}, {training.hours:.2f} h, {usd(training.usd)}{times}")
    )
    con.print(escape(f"cheapest over {life.months} months: {life.cheapest.name}"))
    for n in life.notes():
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
    points = [
        Point(w.quality, life.usd_per_million(w), w.name, w in front)
        for w in known
        if w.quality is not None
    ]
    better = "higher" if life.higher_is_better else "lower"
    write_points(
        path,
        points,
        f"frugal lifecycle: {life.months} months",
        f"{life.metric} ({better} is better)",
        "USD per million predictions",
    )
