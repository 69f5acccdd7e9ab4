"""`frugal plan --plot FILE`: cost against time of every feasible plan, with the frontier.

FILE.png / .svg / .pdf are drawn with matplotlib (the `plot` extra). FILE.html is a
self-contained page with an inline SVG chart: hover a point for its plan; it needs nothing
installed and opens anywhere. Both use log axes, since plans span orders of magnitude.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frugal.errors import FrugalError
from frugal.files import replacing, write_text_atomic

if TYPE_CHECKING:
    from frugal.plan.constraints import Constraints
    from frugal.plan.plans import Plan, Result

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix != ".html" and suffix not in IMAGE_SUFFIXES:
        raise FrugalError(f"--plot {path}: end the name in .png, .svg, .pdf or .html")
    return suffix


def write_plot(result: Result, k: Constraints, path: str) -> None:
    if check_plot_path(path) != ".html":
        _matplotlib_chart(result, k, path)
        return
    write_text_atomic(path, html_chart(result, k))


def _describe(p: Plan) -> str:
    return (
        f"{p.label()} · {p.gpus}x {p.offer.gpu.name} · micro-batch {p.job.batch} · "
        f"{p.job.optimizer} · {p.hours:.2f} h · ${p.cost_usd:,.2f}"
    )


def pyplot(path: str) -> Any:
    """matplotlib.pyplot on the file-only Agg backend, or an error naming the install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FrugalError(
            f"--plot {path} needs matplotlib: pip install 'frugal-ft[plot]'"
        ) from None
    return plt


def _matplotlib_chart(result: Result, k: Constraints, path: str) -> None:
    plt = pyplot(path)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    pts = result.plans
    ax.scatter([p.hours for p in pts], [p.cost_usd for p in pts], s=12, c="#9aa5b1", label="plan")
    front = sorted(result.frontier, key=lambda p: p.hours)
    ax.plot(
        [p.hours for p in front],
        [p.cost_usd for p in front],
        "o-",
        c="#1f6feb",
        ms=5,
        label="Pareto frontier",
    )
    rec = result.recommendation
    ax.scatter([rec.hours], [rec.cost_usd], marker="*", s=220, c="#d1242f", zorder=5)
    ax.annotate(rec.label(), (rec.hours, rec.cost_usd), xytext=(8, 8), textcoords="offset points")
    if k.deadline_h:
        ax.axvline(k.deadline_h, ls="--", c="#6e7781", lw=1, label=f"deadline {k.deadline_h:g} h")
    if k.budget_usd:
        ax.axhline(k.budget_usd, ls=":", c="#6e7781", lw=1, label=f"budget ${k.budget_usd:g}")
    ax.set_xscale("log")
    _save(
        plt,
        fig,
        ax,
        path,
        ("expected wall time (h)", "expected total cost (USD)", "frugal plan: cost vs time"),
    )


def _save(plt: Any, fig: Any, ax: Any, path: str, words: tuple[str, str, str]) -> None:
    """A chart's log y axis, its labels (x, y, title), grid and legend, written whole."""
    ax.set_yscale("log")
    ax.set_xlabel(words[0])
    ax.set_ylabel(words[1])
    ax.set_title(words[2])
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


# -- the HTML chart: a log-log SVG scatter, drawn here so that it needs no library --------

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 760, 460, 70, 20, 40, 50


def _log_scale(
    lo: float, hi: float, a: float, b: float
) -> tuple[Callable[[float], float], tuple[float, float]]:
    lo, hi = math.log10(lo), math.log10(hi)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    lo, hi = lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)
    return (lambda v: a + (math.log10(v) - lo) / (hi - lo) * (b - a)), (lo, hi)


def _ticks(lo: float, hi: float) -> list[float]:
    out = []
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**e
            if lo <= math.log10(v) <= hi:
                out.append(v)
    return out


