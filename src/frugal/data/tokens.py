"""Tokenized examples at scale: tokenized once, in batches, stored as Arrow, shared by every
process, handled as flat columns.

A data file is tokenized by a batched `datasets` map (the fast tokenizer takes a thousand rows
per call) into two list columns, `input_ids` and `labels`, and saved with `save_to_disk`
under frugal's cache (`FRUGAL_CACHE_DIR`, else the user cache dir) in `data/<key>/`. The
key is a digest of the file's bytes, the tokenizer (its full definition, chat template and
special tokens), the format and this code's version: the same file and tokenizer are never
tokenized twice, and a changed file, tokenizer or code never reads stale tokens. The first
process to take the key's lock tokenizes; the others (the other ranks of a multi-GPU run)
wait for it and then memory-map the saved Arrow files. Truncation to `job.seq` and the
statistics are computed afterwards, so one cache entry serves every sequence length.

In memory, examples are `Examples`: the token ids and labels of all examples concatenated
into two int32 arrays, with offsets (example i is `[offsets[i], offsets[i + 1])`), taken
straight from the Arrow columns. Selection, truncation and statistics are vectorized; a
single example is materialized as Python lists only when asked for (`examples[i]`).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, overload

import numpy as np

from frugal.data.rows import FORMATS, detect_format, messages, read_rows, text
from frugal.data.stats import DataStats as DataStats  # part of this module's API
from frugal.errors import FrugalError, notice
from frugal.paths import cache_dir
from frugal.step.loss import IGNORE

BATCH = 1000  # rows per tokenizer call


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]  # IGNORE where the token is not trained


@dataclass(eq=False)
class Examples:
    """Examples as flat columns: `ids` and `labels` of all examples, back to back."""

    ids: np.ndarray  # int32
    labels: np.ndarray  # int32, IGNORE where not trained
    offsets: np.ndarray  # int64, len(examples) + 1

    @classmethod
    def from_list(cls, examples: Sequence[Example]) -> Examples:
        lens = np.array([len(e.input_ids) for e in examples], dtype=np.int64)
        flat = lambda xs: np.fromiter(  # noqa: E731
            (t for x in xs for t in x), dtype=np.int32, count=int(lens.sum())
        )
        return cls(
            flat(e.input_ids for e in examples),
            flat(e.labels for e in examples),
            np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
        )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Examples):
            return all(
                np.array_equal(getattr(self, k), getattr(other, k))
                for k in ("ids", "labels", "offsets")
            )
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, i: int) -> Example: ...
    @overload
    def __getitem__(self, i: slice) -> Examples: ...

    def __getitem__(self, i: int | slice) -> Example | Examples:
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return Example(self.ids[a:b].tolist(), self.labels[a:b].tolist())

    def __iter__(self) -> Iterator[Example]:
        return (self[i] for i in range(len(self)))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def positions(self) -> np.ndarray:
        """Each token's position within its example (flat, like `ids`)."""
        return np.arange(len(self.ids), dtype=np.int64) - np.repeat(self.offsets[:-1], self.lengths)

    def take(self, index: np.ndarray, keep: np.ndarray | None = None) -> Examples:
        """The examples at `index`, in that order; with `keep` (a length per taken example,
        at most its own), only each one's first `keep` tokens."""
        index = np.asarray(index, dtype=np.int64)
        lens = self.lengths[index] if keep is None else np.asarray(keep, dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        src = np.repeat(self.offsets[:-1][index] - offsets[:-1], lens)
        src += np.arange(int(offsets[-1]), dtype=np.int64)
        return Examples(self.ids[src], self.labels[src], offsets)

    def truncated(self, seq: int) -> Examples:
        return self.take(np.arange(len(self)), np.minimum(self.lengths, seq))

    def trained_per_example(self, seq: int | None = None) -> np.ndarray:
        """Labels that are trained (not IGNORE) per example, within its first `seq`."""
        trained = self.labels != IGNORE
        if seq is not None:
            trained &= self.positions() < seq
        cum = np.concatenate([[0], np.cumsum(trained, dtype=np.int64)])
        return cum[self.offsets[1:]] - cum[self.offsets[:-1]]


# -- tokenizing, batched -------------------------------------------------------------------


def _chat(tok: Any, msgs: list[dict[str, str]], where: str) -> Example:
    if not getattr(tok, "chat_template", None):
        raise FrugalError(
            f"{where}: chat rows need a tokenizer with a chat template; set tokenizer= to one "
            "that has it, or use text or prompt/completion rows"
        )
    text = tok.apply_chat_template(msgs, tokenize=False)
    spans = []  # character spans of the assistant turns in the rendered conversation
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            prefix = msgs[:i]  # empty when the conversation opens with the assistant
            start = (
                len(tok.apply_chat_template(prefix, tokenize=False, add_generation_prompt=True))
                if prefix
                else 0
            )
            end = len(tok.apply_chat_template(msgs[: i + 1], tokenize=False))
            spans.append((start, end))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [
        t if any(a <= s < b for a, b in spans) else IGNORE
        for t, (s, _) in zip(ids, enc["offset_mapping"], strict=True)
    ]
    return Example(ids, labels)


def _backend(tok: Any) -> Any:
    """The fast tokenizer's backend in the state `tok(texts)` puts it in first: no
    truncation, no padding, special tokens split as the tokenizer says (a saved
    tokenizer.json may carry truncation or padding that transformers would turn off)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = bool(getattr(tok, "split_special_tokens", False))
    return backend


def _encode(tok: Any, texts: list[str], special: bool) -> tuple[np.ndarray, np.ndarray]:
    """The token ids of `texts`, flat, and each text's count: one batched call to the fast
    tokenizer's backend (what transformers' `tok(texts)` calls, without building a Python
    dict per row)."""
    backend = _backend(tok)
    if backend is not None:
        seqs = [e.ids for e in backend.encode_batch(texts, add_special_tokens=special)]
    else:
        seqs = tok(texts, add_special_tokens=special)["input_ids"]
    lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(lens.sum()))
    return flat, lens


def _join(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the pieces (flat values, per-row lengths) one after another: flat values
    and offsets."""
    lens = sum(n for _, n in pieces)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    out = np.empty(int(offsets[-1]), dtype=np.int32)
    before = offsets[:-1].copy()  # where each row's next piece starts
    for flat, n in pieces:
        piece_offsets = np.concatenate([[0], np.cumsum(n)])
        within = np.arange(len(flat), dtype=np.int64) - np.repeat(piece_offsets[:-1], n)
        out[np.repeat(before, n) + within] = flat
        before += n
    return out, offsets


