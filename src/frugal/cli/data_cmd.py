"""`frugal data check FILE`: what `frugal train` will make of a data file, before it runs.

Every row is tokenized exactly as training does (frugal.data.examples.load_examples, through
frugal.data.examples.file_stats), so the token total is the one `frugal plan --dataset` uses.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from frugal.cli import console, print_json
from frugal.cli.options import JSON_HELP, option, option_set, takes
from frugal.data.labels import label_stats, read_labelled, tokenize_labelled
from frugal.data.pairs import pair_stats, read_preferences
from frugal.errors import FrugalError
from frugal.files import check_target, replacing
from frugal.plan.plot import IMAGE_SUFFIXES, pyplot
from frugal.step.job import TrainJob
from frugal.step.tasks import TASKS

if TYPE_CHECKING:
    from frugal.data.examples import DataStats

app = typer.Typer(help="Check training data before you train.", no_args_is_help=True)

BINS = 10
IMBALANCED = 3.0  # the largest class over the smallest: warned from here


@option_set
class CheckOptions:
    """The options of `frugal data check`, in the order `--help` shows them."""

    file: str = typer.Argument(..., help="A .jsonl/.csv/.parquet file or a saved HF dataset.")
    model: str | None = typer.Option(None, help="Model whose tokenizer counts (dir or hub id).")
    tokenizer: str | None = typer.Option(None, help="Or: a directory with tokenizer files.")
    seq: int = option(TrainJob, "seq")
    fmt: str = typer.Option(
        "auto", "--format", help="auto, text, prompt_completion or chat (as data.format)."
    )
    task: str = option(TrainJob, "task")
    plot: str | None = typer.Option(None, help="Write a length histogram: FILE.png/.svg/.pdf.")
    force: bool = typer.Option(False, "--force", help="Replace the --plot file if it exists.")
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)


@app.command("check")
@takes(CheckOptions)
def check(ctx: typer.Context, o: CheckOptions) -> None:
    """Rows, tokens, lengths, duplicates and empty rows as `frugal train` will see them."""
    from frugal.data.examples import load_tokenizer

    if o.plot and Path(o.plot).suffix.lower() not in IMAGE_SUFFIXES:
        raise FrugalError(f"--plot {o.plot}: end the name in .png, .svg or .pdf")
    if o.plot:
        check_target(o.plot, "--plot", force=o.force)
    src = o.tokenizer or o.model
    if not src:
        raise FrugalError("give --model M (its tokenizer counts the tokens) or --tokenizer DIR")
    tok = load_tokenizer(src, "give --tokenizer DIR, a directory with tokenizer files")
    if o.task not in TASKS:
        raise FrugalError(f"--task {o.task!r}: use {' or '.join(TASKS)}")
    summary, render = CHECKS[o.task]
    out = summary(o.file, tok, o.seq, o.fmt)
    if o.plot:
        write_plot(out, o.plot)
        out["wrote_plot"] = o.plot
    if o.json_out:
        print_json(out)
    else:
        render(o.file, out)


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


def spread(ls: list[int]) -> dict[str, Any]:
    """Min, median, p95 (nearest rank) and max of sorted lengths."""
    median = statistics.median(ls)
    return {
        "min": ls[0],
        "median": int(median) if float(median).is_integer() else median,
        "p95": ls[max(0, math.ceil(0.95 * len(ls)) - 1)],
        "max": ls[-1],
    }


def _spread_text(ln: dict[str, Any]) -> str:
    return f"{ln['min']} / {ln['median']:g} / {ln['p95']} / {ln['max']}"


def summarize(st: DataStats, seq: int) -> dict[str, Any]:
    ls = sorted(st.lengths)
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
        "length": spread(ls),
        "histogram": histogram(ls),
        "seq": seq,
        "warnings": warnings,
    }


def token_summary(file: str, tok: Any, seq: int, fmt: str) -> dict[str, Any]:
    """A causal LM's file as `frugal train` reads it in format `fmt`."""
    from frugal.data.examples import file_stats  # torch: only once a file is read

    return summarize(file_stats(file, tok, seq, fmt), seq)


