"""What reading a data file found: rows, tokens before and after the sequence cut, empty
and repeated rows (`frugal data check` prints it, `plan --dataset` bills it, `train` says
what it cuts). Plain data: no torch, so the plan imports it without the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataStats:
    rows: int = 0
    empty: int = 0  # no text, or nothing left to train after masking
    duplicates: int = 0
    over_length: int = 0  # longer than seq (truncated)
    tokens: int = 0  # before truncation
    kept_tokens: int = 0  # after truncation: what the model reads (and a plan bills)
    trained_tokens: int = 0  # after truncation, labels not masked
    lengths: list[int] = field(default_factory=list)
    format: str = ""

    def cut(self, seq: int, flag: str) -> str | None:
        """What truncation to `seq` costs, in one sentence (None when no row is longer):
        said the same by `data check`, `plan --dataset` and `train`."""
        if not self.over_length:
            return None
        return (
            f"{self.over_length:,} of {self.rows:,} rows are longer than {flag} {seq:,} and "
            f"are cut to it: {self.tokens - self.kept_tokens:,} of {self.tokens:,} tokens are "
            f"not trained (raise {flag} to {max(self.lengths):,}, or split those rows)"
        )