def tokenize_batch(batch: dict[str, list[Any]], fmt: str, tok: Any) -> Any:
    """Rows of one format as examples with their loss masks: each ends with EOS and has its
    first label masked (after the causal shift no position learns the next sample's start).
    text: every token trained; prompt_completion: the prompt masked; chat: only the
    assistant turns trained. Returns an Arrow table of list columns `input_ids`, `labels`."""
    import pyarrow as pa

    n = len(batch["where"])
    eos_ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
    eos = (np.tile(np.asarray(eos_ids, dtype=np.int32), n), np.full(n, len(eos_ids)))
    if fmt == "chat":
        chats = zip(batch["messages"], batch["where"], strict=True)
        ex = Examples.from_list([_chat(tok, json.loads(m), w) for m, w in chats])
        ids, offsets, labels = ex.ids, ex.offsets, ex.labels.copy()
    elif fmt == "prompt_completion":
        prompt = _encode(tok, batch["prompt"], special=True)
        done = _encode(tok, batch["completion"], special=False)
        ids, offsets = _join([prompt, done, eos])
        masked = (np.full(len(prompt[0]), IGNORE, dtype=np.int32), prompt[1])
        labels, _ = _join([masked, done, eos])
    elif fmt == "text":
        ids, offsets = _join([_encode(tok, batch["text"], special=True), eos])
        labels = ids.copy()
    else:
        raise FrugalError(f"data.format {fmt!r}: use auto, {', '.join(FORMATS)}")
    starts = offsets[:-1][offsets[1:] > offsets[:-1]]
    labels[starts] = IGNORE
    # a row whose text (or completion) is blank or null has nothing to learn but its special
    # tokens: nothing of it is trained, so it counts as empty and is dropped
    content = {"text": "text", "prompt_completion": "completion"}.get(fmt)
    if content is not None:
        blank = np.fromiter((not (t or "").strip() for t in batch[content]), bool, count=n)
        labels[np.repeat(blank, np.diff(offsets))] = IGNORE
    arrow_offsets = pa.array(offsets.astype(np.int32))
    return pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(arrow_offsets, pa.array(ids)),
            "labels": pa.ListArray.from_arrays(arrow_offsets, pa.array(labels)),
        }
    )


def row_fields(row: dict[str, Any], fmt: str, where: str) -> dict[str, str]:
    """What tokenizing reads of one row of format `fmt`, checked (chat: its messages as
    JSON); an error names `where`."""
    if fmt not in FORMATS:
        raise FrugalError(f"data.format {fmt!r}: use auto, {', '.join(FORMATS)}")
    if fmt == "chat":
        return {"messages": json.dumps(messages(row, where))}
    if fmt == "prompt_completion":
        return {"prompt": text(row, "prompt", where), "completion": text(row, "completion", where)}
    return {"text": text(row, "text", where)}