def html_chart(result: Result, k: Constraints) -> str:
    """The plans as an SVG in a page of its own: cost against time on log scales, the
    frontier joined, the recommendation marked, each point described on hover."""
    pts = result.plans
    xs = [p.hours for p in pts] + ([k.deadline_h] if k.deadline_h else [])
    ys = [p.cost_usd for p in pts] + ([k.budget_usd] if k.budget_usd else [])
    sx, xr = _log_scale(min(xs), max(xs), PAD_L, W - PAD_R)
    sy, yr = _log_scale(max(min(ys), 1e-3), max(ys), H - PAD_B, PAD_T)
    svg = _grid(sx, sy, xr, yr) + _limits(sx, sy, k) + _points(result, sx, sy)
    axes = (
        f'<text x="{(PAD_L + W - PAD_R) / 2}" y="{H - 10}" text-anchor="middle">'
        "expected wall time (h)</text>"
        f'<text transform="rotate(-90)" x="{-(PAD_T + H - PAD_B) / 2}" y="16" '
        'text-anchor="middle">expected total cost (USD)</text>'
    )
    style = (
        "svg{font:12px sans-serif}.g{stroke:#eaeef2}.t{fill:#57606a;font-size:11px}"
        ".c{stroke:#6e7781;stroke-dasharray:4 3}.p{fill:#9aa5b1}.f{fill:none;stroke:#1f6feb;"
        "stroke-width:2}.fp{fill:#1f6feb}.r{fill:#d1242f}circle:hover{stroke:#000}"
    )
    return (
        "<!doctype html><meta charset='utf-8'><title>frugal plan: cost vs time</title>"
        f"<style>{style}</style><h3 style='font-family:sans-serif'>frugal plan: "
        f"{len(pts)} feasible plans, {len(result.frontier)} on the frontier (hover a point)</h3>"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">'
        + "".join(svg)
        + axes
        + "</svg>\n"
    )


Scale = Callable[[float], float]


