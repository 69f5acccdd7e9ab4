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

The order of rows in epoch e is a permutation seeded by (seed, e); global step s reads rows
[k*E, (k+1)*E) of epoch s // steps_per_epoch, k = s % steps_per_epoch. The data position is
therefore a function of the step alone, and a resumed run reads exactly what an
uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from frugal.data.rows import FORMATS, detect_format, messages, read_rows
from frugal.errors import FrugalError
from frugal.step.batch import layout
from frugal.step.loss import IGNORE


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]  # IGNORE where the token is not trained


@dataclass
class DataStats:
    rows: int = 0
    empty: int = 0  # no text, or nothing left to train after masking
    duplicates: int = 0
    over_length: int = 0  # longer than seq (truncated)
    tokens: int = 0  # before truncation
    trained_tokens: int = 0  # after truncation, labels not masked
    lengths: list[int] = field(default_factory=list)
    format: str = ""


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


def tokenize(row: dict[str, Any], fmt: str, tok: Any, where: str) -> Example:
    """One row as an example, with its loss mask; ends with EOS; first label masked."""
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    if fmt == "chat":
        ex = _chat(tok, messages(row, where), where)
    elif fmt == "prompt_completion":
        p = tok(str(row.get("prompt") or ""))["input_ids"]
        c = tok(str(row.get("completion") or ""), add_special_tokens=False)["input_ids"] + eos
        ex = Example(p + c, [IGNORE] * len(p) + c)
    elif fmt == "text":
        ids = tok(str(row.get("text") or ""))["input_ids"] + eos
        ex = Example(ids, list(ids))
    else:
        raise FrugalError(f"data.format {fmt!r}: use auto, {', '.join(FORMATS)}")
    if ex.labels:
        ex.labels[0] = IGNORE
    return ex


def load_examples(
    path: str,
    tok: Any,
    seq: int,
    fmt: str = "auto",
    stats: DataStats | None = None,
    need_trainable: bool = True,
) -> list[Example]:
    """Tokenized examples of a data file, truncated to `seq`; empty rows dropped. A file with
    nothing to train is refused unless `need_trainable` is off (a count, not a run)."""
    st = stats if stats is not None else DataStats()
    seen: set[bytes] = set()
    out: list[Example] = []
    for where, row in read_rows(path):
        st.rows += 1
        f = detect_format(row, where) if fmt == "auto" else fmt
        if st.format and f != st.format and fmt == "auto":
            raise FrugalError(f"{where}: a {f} row in a {st.format} file; use one format per file")
        st.format = f
        ex = tokenize(row, f, tok, where)
        digest = hashlib.blake2b(repr(ex.input_ids).encode(), digest_size=16).digest()
        st.duplicates += digest in seen
        seen.add(digest)
        n = len(ex.input_ids)
        st.lengths.append(n)
        st.tokens += n
        if n > seq:
            st.over_length += 1
            ex = Example(ex.input_ids[:seq], ex.labels[:seq])
        trained = sum(1 for x in ex.labels if x != IGNORE)
        if trained == 0:
            st.empty += 1
            continue
        st.trained_tokens += trained
        out.append(ex)
    if not st.rows:
        raise FrugalError(f"dataset {path} has no rows")
    if not out and need_trainable:
        raise FrugalError(f"dataset {path}: no row has tokens to train on (all empty or masked)")
    return out


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
    except Exception as e:  # not cached, no tokenizer files, offline
        raise FrugalError(f"no tokenizer at {src} offline ({type(e).__name__}): {fix}") from None


# -- rows of the model's input ----------------------------------------------------------------


@dataclass
class Row:
    input_ids: list[int]
    labels: list[int]
    segments: list[int]  # 1, 2, ... per sample, 0 for padding
    positions: list[int]


def pack(examples: list[Example], seq: int, pad_id: int) -> list[Row]:
    """Greedy packing in order: a sample that does not fit starts a new row."""
    rows: list[Row] = []
    cur = Row([], [], [], [])

    def close() -> None:
        pad = seq - len(cur.input_ids)
        cur.input_ids += [pad_id] * pad
        cur.labels += [IGNORE] * pad
        cur.segments += [0] * pad
        cur.positions += list(range(pad))
        rows.append(Row(cur.input_ids, cur.labels, cur.segments, cur.positions))

    seg = 0
    for ex in examples:
        ex = Example(ex.input_ids[:seq], ex.labels[:seq])  # load_examples truncates already
        if cur.input_ids and len(cur.input_ids) + len(ex.input_ids) > seq:
            close()
            cur, seg = Row([], [], [], []), 0
        seg += 1
        cur.input_ids += ex.input_ids
        cur.labels += ex.labels
        cur.segments += [seg] * len(ex.input_ids)
        cur.positions += list(range(len(ex.input_ids)))
    if cur.input_ids:
        close()
    return rows


def unpacked(examples: list[Example]) -> list[Row]:
    return [
        Row(e.input_ids, e.labels, [1] * len(e.input_ids), list(range(len(e.input_ids))))
        for e in examples
    ]


def collate(rows: list[Row], pad_id: int, packed: bool) -> dict[str, torch.Tensor]:
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


class Batcher:
    """Batches of rows by index. Packed rows all have the same length, so they are stacked
    into tensors once and a batch is an index_select (a Python-list collate of 64 x 4096
    tokens costs ~0.5 s a step); unpacked rows are collated (right-padded) per batch."""

    def __init__(self, rows: list[Row], pad_id: int, packed: bool) -> None:
        self.rows, self.pad_id, self.packed = rows, pad_id, packed
        self.tensors: dict[str, torch.Tensor] = {}
        if packed and rows:
            self.tensors = collate(rows, pad_id, packed=True)

    def __len__(self) -> int:
        return len(self.rows)

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        if self.tensors:
            idx = torch.tensor(indices)
            return {k: v.index_select(0, idx) for k, v in self.tensors.items()}
        return collate([self.rows[i] for i in indices], self.pad_id, self.packed)


def split(examples: list[Example], ratio: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, validation): a seeded random `ratio` of the examples held out."""
    if ratio <= 0 or len(examples) < 2:
        return examples, []
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(examples), generator=g).tolist()
    n_val = max(1, round(len(examples) * ratio))
    val = sorted(order[:n_val])
    held = set(val)
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in val]


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
