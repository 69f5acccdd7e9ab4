"""The dashboard's pages: server-rendered shells (Jinja2) whose figures the page's script
fetches from the JSON API (api.py) and draws with plotly, served from the installed plotly
package so that the page works offline."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.templating import Jinja2Templates

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))  # autoescaped
router = APIRouter()
LIVE_S = 3  # how often a live run's page asks again


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def overview(request: Request, period: str = "this-month", by: str = "project") -> HTMLResponse:
    return templates.TemplateResponse(
        request,
        "overview.html",
        {"title": "Overview", "page": "overview", "period": period, "by": by},
    )


@router.get("/runs", response_class=HTMLResponse, include_in_schema=False)
def runs(
    request: Request, period: str = "all", outcome: str = "", gpu: str = "", tag: str = ""
) -> HTMLResponse:
    return templates.TemplateResponse(
        request,
        "runs.html",
        {
            "title": "Runs",
            "page": "runs",
            "period": period,
            "outcome": outcome,
            "gpu": gpu,
            "tag": tag,
        },
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
def run(request: Request, run_id: str) -> HTMLResponse:
    """A run, live while it trains: the page asks the API again every few seconds."""
    return templates.TemplateResponse(
        request,
        "run.html",
        {"title": f"Run {run_id[:8]}", "page": "run", "run_id": run_id, "every_s": LIVE_S},
    )


@router.get("/budgets", response_class=HTMLResponse, include_in_schema=False)
def budgets(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "budgets.html", {"title": "Budgets", "page": "budgets"}
    )


@router.get("/plan", response_class=HTMLResponse, include_in_schema=False)
def new_plan(request: Request) -> HTMLResponse:
    """The Plan form: it asks the API for a plan, as `frugal plan` would."""
    return templates.TemplateResponse(request, "plan_new.html", {"title": "Plan", "page": "plan"})


@router.get("/plans/{plan_id}", response_class=HTMLResponse, include_in_schema=False)
def plan(request: Request, plan_id: int) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "plan.html", {"title": f"Plan {plan_id}", "page": "plan", "plan_id": plan_id}
    )


@router.get("/calibration", response_class=HTMLResponse, include_in_schema=False)
def calibration(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "calibration.html", {"title": "Calibration", "page": "calibration"}
    )


@router.get("/quality", response_class=HTMLResponse, include_in_schema=False)
def quality(request: Request) -> HTMLResponse:
    """Quality beside cost: the runs of a tag scope (`?scope=sweep=lr`)."""
    return templates.TemplateResponse(
        request, "quality.html", {"title": "Quality", "page": "quality"}
    )


@router.get("/static/plotly.min.js", include_in_schema=False)
def plotly_js() -> FileResponse:
    path = resources.files("plotly") / "package_data" / "plotly.min.js"
    return FileResponse(str(path), media_type="text/javascript")
