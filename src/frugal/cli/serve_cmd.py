"""`frugal serve estimate` and `frugal serve plan`: what serving a model costs, and the
cheapest way to serve it."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from frugal.cli import console, print_json, show_prices
from frugal.cli.options import (
    JSON_HELP,
    MODEL_HELP,
    OFFERS_HELP,
    number,
    option,
    option_set,
    request_of,
    takes,
)
from frugal.errors import FrugalError
from frugal.files import check_target, write_text_atomic
from frugal.hardware.catalog import price_basis, select_offers
from frugal.hardware.gpus import find_gpu
from frugal.models.specs import load_spec
from frugal.serve import emit
from frugal.serve.engines import find_engine
from frugal.serve.estimate import (
    Deployment,
    ServeEstimate,
    catalog_price,
    estimate,
)
from frugal.serve.plan import ServePlan
from frugal.serve.request import ServeRequest, make_serve_plan
from frugal.serve.speed import Load
from frugal.serve.weights import find_format

app = typer.Typer(
    help="Serving: memory, throughput, latency and dollars per token; the cheapest way to "
    "serve a model, and when an API is cheaper.",
    no_args_is_help=True,
)

QUANT_HELP = "Weight format: bf16, fp16, fp8, awq, gptq, nf4, gguf-q4_k_m, gguf-q8_0."
ENGINE_HELP = "Serving engine: vllm, sglang or trtllm."


def load_from(concurrency: int | None, rate: float | None, offline: bool, requests: int) -> Load:
    """Exactly one of --concurrency, --rate, --offline."""
    given = sum(x is not None and x is not False for x in (concurrency, rate, offline or None))
    if given != 1:
        raise FrugalError("give the load: one of --concurrency C, --rate R or --offline")
    if offline:
        return Load(burst=requests)
    return Load(concurrency=concurrency, rate=rate)


@option_set
class ServeEstimateOptions:
    """The options of `frugal serve estimate`, in the order `--help` shows them."""

    model: str = typer.Argument(..., help=MODEL_HELP)
    gpu: str = typer.Option(..., help="GPU type, e.g. H100, L40S, 'RTX 4090'.")
    gpus: int = number(1, "GPUs per server (tensor parallel).", ge=1, le=64, whole=True)
    engine: str = typer.Option("vllm", help=ENGINE_HELP)
    quant: str = typer.Option("bf16", help=QUANT_HELP)
    kv_dtype: str = option(ServeRequest, "kv_dtype")
    input_len: int = option(ServeRequest, "input_len")
    output_len: int = option(ServeRequest, "output_len")
    concurrency: int | None = number(
        None, "Requests in flight (closed loop).", ge=1, le=10_000_000, whole=True
    )
    rate: float | None = option(
        ServeRequest, "rate", help="Requests arriving per second (Poisson)."
    )
    offline: bool = typer.Option(False, help="All requests at once: maximum throughput.")
    requests: int = number(
        1000, "With --offline: how many requests at once.", ge=1, le=10_000_000, whole=True
    )
    prefix_hit: float = option(ServeRequest, "prefix_hit")
    price: float | None = number(
        None,
        "$/hour of the whole server [default: the catalog's cheapest on-demand].",
        ge=0,
        le=1e5,
    )
    memory_fraction: float | None = number(
        None, "The engine's memory fraction (vLLM --gpu-memory-utilization).", gt=0, le=1
    )
    max_num_seqs: int | None = number(
        None, "The engine's sequence limit.", ge=1, le=10_000_000, whole=True
    )
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)


@takes(ServeEstimateOptions)
def estimate_cmd(ctx: typer.Context, o: ServeEstimateOptions) -> None:
    """Memory, KV capacity, throughput, latency and $ per token of one deployment."""
    load = load_from(o.concurrency, o.rate, o.offline, o.requests)
    g = find_gpu(o.gpu)
    d = Deployment(
        load_spec(o.model),
        g,
        o.gpus,
        find_engine(o.engine),
        find_format(o.quant),
        o.kv_dtype.lower(),
        o.memory_fraction,
        o.max_num_seqs,
    )
    offers = select_offers()
    priced = (o.price, "--price") if o.price is not None else catalog_price(g, o.gpus, offers)
    e = estimate(d, o.input_len, o.output_len, load, o.prefix_hit, priced)
    basis = price_basis(offers) if o.price is None else None
    if o.json_out:
        print_json(e.to_json() | ({"prices": basis.to_json()} if basis else {}))
    else:
        render(e)
    if basis:
        show_prices(basis, o.json_out)


def render(e: ServeEstimate) -> None:
    con, j, m = console(), e.to_json(), e.memory
    d = e.d
    con.print(
        f"[bold]{d.spec.id}[/] · {d.fmt.name} on {d.tp}x {d.gpu.name} · {d.engine.label} · "
        f"{e.input_len:,} in / {e.output_len:,} out"
    )
    t = Table(title="memory per GPU (GiB)")
    for col in ("total", "x fraction", "weights", "activations", "non-torch", "KV cache"):
        t.add_column(col, justify="right")
    t.add_row(
        f"{m.total_gib:.2f}",
        f"{m.budget_gib:.2f}",
        f"{m.weights_gib:.2f}",
        f"{m.activation_gib:.2f}",
        f"{m.non_torch_gib:.2f}",
        f"{m.kv_cache_gib:.2f}",
    )
    con.print(t)
    con.print(
        f"KV: {j['kv_bytes_per_token']:,} B/token · {m.kv_cache_tokens:,} tokens · "
        f"max concurrency {m.max_concurrency:,} requests of {e.input_len + e.output_len:,} tokens"
    )
    ttft = "unbounded (queue grows)" if j["ttft_ms"] is None else f"{j['ttft_ms']:,.0f} ms"
    con.print(
        f"[bold green]{j['output_tokens_per_s']:,.0f} output tokens/s[/] · "
        f"{j['requests_per_s']:,.2f} requests/s (capacity {j['capacity_requests_per_s']:,.2f}) · "
        f"batch {j['batch']:g} · TTFT {ttft} · ITL {j['itl_ms']:,.1f} ms"
    )
    if e.price_usd_h is not None:
        con.print(
            f"[bold]${j['usd_per_million_output_tokens']:,.3f}[/] per million output tokens · "
            f"${j['usd_per_request']:.5f} per request at ${e.price_usd_h:,.2f}/h "
            f"({e.price_note})"
        )
    for note in e.notes:
        con.print(f"  • {note}")


@option_set
class ServePlanOptions:
    """The options of `frugal serve plan`, in the order `--help` shows them."""

    model: str = typer.Argument(..., help=MODEL_HELP)
    rate: float | None = option(ServeRequest, "rate")
    requests_per_day: float | None = option(ServeRequest, "requests_per_day")
    peak_factor: float = option(ServeRequest, "peak_factor")
    input_len: int = option(ServeRequest, "input_len")
    output_len: int = option(ServeRequest, "output_len")
    ttft_ms: float | None = option(ServeRequest, "ttft_ms")
    itl_ms: float | None = option(ServeRequest, "itl_ms")
    quant: str = option(ServeRequest, "quant", listed=True)
    engine: str = option(ServeRequest, "engine", listed=True)
    kv_dtype: str = option(ServeRequest, "kv_dtype")
    prefix_hit: float = option(ServeRequest, "prefix_hit")
    response_cache_hit: float = option(ServeRequest, "response_cache_hit")
    offline: bool = option(ServeRequest, "offline")
    commitment_months: str = option(ServeRequest, "commitment_months", listed=True)
    providers: str | None = typer.Option(None, help="Comma-separated providers to consider.")
    offers: list[str] | None = typer.Option(None, "--offers", "--prices", help=OFFERS_HELP)
    discount: list[str] | None = typer.Option(None, help="PROVIDER=PERCENT off, e.g. aws=15.")
    emit: str | None = typer.Option(
        None, help="vllm (the `vllm serve` command) or skypilot (a SkyPilot serve task)."
    )
    emit_file: str | None = typer.Option(
        None, help="Where --emit writes [default: stdout for vllm, serve.yaml for skypilot]."
    )
    adapter: str | None = typer.Option(
        None, help="A LoRA adapter from `frugal train` (its output dir) for --emit."
    )
    weights: str | None = typer.Option(
        None,
        help="For --emit: the quantized checkpoint to serve (AWQ/GPTQ hub id or path, .gguf "
        "file or REPO:QUANT) when the plan picks a pre-quantized format.",
    )
    force: bool = typer.Option(False, "--force", help="Replace the --emit-file if it exists.")
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)


@takes(ServePlanOptions)
def plan_cmd(ctx: typer.Context, o: ServePlanOptions) -> None:
    """The cheapest GPU, tensor parallel size and replicas that carry the load within the
    latency targets, beside the hosted APIs and managed platforms."""
    if o.emit not in (None, "vllm", "skypilot"):
        raise FrugalError(f"--emit {o.emit!r}: use vllm or skypilot")
    if o.emit_file and not o.emit:
        raise FrugalError("--emit-file names where --emit writes: add --emit vllm or skypilot")
    path = o.emit_file or ("serve.yaml" if o.emit == "skypilot" else None)
    if path:
        check_target(path, "--emit-file", force=o.force)
    done = make_serve_plan(request_of(ctx, ServeRequest))
    out = done.to_json()
    text = emitted(done.plan, o.emit, o.adapter, o.weights) if o.emit else ""
    if o.emit and path:
        write_text_atomic(path, text)
        out[f"wrote_{o.emit}"] = path
    elif o.emit:
        out["vllm_command"] = text.strip()
    if o.json_out:
        print_json(out)
        show_prices(done.basis, o.json_out)
        return
    render_plan(done.plan, out)
    if o.emit and path:
        console().print(f"wrote {path}")
    elif o.emit:
        print(text, end="")
    show_prices(done.basis)


PREQUANTIZED = ("awq", "gptq", "gguf-q4_k_m", "gguf-q8_0")  # served from their own checkpoint


def emitted(p: ServePlan, what: str, adapter: str | None, weights: str | None) -> str:
    """The chosen option as a `vllm serve` command or a SkyPilot serve task."""
    b = p.best
    d = b.cap.d
    if d.fmt.name in PREQUANTIZED and not weights:
        raise FrugalError(
            f"the plan serves {d.fmt.name} weights: give --weights (the {d.fmt.name} checkpoint "
            "to serve), or plan with --quant bf16,fp8 (vLLM quantizes those on load)"
        )
    dep = emit.Launch(
        model=d.spec.id,
        gpu=d.gpu.name,
        max_model_len=p.ask.input_len + p.ask.output_len,
        max_num_seqs=min(b.cap.at.memory.max_concurrency, d.seqs),
        gpus_per_replica=d.tp,
        replicas=b.instances * b.replicas_per_instance,
        spot=b.pricing == "spot",
        provider=b.offer.provider,
        region=b.offer.region,
        engine=d.engine.name,  # type: ignore[arg-type]
        quant=d.fmt.name,  # type: ignore[arg-type]
        kv_dtype=d.kv_dtype,  # type: ignore[arg-type]
        gpu_memory_utilization=d.engine.memory_fraction,
        adapter=adapter,
        # the most one replica carries within the latency targets: scale out past it
        target_rps_per_replica=round(b.cap.rate, 3),
        weights=weights,
    )
    if what == "vllm":
        return emit.vllm_command(dep) + "\n"
    return emit.skypilot_serve_task(dep)


def render_plan(p: ServePlan, out: dict[str, Any]) -> None:
    con, b, ask = console(), p.best, p.ask
    con.print(
        f"[bold]{ask.spec.id}[/] · {ask.rate:g} requests/s · {ask.input_len:,} in / "
        f"{ask.output_len:,} out · {len(p.options)} priced options"
    )
    con.print(f"[bold green]plan:[/] {b.label()}")
    con.print(
        f"      [bold]${b.usd_h:,.2f}/h[/] · ${b.usd_per_month:,.0f}/month · "
        f"${b.usd_per_mtok:,.3f} per million output tokens · ${b.usd_per_request:.6f} per "
        f"request · TTFT {b.cap.at.to_json()['ttft_ms']:,.0f} ms · ITL "
        f"{b.cap.at.speed.itl_s * 1e3:,.1f} ms"
    )
    for reason in p.reasons:
        con.print(f"  • {reason}")
    t = Table(title="weight formats side by side (cheapest option of each)")
    for col in ("quant", "option", "$/month", "$/M output tok", "req/s per replica", "quality"):
        t.add_column(col, justify="left" if col in ("quant", "option", "quality") else "right")
    for f in out["formats"]:
        t.add_row(
            f["quant"],
            f["option"],
            f"${f['usd_per_month']:,.0f}",
            f"${f['usd_per_million_output_tokens']:,.3f}",
            f"{f['replica_capacity_requests_per_s']:,.2f}",
            f["quality"],
        )
    con.print(t)
    if out["apis"]:
        t = Table(title="hosted APIs serving the same model")
        for col in ("provider", "$ in / out per M", "$/request", "$/month"):
            t.add_column(col, justify="left" if col == "provider" else "right")
        t.add_row(
            "self-hosted (plan)", "-", f"${b.usd_per_request:.6f}", f"${b.usd_per_month:,.0f}"
        )
        for a in out["apis"]:
            t.add_row(
                f"{a['provider']}{' (batch)' if a['batch_priced'] else ''}",
                f"${a['input_usd_per_mtok']:g} / ${a['output_usd_per_mtok']:g}",
                f"${a['usd_per_request']:.6f}",
                f"${a['usd_per_month']:,.0f}",
            )
        con.print(t)
    if out["break_even"]:
        con.print(f"  • {out['break_even']['text']}")
    for m in out["platforms"]:
        con.print(
            f"  • managed: {m['platform']} ({m['provider']} {m['instance']}) "
            f"${m['usd_per_month']:,.0f}/month for {m['replicas']} replica(s)"
            f"{'' if m['scales_to_zero'] else '; cannot scale to zero'}"
        )
    for note in out["notes"]:
        con.print(f"  • {note}")


app.command("estimate")(estimate_cmd)
app.command("plan")(plan_cmd)
