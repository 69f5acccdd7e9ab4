"""The dashboard's JSON API (`/api/...`): every figure a page shows comes from here, computed
by the ledger's own functions (frugal.ledger.report, .budgets, .store) and, for a new plan,
by the plan API that `frugal plan` calls (frugal.plan.request). Only that changes the
books: it records its plan, as the command does."""

from __future__ import annotations

import json
import statistics
import threading
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request
from pydantic import ValidationError
from sqlalchemy import select

from frugal.errors import FrugalError
from frugal.ledger import budgets as B
from frugal.ledger.periods import parse_period, period_end
from frugal.ledger.quality import quality
from frugal.ledger.report import OUTCOMES, RUNNING, daily_spend_by, report
from frugal.ledger.schema import Heartbeat, PlanRecord, RunRecord, Tag
from frugal.ledger.store import Ledger, aware
from frugal.ledger.tags import parse_tags
from frugal.plan.request import PlanRequest, make_plan
from frugal.validation import refusal

router = APIRouter(prefix="/api")
METRICS_TAIL = 2000  # the newest metric lines of a run a page is sent
TOP_RUNS = 10
RATE_BEATS = 10  # heartbeats whose pace gives a running run's ETA


def ledger(request: Request) -> Ledger:
    led: Ledger = request.app.state.ledger
    return led


def _bad(e: FrugalError) -> HTTPException:
    return HTTPException(status_code=422, detail=str(e))


@router.get("/overview")
def overview(request: Request, period: str = "this-month", by: str = "project") -> dict[str, Any]:
    """This period's spend by group with the month-end projection and anomalies, the spend
    per group and day, the costliest runs, and each budget against its amount."""
    led = ledger(request)
    try:
        r = report(led, by=by, period=period)
        daily = daily_spend_by(led, by, period)
    except FrugalError as e:
        raise _bad(e) from None
    p = r.period
    q = select(RunRecord).order_by(RunRecord.cost_usd.desc(), RunRecord.id).limit(TOP_RUNS)
    if p.start is not None:
        q = q.where(RunRecord.started_at >= p.start)
    if p.end is not None:
        q = q.where(RunRecord.started_at < p.end)
    with led.session() as s:
        top = list(s.scalars(q))
    return {
        "report": r.to_json(),
        "daily_spend_usd": daily,
        "top_runs": [run_row(x, led.tags("run", x.id)) for x in top],
        "budgets": [st.to_json() for st in B.statuses(led)],
    }


def run_row(r: RunRecord, tags: dict[str, str]) -> dict[str, Any]:
    """A run as the pages list it: what was predicted beside what happened."""
    p, a = r.predicted or {}, r.actual or {}
    return {
        "id": r.id,
        "model": r.model,
        "method": r.method,
        "provider": r.provider,
        "instance": r.instance,
        "gpu": r.gpu,
        "gpus": r.gpus,
        "spot": r.spot,
        "dry_run": r.dry_run,
        "outcome": r.outcome or "running",
        "started_at": aware(r.started_at).isoformat(),
        "heartbeat_at": aware(r.heartbeat_at).isoformat(),
        "ended_at": aware(r.ended_at).isoformat() if r.ended_at else None,
        "price_per_hour_usd": r.price_per_hour_usd,
        "step": r.step,
        "tokens": r.tokens,
        "cost_usd": r.cost_usd,
        "hours": r.hours,
        "gpu_hours": r.gpu_hours,
        "predicted": {
            "hours": p.get("hours"),
            "cost_usd": p.get("cost_usd"),
            "tokens_per_s": p.get("tokens_per_s"),
            "peak_reserved_gib": p.get("peak_reserved_gib"),
        },
        "actual": {
            "hours": a.get("hours"),
            "cost_usd": a.get("cost_usd"),
            "tokens_per_s": a.get("tokens_per_s"),
            "peak_reserved_gib": a.get("peak_reserved_gib"),
        },
        "plan_id": r.plan_id,
        "tags": tags,
        "total_steps": r.total_steps,
    }


