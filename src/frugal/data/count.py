"""How many training tokens a dataset file holds, for `frugal plan --dataset`.

With the model's tokenizer available offline (a local model dir, or the hub cache) every
row is tokenized exactly as `frugal train` does it (chat template, EOS) and cut to the
sequence length as training cuts it, so the total is what the run will read, the one
`frugal data check` reports as kept. Otherwise it is estimated as characters / 4 (each row
cut to the sequence length too) and the result says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from frugal.data.rows import detect_format, read_rows, row_text
from frugal.data.stats import DataStats
from frugal.errors import FrugalError

CHARS_PER_TOKEN = 4.0  # English text with BPE vocabularies of 32k-256k tokens


@dataclass
class TokenCount:
    stats: DataStats  # rows, tokens in the file, tokens kept at the sequence length
    exact: bool
    how: str

    @property
    def tokens(self) -> int:
        """The tokens a run reads per epoch: each row cut to the sequence length."""
        return self.stats.kept_tokens

    def note(self, path: str, seq: int) -> str:
        st = self.stats
        line = f"{path}: {st.rows:,} rows, {st.kept_tokens:,} tokens at seq {seq:,} ({self.how})"
        cut = st.cut(seq, "--seq")
        return f"{line}; {cut}" if cut else line


def count_tokens(path: str, model: str | None, seq: int) -> TokenCount:
    from frugal.data.examples import file_stats, load_tokenizer

    try:
        tok = load_tokenizer(model, "") if model else None
    except FrugalError:
        tok = None
    if tok is not None:
        st = file_stats(path, tok, seq)
        return TokenCount(st, True, f"counted with {model}'s tokenizer")
    texts = [row_text(r, detect_format(r, where), where) for where, r in read_rows(path)]
    if not texts:
        raise FrugalError(f"dataset {path} has no rows")
    lengths = [max(1, round(len(t) / CHARS_PER_TOKEN)) for t in texts]
    st = DataStats(
        rows=len(texts),
        tokens=sum(lengths),
        kept_tokens=sum(min(n, seq) for n in lengths),
        over_length=sum(n > seq for n in lengths),
        lengths=lengths,
    )
    return TokenCount(
        st,
        False,
        f"estimated as characters / {CHARS_PER_TOKEN:g} (the tokenizer is not available offline)",
    )
