"""Training data: rows → tokenized examples with loss masks → packed rows → batches.

Formats (`data.format`, detected per file when `auto`):
- text: `{"text": ...}`; every token is trained.
- prompt_completion: `{"prompt": ..., "completion": ...}`; prompt tokens are masked.
- chat: `{"messages": [{"role", "content"}, ...]}` rendered with the tokenizer's chat
  template; only the assistant turns are trained (found by rendering each prefix of the
  conversation and mapping the character spans to tokens through the offsets).

Every example ends with EOS and its first label is masked, so that after the causal shift no
position is trained to predict the first token of the next packed sample. Packing fills rows
of `seq` tokens greedily; position ids restart at 0 for each sample, which makes transformers
build a block-diagonal causal mask (masking_utils.find_packed_sequence_indices), so packed
samples never attend to each other. Padding forms its own segment (id 0) and is never trained.

Examples are tokenized once per file and tokenizer, in batches, and kept as Arrow / flat
int32 columns (`frugal.data.tokens`); packing writes straight into `[rows, seq]` arrays.

The order of rows in epoch e is a permutation seeded by (seed, e); global step s reads rows
[k*E, (k+1)*E) of epoch s // steps_per_epoch, k = s % steps_per_epoch. The data position is
therefore a function of the step alone, and a resumed run reads exactly what an
uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np
import torch

from frugal.data.labels import LabelledRows
from frugal.data.pairs import PairRows, collate_pairs
from frugal.data.rows import detect_format as detect_format  # part of this module's API
from frugal.data.tokens import (
    DataStats,
    Example,
    Examples,
    row_fields,
    tokenize_batch,
    tokenized,
)
from frugal.errors import FrugalError
from frugal.step.batch import layout
from frugal.step.loss import IGNORE
from frugal.step.tasks.base import Output


def tokenize(row: dict[str, Any], fmt: str, tok: Any, where: str) -> Example:
    """One row as an example, with its loss mask (the batched path, for one row)."""
    one = {k: [v] for k, v in row_fields(row, fmt, where).items()}
    out = tokenize_batch({**one, "where": [where]}, fmt, tok)
    return Example(out.column("input_ids")[0].as_py(), out.column("labels")[0].as_py())


def load_examples(
    path: str,
    tok: Any,
    seq: int,
    fmt: str = "auto",
    stats: DataStats | None = None,
    need_trainable: bool = True,
) -> Examples:
    """Tokenized examples of a data file, truncated to `seq`; empty rows dropped. A file with
    nothing to train is refused unless `need_trainable` is off (a count, not a run)."""
    full, found = tokenized(path, tok, fmt)
    st = stats if stats is not None else DataStats()
    lengths = full.lengths
    trained = full.trained_per_example(seq)
    st.rows, st.format = len(full), found
    st.tokens, st.lengths = int(lengths.sum()), lengths.tolist()
    st.kept_tokens = int(np.minimum(lengths, seq).sum())
    st.over_length = int((lengths > seq).sum())
    st.empty = int((trained == 0).sum())
    st.trained_tokens = int(trained.sum())
    seen: set[bytes] = set()
    ids, offsets = full.ids, full.offsets.tolist()
    for (a, b), n in zip(itertools.pairwise(offsets), trained.tolist(), strict=True):
        if not n:  # an empty row is counted as empty, not as a repeat
            continue
        digest = hashlib.blake2b(ids[a:b].tobytes(), digest_size=16).digest()
        st.duplicates += digest in seen
        seen.add(digest)
    keep = np.flatnonzero(trained > 0)
    if not len(keep) and need_trainable:
        raise FrugalError(f"dataset {path}: no row has tokens to train on (all empty or masked)")
    return full.take(keep, np.minimum(lengths[keep], seq))


def file_stats(path: str, tok: Any, seq: int, fmt: str = "auto") -> DataStats:
    """What `frugal train`'s tokenization makes of a file: `frugal data check` prints it,
    `frugal plan --dataset` takes its token total."""
    st = DataStats()
    load_examples(path, tok, seq, fmt, st, need_trainable=False)
    return st


def load_tokenizer(src: str, fix: str) -> Any:
    """The tokenizer at `src` (a local dir, or a hub id in the local cache), offline;
    a FrugalError that ends with `fix` when there is none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(src, local_files_only=True)
    except Exception as e:  # not cached, no tokenizer files, offline, or a damaged file
        _name_damaged_json(src)
        raise FrugalError(f"no tokenizer at {src} offline ({type(e).__name__}): {fix}") from None


def _name_damaged_json(src: str) -> None:
    """Where loading a local directory's tokenizer failed on one of its JSON files, say
    which, rather than "no tokenizer" (read only after a failure: these files are big)."""
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        file = Path(src) / name
        try:
            raw = file.read_bytes()
        except OSError:  # not there (a hub id), or no such path at all
            continue
        try:
            json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise FrugalError(
                f"{file} is not valid JSON ({str(e)[:60]}): download the model's {name} again"
            ) from None