@router.get("/runs")
def runs(
    request: Request,
    period: str = "all",
    outcome: str | None = None,
    gpu: str | None = None,
    tag: Annotated[list[str] | None, Query(description="key=value; repeat for more")] = None,
    limit: int = Query(200, ge=1, le=5000),
) -> dict[str, Any]:
    """Runs started in `period`, newest first, filtered by outcome, GPU and tags."""
    try:
        p = parse_period(period)
    except FrugalError as e:
        raise _bad(e) from None
    wanted = {}
    for item in tag or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise HTTPException(status_code=422, detail=f"tag {item!r}: write key=value")
        wanted[key] = value
    q = select(RunRecord).order_by(RunRecord.started_at.desc()).limit(limit)
    if p.start is not None:
        q = q.where(RunRecord.started_at >= p.start)
    if p.end is not None:
        q = q.where(RunRecord.started_at < p.end)
    if outcome and outcome not in (*OUTCOMES, RUNNING):
        raise HTTPException(
            status_code=422,
            detail=f"outcome {outcome!r}: use {', '.join(OUTCOMES)} or {RUNNING}",
        )
    if outcome == RUNNING:
        q = q.where(RunRecord.outcome.is_(None))
    elif outcome:
        q = q.where(RunRecord.outcome == outcome)
    if gpu:
        q = q.where(RunRecord.gpu == gpu)
    for k, v in wanted.items():
        q = q.where(
            select(Tag.ref)
            .where(Tag.kind == "run", Tag.ref == RunRecord.id, Tag.key == k, Tag.value == v)
            .exists()
        )
    with ledger(request).session() as s:
        found = list(s.scalars(q))
        tags: dict[str, dict[str, str]] = {r.id: {} for r in found}
        if found:
            for t in s.scalars(select(Tag).where(Tag.kind == "run", Tag.ref.in_(list(tags)))):
                tags[t.ref][t.key] = t.value
    return {"period": p.to_json(), "runs": [run_row(r, tags[r.id]) for r in found]}


@router.get("/runs/{run_id}")
def run(request: Request, run_id: str) -> dict[str, Any]:
    """One run: its record, its heartbeats and its metrics (loss, eval loss, tokens/s, ...)
    from the run's metrics.jsonl while the dashboard can read its directory."""
    led = ledger(request)
    with led.session() as s:
        r = s.get(RunRecord, run_id)
        if r is None:
            raise HTTPException(status_code=404, detail=f"no run {run_id!r} on the books")
        beats = [
            {
                "at": aware(h.at).isoformat(),
                "step": h.step,
                "tokens": h.tokens,
                "cost_usd": h.cost_usd,
            }
            for h in s.scalars(
                select(Heartbeat).where(Heartbeat.run_id == run_id).order_by(Heartbeat.at)
            )
        ]
    row = run_row(r, led.tags("run", run_id))
    row.update(
        config=r.config,
        heartbeats=beats,
        metrics=_metrics(r.output_dir),
        budgets=[s.to_json() for s in B.statuses(led, row["tags"])],
        total_steps=r.total_steps,
        **(pace(beats, r.total_steps) if r.outcome is None else {}),
    )
    return row


def pace(beats: list[dict[str, Any]], total_steps: int | None) -> dict[str, float]:
    """A running run's ETA and projected dollars, at the pace of its last heartbeats."""
    recent = beats[-RATE_BEATS:]
    if total_steps is None or len(recent) < 2:
        return {}
    first, last = recent[0], recent[-1]
    seconds = datetime.fromisoformat(last["at"]) - datetime.fromisoformat(first["at"])
    steps = last["step"] - first["step"]
    if steps <= 0 or seconds.total_seconds() <= 0:
        return {}
    eta_s = max(0, total_steps - last["step"]) * seconds.total_seconds() / steps
    usd_per_s = (last["cost_usd"] - first["cost_usd"]) / seconds.total_seconds()
    return {
        "eta_s": round(eta_s, 1),
        "projected_usd": round(last["cost_usd"] + eta_s * usd_per_s, 4),
    }


def _metrics(output_dir: str) -> list[dict[str, Any]]:
    path = Path(output_dir) / "metrics.jsonl" if output_dir else None
    if path is None or not path.is_file():
        return []
    out = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for ln in lines[-METRICS_TAIL:]:
        try:
            row = json.loads(ln)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(row, dict):
            out.append({k: v for k, v in row.items() if isinstance(v, int | float)})
    return out


@router.get("/budgets")
def budgets(request: Request) -> dict[str, Any]:
    """Each budget with its spend this period (and how it built up, day by day), and the
    alerts that fired."""
    led = ledger(request)
    fired = [
        {
            "budget": name,
            "threshold_pct": a.threshold,
            "spend_usd": a.spend_usd,
            "period_start": aware(a.period_start).isoformat(),
            "fired_at": aware(a.fired_at).isoformat(),
        }
        for name, a in B.alerts(led)
    ]
    rows = []
    with led.session() as ses:
        for st in B.statuses(led):
            end = period_end(st.budget.period, st.period_start)
            days = sorted(B.daily_spend(ses, st.budget.scope, st.period_start, end).items())
            total, burn = 0.0, []
            for day, usd in days:  # the period's spend, day by day: the burn against the amount
                total += usd
                burn.append({"day": day.isoformat(), "spent_usd": round(total, 4)})
            rows.append(st.to_json() | {"burn": burn})
    return {"budgets": rows, "alerts": fired}


