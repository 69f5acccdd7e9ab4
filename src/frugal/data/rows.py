"""Rows of a training data file and their format, without torch: what `frugal train`,
`frugal data check` and `frugal plan --dataset` all read.

Files: JSONL, CSV, Parquet, or a directory saved with `datasets`' `save_to_disk`. Formats:
`text`, `prompt` + `completion`, or chat `messages` (a list of {role, content}, or its JSON
string as CSV cells hold it). Errors name the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from frugal.csvrows import CsvError, Rows
from frugal.errors import FrugalError

FORMATS = ("text", "prompt_completion", "chat")


def read_rows(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) of each row of a .jsonl/.csv/.parquet file or a saved HF dataset dir.
    A file that cannot be read as what its name says fails with one line naming the file,
    the line (or byte) and the fix."""
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
        yield from _jsonl(path)
    elif suffix == ".csv":
        yield from _csv(path)
    elif suffix == ".parquet":
        yield from _parquet(path)
    else:
        raise FrugalError(
            f"dataset {path}: unknown format {suffix!r}; use .jsonl, .csv or .parquet"
        )


def _text_lines(path: str, fix: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file; a byte that is not UTF-8 is named."""
    offset = 0
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise FrugalError(
                    f"{path}:{i}: not UTF-8 text (byte {offset + e.start:,} of the file is "
                    f"0x{raw[e.start]:02x}): {fix}"
                ) from None
            if b"\x00" in raw:
                raise FrugalError(
                    f"{path}:{i}: a NUL byte (byte {offset + raw.index(0):,} of the file): "
                    f"not a text file; {fix}"
                )
            offset += len(raw)
            yield i, line.removeprefix("\ufeff") if i == 1 else line  # Excel's UTF-8 mark


def _jsonl(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    fix = "save it as UTF-8 JSON lines, one {...} object per line"
    for i, line in _text_lines(path, fix):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            raise FrugalError(f"{path}:{i}: not JSON ({msg}); one object per line") from None
        if not isinstance(row, dict):
            raise FrugalError(
                f"{path}:{i}: a JSON {type(row).__name__} where a row object belongs; "
                'one {"text": ...} (or prompt/completion, or messages) object per line'
            )
        yield f"{path}:{i}", row


def _csv(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Strict CSV (frugal.csvrows): a quote never closed, text after a closing quote, or a
    row with more or fewer cells than the header is an error naming the row's first line."""
    fix = "save it as UTF-8 CSV with a header row"
    try:
        for line, row in Rows(line for _, line in _text_lines(path, fix)):
            yield f"{path}:{line}", row
    except CsvError as e:
        raise FrugalError(
            f"{path}:{e.line}: not CSV in the row from this line ({e.why}); {fix}"
        ) from None


def _parquet(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        text = str(e).strip()
        first = text.splitlines()[0].split(". ")[0] if text else type(e).__name__
        raise FrugalError(
            f"{path}: not a readable Parquet file ({first[:160]}): write it with "
            "pandas' or pyarrow's to_parquet, or use .jsonl"
        ) from None
    for i, row in enumerate(table.to_pylist(), 1):
        yield f"{path}: row {i}", row


def _saved_dataset(p: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(p))
    except Exception as e:  # a directory save_to_disk did not finish, or another version's
        raise FrugalError(
            f"dataset {p}: not a readable saved dataset ({type(e).__name__}): save it again "
            "with datasets' save_to_disk, or give a .jsonl file"
        ) from None
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
    if "text" in row:  # a blank or null text is still a text row: an empty one
        return "text"
    keys = ", ".join(sorted(row)) or "none"
    raise FrugalError(
        f"{where}: no 'text', 'prompt'/'completion' or 'messages' (keys: {keys}); "
        "rename the column or set data.format"
    )


def text(row: dict[str, Any], key: str, where: str) -> str:
    """The string in `row[key]` ("" when missing or null): a list, number or object there,
    or a lone surrogate (JSON's "\\ud800", not Unicode text), is an error naming it."""
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        kind = {list: "a list", dict: "an object", bool: "true/false"}.get(type(value), "a number")
        raise FrugalError(f"{where}: '{key}' is {kind}, not a string: give one text per cell")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FrugalError(
            f"{where}: '{key}' holds a lone surrogate (\\u{ord(value[e.start]):04x} at "
            f"character {e.start:,}), which is not Unicode text: fix that escape in the file"
        ) from None
    return value


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
    return [
        {
            "role": text(m, "role", f"{where}: message {i}"),
            "content": text(m, "content", f"{where}: message {i}"),
        }
        for i, m in enumerate(msgs, 1)  # type: ignore[arg-type]
    ]


def row_text(row: dict[str, Any], fmt: str, where: str) -> str:
    """The row's text as one string (to estimate tokens from characters)."""
    if fmt == "chat":
        return "\n".join(m["content"] for m in messages(row, where))
    if fmt == "prompt_completion":
        return text(row, "prompt", where) + text(row, "completion", where)
    return text(row, "text", where)
