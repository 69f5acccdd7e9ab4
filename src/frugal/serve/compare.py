"""Beside a serving plan: the hosted APIs of the same open model, managed platforms, the
weight formats side by side, and where self-hosting breaks even with the cheapest API.

An API bills tokens: a request costs (I x input price + O x output price) / 1e6. A server
bills hours whether used or not: one instance costs H $/hour and carries C requests/s within
the targets. They cost the same at R* = H / (3600 x API cost per request); below R* (or
below R* / C of the instance's capacity) the API is cheaper. A managed platform (SageMaker,
Hugging Face Endpoints) runs the same replicas at its own hourly rate (prices.py).
"""

from __future__ import annotations

from typing import Any

from frugal.serve.plan import HOURS_PER_MONTH, Option, ServePlan
from frugal.serve.prices import ApiPrice, api_prices, platform_rates


def api_usd_per_request(a: ApiPrice, i: int, o: int, batch: bool = False) -> float:
    return a.cost_usd(i / 1e6, o / 1e6, batch)


def apis(p: ServePlan) -> list[dict[str, Any]]:
    """Every bundled API serving the model, priced for this load, cheapest first."""
    ask = p.ask
    out = []
    for a in api_prices(ask.spec.id):
        per = api_usd_per_request(a, ask.input_len, ask.output_len, batch=ask.offline)
        out.append(
            a.to_json()
            | {
                "batch_priced": bool(ask.offline and a.batch_discount),
                "usd_per_request": round(per, 7),
                "usd_per_month": round(per * ask.billed_rate * 3600 * HOURS_PER_MONTH, 2),
            }
        )
    return sorted(out, key=lambda r: r["usd_per_request"])


def break_even(p: ServePlan, cheapest_api: dict[str, Any] | None) -> dict[str, Any] | None:
    """The load at which one instance of the chosen option costs what the cheapest API does."""
    if cheapest_api is None:
        return None
    b: Option = p.best
    per_req = cheapest_api["usd_per_request"]
    capacity = b.cap.rate * b.replicas_per_instance  # requests/s one instance carries
    rate = b.instance_usd_h / 3600 / per_req if per_req else float("inf")
    util = rate / capacity
    api = cheapest_api["provider"]
    api_h = per_req * p.ask.billed_rate * 3600  # the API's bill for this load, per hour
    cheaper = b.usd_h < api_h
    if util > 1:
        text = (
            f"self-hosting never beats {api}: even fully used, one {b.offer.instance} costs "
            f"${b.instance_usd_h / 3600 / capacity:.6f} per request against ${per_req:.6f}"
        )
    else:
        text = (
            f"one {b.offer.instance} beats {api} above {rate:,.2f} requests/s ({util:.0%} of "
            f"its capacity of {capacity:,.2f} requests/s); for this load the "
            f"{'servers' if cheaper else 'API'} cost less: ${b.usd_h:,.2f}/h against "
            f"${api_h:,.2f}/h"
        )
    return {
        "api": api,
        "rate_requests_per_s": round(rate, 4) if util <= 1 else None,
        "utilization": round(util, 4) if util <= 1 else None,
        "self_hosted_cheaper": cheaper,
        "self_hosted_usd_h": round(b.usd_h, 4),
        "api_usd_h": round(api_h, 4),
        "text": text,
    }


def platforms(p: ServePlan) -> list[dict[str, Any]]:
    """Managed platforms running the chosen replicas, with their monthly cost."""
    b = p.best
    d = b.cap.d
    per_gpu = b.offer.ondemand_usd_h / b.offer.gpus
    out = []
    for r in platform_rates(d.gpu.name, d.tp, per_gpu * d.tp, b.offer.instance):
        if r.platform == "sagemaker" and b.offer.provider != "aws":
            continue
        replicas_per = max(r.gpus // d.tp, 1)
        n = -(-b.replicas // replicas_per)
        usd_h = n * r.usd_h
        out.append(
            r.to_json()
            | {
                "replicas": n,
                "usd_h_total": round(usd_h, 4),
                "usd_per_month": round(usd_h * HOURS_PER_MONTH, 2),
            }
        )
    return sorted(out, key=lambda r: r["usd_h_total"])


def formats(p: ServePlan) -> list[dict[str, Any]]:
    """The cheapest option of each weight format, with its published quality cost."""
    seen: dict[str, Option] = {}
    for o in p.options:
        seen.setdefault(o.cap.d.fmt.name, o)
    return [
        {
            "quant": q,
            "option": o.label(),
            "usd_per_month": round(o.usd_per_month, 2),
            "usd_per_million_output_tokens": round(o.usd_per_mtok, 4),
            "replica_capacity_requests_per_s": round(o.cap.rate, 3),
            "quality": o.cap.d.fmt.quality,
        }
        for q, o in seen.items()
    ]