@router.get("/plans/{plan_id}")
def plan(request: Request, plan_id: int) -> dict[str, Any]:
    """A recorded plan: its choice, its cost-vs-time frontier and what it rejected."""
    led = ledger(request)
    if not 0 < plan_id <= MAX_ID:  # the database's integers end there (it was an HTTP 500)
        raise HTTPException(status_code=404, detail=f"no plan {plan_id} on the books")
    with led.session() as s:
        p = s.get(PlanRecord, plan_id)
        if p is None:
            raise HTTPException(status_code=404, detail=f"no plan {plan_id} on the books")
    return {
        "id": p.id,
        "created_at": aware(p.created_at).isoformat(),
        "model": p.model,
        "tokens": p.tokens,
        "tags": led.tags("plan", str(p.id)),
        "plan": p.record,
    }


def json_body(request: Request) -> None:
    """A body this API reads must say it is JSON: a page of another site can send a plain
    form or text to a dashboard on loopback without asking first, but not JSON."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise HTTPException(status_code=415, detail="send the request as application/json")


MAX_ID = 2**63 - 1  # the largest id the ledger's databases hold
# plans asked at once are made one after the other: the estimator's caches and profiles
# are per process, not guarded for threads, and each simulation uses every core anyway
PLANNING = threading.Lock()
PLAN_SCHEMA = PlanRequest.model_json_schema()  # the body, described as the model it is
PLAN_BODY = {"required": True, "content": {"application/json": {"schema": PLAN_SCHEMA}}}


@router.post("/plans", dependencies=[Depends(json_body)], openapi_extra={"requestBody": PLAN_BODY})
def new_plan(request: Request, asked: Annotated[Any, Body()]) -> dict[str, Any]:
    """Plan a fine-tune, as `frugal plan` does (the same request, named as its options are;
    the same JSON out), and record the plan on these books. A bad request is one line, as
    the command says it."""
    try:
        with PLANNING:  # one at a time: FastAPI runs this in its thread pool
            out = make_plan(PlanRequest.model_validate(asked), ledger(request))
    except ValidationError as e:
        raise HTTPException(status_code=422, detail=refusal(e, PlanRequest)) from None
    except FrugalError as e:
        raise _bad(e) from None
    return out.to_json() | {"plan_id": out.plan_id, "tags": out.tags}


@router.get("/quality")
def quality_report(
    request: Request,
    scope: Annotated[list[str] | None, Query(description="tag key=value; repeat for more")] = None,
    metric: Annotated[str, Query(description="eval_loss, accuracy or macro_f1")] = "eval_loss",
) -> dict[str, Any]:
    """Quality beside cost for the runs of a tag scope: each run's best eval loss (or a
    classifier's accuracy or macro-F1) against its dollars, the quality-per-dollar frontier,
    and which setting moved it (what `frugal costs quality --json` prints)."""
    try:
        return quality(ledger(request), parse_tags(scope or [], "scope"), metric).to_json()
    except FrugalError as e:
        raise _bad(e) from None


CALIBRATION_RUNS = 2000  # the newest runs with measurements a page is sent
MEASURED = ("tokens_per_s", "peak_reserved_gib")


@router.get("/calibration")
def calibration(request: Request) -> dict[str, Any]:
    """Predicted beside measured tokens/s and peak reserved memory of the newest runs that
    measured them (dry runs included), per GPU and method, with the median ratio of each
    group: what `frugal calibrate` fits."""
    q = (
        select(RunRecord)
        .where(RunRecord.outcome.is_not(None))
        .order_by(RunRecord.started_at.desc())
        .limit(CALIBRATION_RUNS)
    )
    points: list[dict[str, Any]] = []
    ratios: dict[str, dict[str, list[float]]] = {}
    with ledger(request).session() as s:
        for r in s.scalars(q):
            p, a = r.predicted or {}, r.actual or {}
            pairs = {k: (_num(p.get(k)), _num(a.get(k))) for k in MEASURED}
            if not any(pr and ac for pr, ac in pairs.values()):
                continue
            point: dict[str, Any] = {
                "run_id": r.id,
                "gpu": r.gpu,
                "method": r.method,
                "dry_run": r.dry_run,
            }
            group = ratios.setdefault(f"{r.gpu}/{r.method}", {k: [] for k in MEASURED})
            for k, (pr, ac) in pairs.items():
                point[f"predicted_{k}"], point[f"actual_{k}"] = pr, ac
                if pr and ac:
                    group[k].append(ac / pr)
            points.append(point)
    groups = [
        {
            "group": name,
            "runs": max(len(v) for v in rs.values()),
            **{
                f"median_actual_over_predicted_{k}": (statistics.median(v) if v else None)
                for k, v in rs.items()
            },
        }
        for name, rs in sorted(ratios.items())
    ]
    return {"points": points, "groups": groups}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and v > 0 else None