# -- rows of the model's input ----------------------------------------------------------------


@dataclass
class Row:
    input_ids: list[int]
    labels: list[int]
    segments: list[int]  # 1, 2, ... per sample, 0 for padding
    positions: list[int]


@dataclass(eq=False)
class PackedRows:
    """Packed rows as `[rows, seq]` int32 arrays; `rows[i]` is one `Row` (Python lists)."""

    input_ids: np.ndarray
    labels: np.ndarray
    segments: np.ndarray
    positions: np.ndarray

    def __len__(self) -> int:
        return len(self.input_ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedRows):
            return all(
                np.array_equal(getattr(self, k), getattr(other, k))
                for k in ("input_ids", "labels", "segments", "positions")
            )
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, i: int) -> Row: ...
    @overload
    def __getitem__(self, i: slice) -> PackedRows: ...

    def __getitem__(self, i: int | slice) -> Row | PackedRows:
        if isinstance(i, slice):
            return PackedRows(
                self.input_ids[i], self.labels[i], self.segments[i], self.positions[i]
            )
        return Row(
            self.input_ids[i].tolist(),
            self.labels[i].tolist(),
            self.segments[i].tolist(),
            self.positions[i].tolist(),
        )

    def __iter__(self) -> Iterator[Row]:
        return (self[i] for i in range(len(self)))


@dataclass
class UnpackedRows:
    """One sample per row, unpadded (a batch pads its rows to its longest)."""

    examples: Examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Row:
        e = self.examples[i]
        n = len(e.input_ids)
        return Row(e.input_ids, e.labels, [1] * n, list(range(n)))

    def __iter__(self) -> Iterator[Row]:
        return (self[i] for i in range(len(self)))


Rows = PackedRows | UnpackedRows


def _as_examples(examples: Examples | Sequence[Example]) -> Examples:
    return examples if isinstance(examples, Examples) else Examples.from_list(examples)


def pack(examples: Examples | Sequence[Example], seq: int, pad_id: int) -> PackedRows:
    """Greedy packing in order: a sample that does not fit starts a new row. The rows are
    assigned in one pass over the lengths; the tokens are then placed in one vectorized
    scatter."""
    ex = _as_examples(examples)
    ex = ex.truncated(seq)  # load_examples truncates already
    lens = ex.lengths
    row_of = np.empty(len(ex), dtype=np.int64)
    start = np.empty(len(ex), dtype=np.int64)
    first = []  # the first sample of each row
    r, used = -1, seq
    for i, n in enumerate(lens.tolist()):
        if used and used + n > seq:
            r, used = r + 1, 0
            first.append(i)
        row_of[i], start[i] = r, used
        used += n
    n_rows = r + 1
    shape = (n_rows, seq)
    ids = np.full(shape, pad_id, dtype=np.int32)
    labels = np.full(shape, IGNORE, dtype=np.int32)
    segments = np.zeros(shape, dtype=np.int32)
    within = ex.positions()
    dest = np.repeat(row_of * seq + start, lens) + within
    ids.flat[dest], labels.flat[dest] = ex.ids, ex.labels
    seg_of = np.arange(len(ex)) - np.asarray(first, dtype=np.int64)[row_of] + 1
    segments.flat[dest] = np.repeat(seg_of, lens)
    # positions restart at 0 for each sample, and for the padding after the last one
    filled = np.bincount(row_of, weights=lens, minlength=n_rows).astype(np.int64)
    column = np.arange(seq, dtype=np.int64)[None, :]
    positions = (column - filled[:, None]).astype(np.int32)
    positions.flat[dest] = within
    return PackedRows(ids, labels, segments, positions)


def unpacked(examples: Examples | Sequence[Example]) -> UnpackedRows:
    return UnpackedRows(_as_examples(examples))


def collate(rows: Sequence[Row], pad_id: int, packed: bool) -> dict[str, torch.Tensor]:
    """Right-padded tensors in the step's layout (`frugal.step.batch.layout`): packed rows
    get position ids and no attention mask (so the model builds the block-diagonal mask);
    unpacked rows get an attention mask."""
    width = max(len(r.input_ids) for r in rows)

    def padded(get: Any, fill: int) -> torch.Tensor:
        return torch.tensor([get(r) + [fill] * (width - len(get(r))) for r in rows])

    return layout(
        padded(lambda r: r.input_ids, pad_id),
        padded(lambda r: r.labels, IGNORE),
        padded(lambda r: r.segments, 0),
        padded(lambda r: r.positions, 0),
        packed,
    )


