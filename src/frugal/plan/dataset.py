"""How many training tokens a dataset file holds.

Reads JSONL, CSV or Parquet rows in the three formats `frugal train` accepts: `text`,
`prompt` + `completion`, or chat `messages` (a list of {role, content}). Tokens are counted
with the model's tokenizer when it is available offline (a local model dir, or the hub
cache), row by row exactly as `frugal train` tokenizes them (chat template, EOS; before
truncation), so the total is the one `frugal data check` reports; otherwise estimated as
characters / 4 and the result says so.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frugal.errors import FrugalError

if TYPE_CHECKING:
    from frugal.run.data import DataStats

CHARS_PER_TOKEN = 4.0  # English text with BPE vocabularies of 32k-256k tokens


@dataclass
class TokenCount:
    rows: int
    tokens: int
    exact: bool
    how: str


def _texts(row: dict[str, Any], where: str) -> str:
    if "text" in row and row["text"] is not None:
        return str(row["text"])
    if "prompt" in row or "completion" in row:
        return f"{row.get('prompt') or ''}{row.get('completion') or ''}"
    msgs = row.get("messages")
    if isinstance(msgs, str):
        try:
            msgs = json.loads(msgs)
        except json.JSONDecodeError:
            msgs = None
    if isinstance(msgs, list):
        return "\n".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
    raise FrugalError(f"{where}: no text: a row needs 'text', 'prompt'/'completion', or 'messages'")


def rows(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
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
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise FrugalError("reading parquet needs pyarrow: pip install pyarrow") from None
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


def _tokenizer(model: str) -> Any:
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model, local_files_only=True)
    except Exception:  # not cached, no tokenizer files, offline: fall back to characters
        return None


def data_stats(path: str, tok: Any, seq: int, fmt: str = "auto") -> DataStats:
    """The statistics of `frugal train`'s tokenization of a file (frugal.run.data), kept
    even when no row has anything to train (train refuses such a file; a count does not)."""
    from frugal.run.data import DataStats, load_examples

    st = DataStats()
    try:
        load_examples(path, tok, seq, fmt, st)
    except FrugalError as e:
        if not (st.rows and st.empty == st.rows and "no row has tokens" in str(e)):
            raise
    return st


def count_tokens(path: str, model: str | None = None) -> TokenCount:
    tok = _tokenizer(model) if model else None
    if tok is not None:
        st = data_stats(path, tok, sys.maxsize)
        return TokenCount(st.rows, st.tokens, True, f"counted with {model}'s tokenizer")
    texts = [(where, _texts(r, where)) for where, r in rows(path)]
    if not texts:
        raise FrugalError(f"dataset {path} has no rows")
    chars = sum(len(t) for _, t in texts)
    return TokenCount(
        len(texts),
        round(chars / CHARS_PER_TOKEN),
        False,
        f"estimated as characters / {CHARS_PER_TOKEN:g} (the tokenizer is not available offline)",
    )
