"""Writing a benchmark's table into the docs, between `<!-- NAME:start/end -->` markers."""

from __future__ import annotations

import os
import statistics
from datetime import UTC, datetime
from pathlib import Path


def timing_table(title: str, what: str, rows: list[tuple[str, list[float], str]]) -> str:
    """A Markdown table of timed cases: (name, seconds of each run, target) rows, then the
    machine's CPUs and the date."""
    lines = [title, "", f"| {what} | median s | min s | max s | target s |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, ts, target in rows:
        lines.append(f"| {name} | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} | "
                     f"{target} |")  # fmt: skip
    lines.append(f"\n({os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d})")
    return "\n".join(lines)


def write_block(path: Path, name: str, content: str) -> None:
    """Replace the block called `name` in `path` (or append it when there is none)."""
    text = path.read_text() if path.exists() else ""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{content}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text + "\n" + block + "\n"
    path.write_text(text)
