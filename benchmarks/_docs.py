"""Writing a benchmark's table into the docs, between `<!-- NAME:start/end -->` markers."""

from __future__ import annotations

from pathlib import Path


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