def classification_summary(file: str, tok: Any, seq: int, fmt: str) -> dict[str, Any]:
    """A classification file as `frugal train` reads it: its classes and their counts,
    imbalance, repeated and contradictory rows, and texts longer than `seq` tokens (`fmt`:
    a classifier's rows have one)."""
    examples, classes = read_labelled(file)
    lengths = tokenize_labelled(examples, classes, tok, seq).lengths
    st = label_stats(examples, classes)
    over = sum(n > seq for n in lengths)
    warnings = []
    if st.imbalance >= IMBALANCED:
        ratio = (
            "a class has no example"
            if st.imbalance == float("inf")
            else (f"the largest class has {st.imbalance:.1f}x the smallest's examples")
        )
        warnings.append(
            f"imbalanced: {ratio}; a classifier trained on it favours the large "
            "classes: weigh each class by the inverse of its share, or "
            "resample"
        )
    if st.duplicates:
        warnings.append(
            f"{st.duplicates} rows repeat an earlier row's text and label and "
            "weigh more in training: dedupe the file"
        )
    if st.conflicts:
        t, labels = st.conflicts[0]
        warnings.append(
            f"{len(st.conflicts)} texts carry two or more labels (e.g. "
            f"{t[:60]!r}: {', '.join(labels)}): fix or drop them"
        )
    if over:
        warnings.append(
            f"{over} texts ({over / len(lengths):.0%}) are longer than --seq "
            f"{seq} tokens and are cut to it: raise --seq or shorten them"
        )
    ls = sorted(lengths)
    return {
        "rows": len(examples),
        "task": "classification",
        **st.to_json(),
        "tokens": sum(lengths),
        "over_length": over,
        "over_length_share": over / len(ls),
        "length": spread(ls),
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


def render_tokens(file: str, out: dict[str, Any]) -> None:

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
    t.add_row("length min/median/p95/max", _spread_text(ln))
    con.print(t)
    con.print("[bold]tokens per row[/]")
    hist = out["histogram"]
    spans = [f"{b['lo']}" if b["lo"] == b["hi"] else f"{b['lo']}–{b['hi']}" for b in hist]
    top, wide = max(b["count"] for b in hist), max(map(len, spans))
    for span, b in zip(spans, hist, strict=True):
        bar = "█" * round(30 * b["count"] / top)
        con.print(f"  {span:>{wide}} │{bar} {b['count']}", highlight=False)
    _said(out)


def render_classes(file: str, out: dict[str, Any]) -> None:
    con = console()
    con.print(
        f"[bold]{file}[/] · {out['rows']:,} rows · {out['classes']} classes · seq {out['seq']}"
    )
    t = Table("class", "examples", "share")
    for name, n in out["counts"].items():
        t.add_row(escape(name), f"{n:,}", f"{n / out['rows']:.1%}")
    con.print(t)
    imbalance = "no example in a class" if out["imbalance"] is None else f"{out['imbalance']:g}x"
    ln = out["length"]
    conflicting = out["conflicting_texts"]
    con.print(
        f"imbalance (largest / smallest class): {imbalance} · duplicate rows: "
        f"{out['duplicates']:,} · conflicting texts: {conflicting:,}"
    )
    con.print(
        f"tokens per example min/median/p95/max: {_spread_text(ln)} · longer than "
        f"{out['seq']}: {out['over_length']:,}"
    )
    _said(out)


def preference_summary(file: str, tok: Any, seq: int, fmt: str) -> dict[str, Any]:
    """A preference file as `frugal train` reads it: pairs (or KTO rows), tokens, lengths,
    identical pairs, prompts repeated in completions (`data.pairs.pair_stats`)."""
    st = pair_stats(read_preferences(file), tok, seq)
    ls = sorted(st.pop("lengths"))
    return {
        "task": "preference",
        **st,
        "length": spread(ls),
        "histogram": histogram(ls),
        "seq": seq,
    }


def render_pairs(file: str, out: dict[str, Any]) -> None:
    con = console()
    kind = "KTO rows" if out["kind"] == "kto" else "pairs"
    con.print(f"[bold]{escape(file)}[/] · {out['rows']:,} {kind} · seq {out['seq']}")
    both = "prompt and completion" if out["kind"] == "kto" else "both sequences of each pair"
    con.print(f"tokens ({both}): {out['tokens']:,}")
    con.print(
        f"tokens per row's longer sequence min/median/p95/max: "
        f"{_spread_text(out['length'])} · longer than {out['seq']}: "
        f"{out['over_length']:,}"
    )
    also = (
        f" · desirable: {out['desirable_share']:.0%}"
        if "desirable_share" in out
        else f" · identical pairs: {out['identical_pairs']:,}"
    )
    con.print(
        f"duplicate rows: {out['duplicates']:,} · prompt repeated in a completion: "
        f"{out['prompt_in_completion']:,}{also}"
    )
    _said(out)


def _said(out: dict[str, Any]) -> None:
    """A check's warnings (a file's text in them escaped: no markup) and the plot written."""
    con = console()
    for w in out["warnings"]:
        con.print(f"[yellow]warning:[/] {escape(w)}")
    if out.get("wrote_plot"):
        con.print(f"wrote {out['wrote_plot']}")


# each task's check of a file: its summary (what --json prints) and how it reads as text
CHECKS: dict[
    str,
    tuple[Callable[[str, Any, int, str], dict[str, Any]], Callable[[str, dict[str, Any]], None]],
] = {
    "causal": (token_summary, render_tokens),
    "classification": (classification_summary, render_classes),
    "preference": (preference_summary, render_pairs),
    "distill": (token_summary, render_tokens),
}
