"""How many training tokens a dataset file holds, for `frugal plan --dataset`.

With the model's tokenizer available offline (a local model dir, or the hub cache) every
row is tokenized exactly as `frugal train` does it (chat template, EOS; before truncation),
so the total is the one `frugal data check` reports. Otherwise it is estimated as
characters / 4 and the result says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from frugal.data.rows import detect_format, read_rows, row_text
from frugal.errors import FrugalError

CHARS_PER_TOKEN = 4.0  # English text with BPE vocabularies of 32k-256k tokens


@dataclass
class TokenCount:
    rows: int
    tokens: int
    exact: bool
    how: str


def count_tokens(path: str, model: str | None = None) -> TokenCount:
    from frugal.data.examples import file_stats, load_tokenizer

    try:
        tok = load_tokenizer(model, "") if model else None
    except FrugalError:
        tok = None
    if tok is not None:
        st = file_stats(path, tok, sys.maxsize)
        return TokenCount(st.rows, st.tokens, True, f"counted with {model}'s tokenizer")
    texts = [row_text(r, detect_format(r, where), where) for where, r in read_rows(path)]
    if not texts:
        raise FrugalError(f"dataset {path} has no rows")
    return TokenCount(
        len(texts),
        round(sum(map(len, texts)) / CHARS_PER_TOKEN),
        False,
        f"estimated as characters / {CHARS_PER_TOKEN:g} (the tokenizer is not available offline)",
    )