def _columns(path: str, fmt: str) -> tuple[str, dict[str, list[Any]]]:
    """The file's rows as the columns tokenizing needs, and their one format; every row is
    checked here, so an error names the file and line before any tokenizing."""
    found = ""
    cols: dict[str, list[Any]] = {"where": []}
    for where, row in read_rows(path):
        f = detect_format(row, where) if fmt == "auto" else fmt
        if found and f != found and fmt == "auto":
            raise FrugalError(f"{where}: a {f} row in a {found} file; use one format per file")
        fields, found = row_fields(row, f, where), f
        cols["where"].append(where)
        for k, v in fields.items():
            cols.setdefault(k, []).append(v)
    if not cols["where"]:
        raise FrugalError(f"dataset {path} has no rows")
    return found, cols


# -- the cache -----------------------------------------------------------------------------


def file_digest(path: str) -> str:
    """A digest of the data's bytes: the file, or every file of a saved dataset directory."""
    h = hashlib.sha256()
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else "").encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def tokenizer_digest(tok: Any) -> str:
    """A digest of everything tokenizing depends on: the tokenizer's definition (vocabulary,
    merges, normalizer, post-processor), its chat template and special tokens."""
    backend = _backend(tok)  # in the state it tokenizes in, whatever called it before
    body = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    h = hashlib.sha256(body.encode())
    extra = [
        type(tok).__name__,
        getattr(tok, "chat_template", None),
        tok.eos_token_id,
        tok.bos_token_id,
        str(tok.special_tokens_map),
    ]
    h.update(json.dumps(extra, default=str).encode())
    return h.hexdigest()


@cache
def _code_digest() -> str:
    """This code's and the row reader's: editing how rows become tokens misses old entries."""
    here = Path(__file__).parent
    return hashlib.sha256(
        b"".join((here / f).read_bytes() for f in ("tokens.py", "rows.py"))
    ).hexdigest()[:16]


def tokenized(path: str, tok: Any, fmt: str = "auto") -> tuple[Examples, str]:
    """The file's examples at full length and its format, from the cache or tokenized now
    (once, by whichever process takes the lock first)."""
    if not Path(path).exists():  # one line naming the fix, before anything is hashed
        list(read_rows(path))
    key = hashlib.sha256(
        json.dumps([file_digest(path), tokenizer_digest(tok), fmt, _code_digest()]).encode()
    ).hexdigest()[:32]
    root = cache_dir("data")
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait here, then read what it wrote
        if not (final / "format.json").exists():
            _tokenize_into(path, tok, fmt, final)
        try:
            return _load(final)
        except Exception as e:  # Arrow, datasets, json: what a damaged entry makes them raise
            notice(
                f"the cached tokens of {path} in {final} were damaged ({type(e).__name__}: "
                f"{str(e)[:80]}): tokenizing again"
            )
            _tokenize_into(path, tok, fmt, final)
            return _load(final)


def _tokenize_into(path: str, tok: Any, fmt: str, final: Path) -> None:
    import datasets

    found, cols = _columns(path, fmt)
    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict(cols).map(
        tokenize_batch,
        batched=True,
        batch_size=BATCH,
        fn_kwargs={"fmt": found, "tok": tok},
        remove_columns=list(cols),
        new_fingerprint=final.name,  # ours: no hashing of the tokenizer by datasets
        keep_in_memory=True,
        features=datasets.Features(
            {
                "input_ids": datasets.List(datasets.Value("int32")),
                "labels": datasets.List(datasets.Value("int32")),
            }
        ),
    )
    tmp = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    ds.save_to_disk(str(tmp))
    sizes = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
    # written last: complete; the sizes tell a truncated entry on the next load
    (tmp / "format.json").write_text(json.dumps({"format": found, "bytes": sizes}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def _load(final: Path) -> tuple[Examples, str]:
    import datasets

    meta = json.loads((final / "format.json").read_text())
    for name, size in meta.get("bytes", {}).items():
        if (final / name).stat().st_size != size:
            raise ValueError(f"{name} is not the size it was written at")
    ds = datasets.load_from_disk(str(final))  # memory-mapped Arrow
    table = ds.data.table
    ids, offsets = _flat(table.column("input_ids"))
    labels, _ = _flat(table.column("labels"))
    return Examples(ids, labels, offsets), meta["format"]


def _flat(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """A chunked Arrow list column as flat values and 64-bit offsets, chunk by chunk (one
    combined chunk would overflow Arrow's 32-bit list offsets past 2**31 tokens)."""
    values, lengths = [], []
    for chunk in column.chunks:
        off = chunk.offsets.to_numpy()
        values.append(chunk.values.to_numpy()[off[0] : off[-1]])
        lengths.append(np.diff(off).astype(np.int64))
    lens = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    flat = np.concatenate(values) if values else np.zeros(0, dtype=np.int32)
    return flat, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