def collate_labelled(
    rows: LabelledRows, indices: list[int], pad_id: int
) -> dict[str, torch.Tensor]:
    """A classifier's micro-batch: its rows' tokens right-padded to the longest, and one
    class id a row (`frugal.step.batch.layout`)."""
    ids = [rows.input_ids[i] for i in indices]
    width = max(len(t) for t in ids)
    tokens = torch.full((len(ids), width), pad_id, dtype=torch.long)
    segments = torch.zeros((len(ids), width), dtype=torch.long)
    for r, t in enumerate(ids):
        tokens[r, : len(t)] = torch.tensor(t)
        segments[r, : len(t)] = 1
    positions = torch.arange(width).expand(len(ids), width).clone()
    labels = torch.tensor([rows.labels[i] for i in indices])
    return layout(tokens, labels, segments, positions, packed=False)


class Batcher:
    """Batches of rows by index. Packed rows all have the same length: their arrays become
    tensors once and a batch is an index_select; unpacked rows (a classifier's and
    preference pairs too) are collated (right-padded) per batch."""

    def __init__(
        self, rows: Rows | LabelledRows | PairRows | Sequence[Row], pad_id: int, packed: bool
    ) -> None:
        self.rows, self.pad_id, self.packed = rows, pad_id, packed
        self.tensors: dict[str, torch.Tensor] = {}
        # what a batch carries beside its rows, by name: a pass's outputs (`run.passes`),
        # one entry per row, memory-mapped, each laid out as its `Output` says
        self.carried: dict[str, tuple[np.ndarray, Output]] = {}
        if isinstance(rows, PackedRows) and len(rows):
            tensor = lambda a: torch.from_numpy(a).long()  # noqa: E731
            self.tensors = layout(
                tensor(rows.input_ids),
                tensor(rows.labels),
                tensor(rows.segments),
                tensor(rows.positions),
                True,
            )
        elif packed and len(rows) and not isinstance(rows, LabelledRows | PairRows):
            self.tensors = collate(list(rows), pad_id, packed=True)

    def __len__(self) -> int:
        return len(self.rows)

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        b = self._tokens(indices)
        for name, (a, out) in self.carried.items():
            b[name] = out.carried(a[indices], b["input_ids"].shape[1])
        return b

    def digest(self) -> str:
        """Of every row as a batch gives it (its tokens, labels and layout)."""
        h = hashlib.sha256()
        for start in range(0, len(self), 256):
            b = self._tokens(list(range(start, min(start + 256, len(self)))))
            for name in sorted(b):
                h.update(name.encode() + b[name].numpy().tobytes())
        return h.hexdigest()[:16]

    def _tokens(self, indices: list[int]) -> dict[str, torch.Tensor]:
        if self.tensors:
            idx = torch.tensor(indices)
            return {k: v.index_select(0, idx) for k, v in self.tensors.items()}
        if isinstance(self.rows, LabelledRows):
            return collate_labelled(self.rows, indices, self.pad_id)
        if isinstance(self.rows, PairRows):
            return collate_pairs(self.rows, indices, self.pad_id)
        rows = self.rows
        return collate([rows[i] for i in indices], self.pad_id, self.packed)


def split(examples: Any, ratio: float, seed: int) -> tuple[Any, Any]:
    """(train, validation): a seeded random `ratio` of the examples held out, both in their
    original order (`Examples` columns, or a list of `Example`)."""
    if ratio <= 0 or len(examples) < 2:
        return examples, examples.take(np.arange(0)) if isinstance(examples, Examples) else []
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(examples), generator=g).numpy()
    n_val = max(1, round(len(examples) * ratio))
    val = np.sort(order[:n_val])
    train = np.setdiff1d(np.arange(len(examples)), val)  # sorted
    if isinstance(examples, Examples):
        return examples.take(train), examples.take(val)
    return [examples[i] for i in train], [examples[i] for i in val]


@dataclass
class Schedule:
    """Which rows each optimizer step reads: a function of the step alone."""

    n_rows: int
    effective_batch: int
    epochs: float
    seed: int

    def __post_init__(self) -> None:
        if self.n_rows < self.effective_batch:
            raise FrugalError(
                f"the training data makes {self.n_rows} rows, fewer than "
                f"training.effective_batch={self.effective_batch}: lower it or add data"
            )
        self._orders: dict[int, list[int]] = {}

    @property
    def steps_per_epoch(self) -> int:
        return self.n_rows // self.effective_batch

    @property
    def total_steps(self) -> int:
        return max(1, math.floor(self.epochs * self.steps_per_epoch + 0.5))  # half rounds up

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders = {epoch: torch.randperm(self.n_rows, generator=g).tolist()}
        return self._orders[epoch]

    def rows_of_step(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.steps_per_epoch)
        e = self.effective_batch
        return self.order(epoch)[k * e : (k + 1) * e]

    def micro_batches(self, step: int, rank: int, world: int, micro: int) -> Iterator[list[int]]:
        """This rank's share of the step's rows, in micro-batches of `micro`."""
        mine = self.rows_of_step(step)[rank::world]
        for i in range(0, len(mine), micro):
            yield mine[i : i + micro]
