"""Rows of a training data file and their format, without torch: what `frugal train`,
`frugal data check` and `frugal plan --dataset` all read.

Files: JSONL, CSV, Parquet, or a directory saved with `datasets`' `save_to_disk`. Formats:
`text`, `prompt` + `completion`, or chat `messages` (a list of {role, content}, or its JSON
string as CSV cells hold it). Errors name the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from frugal.errors import FrugalError

FORMATS = ("text", "prompt_completion", "chat")


def read_rows(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) of each row of a .jsonl/.csv/.parquet file or a saved HF dataset dir."""
    p = Path(path)
    if p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json")):
        yield from _saved_dataset(p)
        return
    if not p.is_file():
        raise FrugalError(
            f"dataset {path} not found: give a .jsonl, .csv or .parquet file "
            "or a directory saved with datasets' save_to_disk"
        )
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with p.open(encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{i}", json.loads(line)
                except json.JSONDecodeError as e:
                    raise FrugalError(
                        f"{path}:{i}: not JSON ({e.msg}); one object per line"
                    ) from None
    elif suffix == ".csv":
        with p.open(encoding="utf-8", newline="") as f:
            for i, row in enumerate(csv.DictReader(f), 2):
                yield f"{path}:{i}", row
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(p).to_pylist(), 1):
            yield f"{path}: row {i}", row
    else:
        raise FrugalError(
            f"dataset {path}: unknown format {suffix!r}; use .jsonl, .csv or .parquet"
        )


def _saved_dataset(p: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    from datasets import DatasetDict, load_from_disk

    ds = load_from_disk(str(p))
    if isinstance(ds, DatasetDict):  # a saved split dict: train on its "train" split
        if "train" not in ds:
            raise FrugalError(f"dataset {p} has splits {sorted(ds)}, none named 'train'")
        ds = ds["train"]
    for i, row in enumerate(ds, 1):
        yield f"{p}: row {i}", dict(row)


def detect_format(row: dict[str, Any], where: str) -> str:
    def given(key: str) -> bool:  # CSV reads a blank cell as "", not as missing
        return row.get(key) not in (None, "")

    if given("messages"):
        return "chat"
    if given("prompt") or given("completion"):
        return "prompt_completion"
    if row.get("text") is not None:  # a blank text is still a text row
        return "text"
    keys = ", ".join(sorted(row)) or "none"
    raise FrugalError(
        f"{where}: no 'text', 'prompt'/'completion' or 'messages' (keys: {keys}); "
        "rename the column or set data.format"
    )


def messages(row: dict[str, Any], where: str) -> list[dict[str, str]]:
    msgs = row.get("messages")
    if isinstance(msgs, str):
        try:
            msgs = json.loads(msgs)
        except json.JSONDecodeError:
            msgs = None
    ok = isinstance(msgs, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in msgs
    )
    if not ok:
        raise FrugalError(f"{where}: 'messages' must be a list of {{role, content}} objects")
    return list(msgs)  # type: ignore[arg-type]


def row_text(row: dict[str, Any], fmt: str, where: str) -> str:
    """The row's text as one string (to estimate tokens from characters)."""
    if fmt == "chat":
        return "\n".join(str(m["content"]) for m in messages(row, where))
    if fmt == "prompt_completion":
        return f"{row.get('prompt') or ''}{row.get('completion') or ''}"
    return str(row.get("text") or "")
