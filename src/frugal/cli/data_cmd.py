"""`frugal data check FILE`: what `frugal train` will make of a data file, before it runs.

Every row is tokenized exactly as training does (frugal.data.examples.load_examples, through
frugal.data.examples.file_stats), so the token total is the one `frugal plan --dataset` uses.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from frugal.cli import console, print_json
from frugal.cli.options import JSON_HELP, option
from frugal.errors import FrugalError
from frugal.files import check_target, replacing
from frugal.plan.plot import IMAGE_SUFFIXES, pyplot
from frugal.step.job import TrainJob

if TYPE_CHECKING:
    from frugal.data.examples import DataStats

app = typer.Typer(help="Check training data before you train.", no_args_is_help=True)

BINS = 10


@app.command("check")
def check(
    file: str = typer.Argument(..., help="A .jsonl/.csv/.parquet file or a saved HF dataset."),
    model: str | None = typer.Option(None, help="Model whose tokenizer counts (dir or hub id)."),
    tokenizer: str | None = typer.Option(None, help="Or: a directory with tokenizer files."),
    seq: int = option(TrainJob, "seq"),
    fmt: str = typer.Option(
        "auto", "--format", help="auto, text, prompt_completion or chat (as data.format)."
    ),
    plot: str | None = typer.Option(None, help="Write a length histogram: FILE.png/.svg/.pdf."),
    force: bool = typer.Option(False, "--force", help="Replace the --plot file if it exists."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Rows, tokens, lengths, duplicates and empty rows as `frugal train` will see them."""
    from frugal.data.examples import file_stats, load_tokenizer

    if plot and Path(plot).suffix.lower() not in IMAGE_SUFFIXES:
        raise FrugalError(f"--plot {plot}: end the name in .png, .svg or .pdf")
    if plot:
        check_target(plot, "--plot", force=force)
    src = tokenizer or model
    if not src:
        raise FrugalError("give --model M (its tokenizer counts the tokens) or --tokenizer DIR")
    tok = load_tokenizer(src, "give --tokenizer DIR, a directory with tokenizer files")
    out = summarize(file_stats(file, tok, seq, fmt), seq)
    if plot:
        write_plot(out, plot)
        out["wrote_plot"] = plot
    if json_out:
        print_json(out)
    else:
        render(file, out)


def histogram(lengths: list[int], bins: int = BINS) -> list[dict[str, int]]:
    """Integer bins [lo, hi] (both inclusive) of equal width covering min..max."""
    lo, hi = min(lengths), max(lengths)
    width = max(1, math.ceil((hi - lo + 1) / bins))
    counts = [0] * math.ceil((hi - lo + 1) / width)
    for n in lengths:
        counts[(n - lo) // width] += 1
    return [
        {"lo": lo + i * width, "hi": lo + (i + 1) * width - 1, "count": c}
        for i, c in enumerate(counts)
    ]


def summarize(st: DataStats, seq: int) -> dict[str, Any]:
    ls = sorted(st.lengths)
    median = statistics.median(ls)
    median = int(median) if float(median).is_integer() else median
    warnings: list[str] = []
    share = st.over_length / st.rows
    if cut := st.cut(seq, "--seq"):
        warnings.append(cut)
    if st.duplicates:
        warnings.append(
            f"{st.duplicates} rows ({st.duplicates / st.rows:.0%}) repeat an earlier row and "
            "weigh more in training: dedupe the file"
        )
    if st.empty == st.rows:
        warnings.append(
            "no row has tokens to train on; `frugal train` refuses this file: check the "
            "format and columns (text, prompt/completion, or messages with assistant turns)"
        )
    elif st.empty:
        warnings.append(
            f"{st.empty} rows have no tokens to train on and are dropped: check the format "
            "and columns (an empty text or completion, or chat rows without an assistant turn)"
        )
    return {
        "rows": st.rows,
        "format": st.format,
        "empty": st.empty,
        "duplicates": st.duplicates,
        "over_length": st.over_length,
        "over_length_share": share,
        "tokens": st.tokens,
        "kept_tokens": st.kept_tokens,
        "lost_tokens": st.tokens - st.kept_tokens,
        "trained_tokens": st.trained_tokens,
        "length": {
            "min": ls[0],
            "median": median,
            "p95": ls[max(0, math.ceil(0.95 * len(ls)) - 1)],  # nearest rank
            "max": ls[-1],
        },
        "histogram": histogram(ls),
        "seq": seq,
        "warnings": warnings,
    }


def write_plot(out: dict[str, Any], path: str) -> None:

    plt = pyplot(path)
    from matplotlib.ticker import MaxNLocator

    hist = out["histogram"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.bar(
        [b["lo"] for b in hist],
        [b["count"] for b in hist],
        width=[b["hi"] - b["lo"] + 1 for b in hist],
        align="edge",
        color="#1f6feb",
        edgecolor="white",
    )
    if out["seq"] <= hist[-1]["hi"] + 1:
        ax.axvline(out["seq"], ls="--", c="#d1242f", lw=1, label=f"seq {out['seq']}")
        ax.legend(loc="upper right", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("tokens per row (before truncation)")
    ax.set_ylabel("rows")
    ax.set_title(f"frugal data check: {out['rows']:,} rows, {out['tokens']:,} tokens")
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def render(file: str, out: dict[str, Any]) -> None:

    con = console()
    n = out["rows"]
    con.print(f"[bold]{file}[/] · {n:,} rows · {out['format']} · seq {out['seq']}")
    t = Table(show_header=False, box=None, padding=(0, 2))
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_row("tokens", f"{out['tokens']:,}")
    t.add_row(f"kept at seq {out['seq']} (plan bills)", f"{out['kept_tokens']:,}")
    t.add_row("trained tokens (not masked)", f"{out['trained_tokens']:,}")
    t.add_row("empty rows", f"{out['empty']:,}")
    t.add_row("duplicate rows", f"{out['duplicates']:,}")
    t.add_row(
        f"longer than {out['seq']}", f"{out['over_length']:,} ({out['over_length_share']:.1%})"
    )
    ln = out["length"]
    t.add_row(
        "length min/median/p95/max", f"{ln['min']} / {ln['median']:g} / {ln['p95']} / {ln['max']}"
    )
    con.print(t)
    con.print("[bold]tokens per row[/]")
    hist = out["histogram"]
    spans = [f"{b['lo']}" if b["lo"] == b["hi"] else f"{b['lo']}–{b['hi']}" for b in hist]
    top, wide = max(b["count"] for b in hist), max(map(len, spans))
    for span, b in zip(spans, hist, strict=True):
        bar = "█" * round(30 * b["count"] / top)
        con.print(f"  {span:>{wide}} │{bar} {b['count']}", highlight=False)
    for w in out["warnings"]:
        con.print(f"[yellow]warning:[/] {w}")
    if out.get("wrote_plot"):
        con.print(f"wrote {out['wrote_plot']}")