def _grid(sx: Scale, sy: Scale, xr: tuple[float, float], yr: tuple[float, float]) -> list[str]:
    """The grid lines and their labels: hours across, dollars up."""
    svg = []
    for v in _ticks(*xr):
        x = sx(v)
        svg.append(f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{H - PAD_B}" class="g"/>')
        svg.append(f'<text x="{x:.1f}" y="{H - PAD_B + 16}" class="t">{v:g}</text>')
    for v in _ticks(*yr):
        y = sy(v)
        svg.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" class="g"/>')
        svg.append(
            f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" class="t" text-anchor="end">${v:g}</text>'
        )
    return svg


def _limits(sx: Scale, sy: Scale, k: Constraints) -> list[str]:
    """The deadline and the budget, dashed."""
    svg = []
    if k.deadline_h:
        x = sx(k.deadline_h)
        svg.append(f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{H - PAD_B}" class="c"/>')
        svg.append(f'<text x="{x + 4:.1f}" y="{PAD_T + 12}" class="t">deadline</text>')
    if k.budget_usd:
        y = sy(k.budget_usd)
        svg.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" class="c"/>')
        svg.append(
            f'<text x="{W - PAD_R - 4}" y="{y - 4:.1f}" class="t" text-anchor="end">budget</text>'
        )
    return svg


def _points(result: Result, sx: Scale, sy: Scale) -> list[str]:
    """Every feasible plan, the frontier joined, and the recommendation named."""
    svg = []
    for p in result.plans:
        tip = html.escape(_describe(p))
        svg.append(
            f'<circle cx="{sx(p.hours):.1f}" cy="{sy(p.cost_usd):.1f}" r="3.5" class="p">'
            f"<title>{tip}</title></circle>"
        )
    front = sorted(result.frontier, key=lambda p: p.hours)
    line = " ".join(f"{sx(p.hours):.1f},{sy(p.cost_usd):.1f}" for p in front)
    svg.append(f'<polyline points="{line}" class="f"/>')
    for p in front:
        tip = html.escape("frontier: " + _describe(p))
        svg.append(
            f'<circle cx="{sx(p.hours):.1f}" cy="{sy(p.cost_usd):.1f}" r="5" class="fp">'
            f"<title>{tip}</title></circle>"
        )
    rec = result.recommendation
    rx, ry = sx(rec.hours), sy(rec.cost_usd)
    svg.append(
        f'<circle cx="{rx:.1f}" cy="{ry:.1f}" r="8" class="r"><title>'
        f"{html.escape('recommended: ' + _describe(rec))}</title></circle>"
    )
    svg.append(f'<text x="{rx + 10:.1f}" y="{ry - 10:.1f}">{html.escape(rec.label())}</text>')
    return svg


# -- any labelled points against a quality axis (`frugal lifecycle --plot`) -----------------


@dataclass(frozen=True)
class Point:
    """A labelled point of a scatter: `marked` ones (a frontier) are joined and named."""

    x: float
    y: float
    label: str
    marked: bool = False


def write_points(path: str, points: list[Point], title: str, x_label: str, y_label: str) -> None:
    """`points` on a linear x and a log y axis: FILE.html (an inline SVG) or an image."""
    if check_plot_path(path) == ".html":
        write_text_atomic(path, _points_page(points, title, x_label, y_label))
        return
    plt = pyplot(path)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    ax.scatter([p.x for p in points], [p.y for p in points], s=24, c="#9aa5b1")
    front = sorted((p for p in points if p.marked), key=lambda p: p.x)
    ax.plot(
        [p.x for p in front], [p.y for p in front], "o-", c="#1f6feb", ms=6, label="Pareto frontier"
    )
    for p in points:
        ax.annotate(p.label, (p.x, p.y), xytext=(6, 6), textcoords="offset points", fontsize=8)
    _save(plt, fig, ax, path, (x_label, y_label, title))


def _points_page(points: list[Point], title: str, x_label: str, y_label: str) -> str:
    """The points as an SVG in a page of its own, each described on hover."""
    xs = [p.x for p in points]
    lo, hi = min(xs), max(xs)
    pad = (hi - lo) * 0.1 or abs(lo) * 0.1 or 1.0
    x0, x1 = lo - pad, hi + pad

    def sx(v: float) -> float:
        return PAD_L + (v - x0) / (x1 - x0) * (W - PAD_R - PAD_L)

    ys = [p.y for p in points]
    sy, yr = _log_scale(max(min(ys), 1e-6), max(max(ys), 1e-6), H - PAD_B, PAD_T)
    svg = []
    for v in _ticks(*yr):
        y = sy(v)
        svg.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" class="g"/>')
        svg.append(
            f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" class="t" text-anchor="end">${v:g}</text>'
        )
    for i in range(6):
        v = x0 + (x1 - x0) * i / 5
        svg.append(
            f'<text x="{sx(v):.1f}" y="{H - PAD_B + 16}" class="t" '
            f'text-anchor="middle">{v:.3g}</text>'
        )
    front = sorted((p for p in points if p.marked), key=lambda p: p.x)
    line = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in front)
    svg.append(f'<polyline points="{line}" class="f"/>')
    for p in points:
        tip = html.escape(f"{p.label}: {p.x:g}, ${p.y:,.4g}")
        svg.append(
            f'<circle cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="{6 if p.marked else 4}" '
            f'class="{"fp" if p.marked else "p"}"><title>{tip}</title></circle>'
            f'<text x="{sx(p.x) + 8:.1f}" y="{sy(p.y) - 8:.1f}">'
            f"{html.escape(p.label)}</text>"
        )
    axes = (
        f'<text x="{(PAD_L + W - PAD_R) / 2}" y="{H - 10}" text-anchor="middle">'
        f"{html.escape(x_label)}</text>"
        f'<text transform="rotate(-90)" x="{-(PAD_T + H - PAD_B) / 2}" y="16" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    style = (
        "svg{font:12px sans-serif}.g{stroke:#eaeef2}.t{fill:#57606a;font-size:11px}"
        ".p{fill:#9aa5b1}.f{fill:none;stroke:#1f6feb;stroke-width:2}.fp{fill:#1f6feb}"
    )
    return (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style><h3 style='font-family:sans-serif'>{html.escape(title)}</h3>"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">'
        + "".join(svg)
        + axes
        + "</svg>\n"
    )
