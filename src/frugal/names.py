"""Matching names as people type them: GPU, model, provider and option names compared
without case or punctuation, and the nearest known names for a did-you-mean."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def norm(s: str) -> str:
    """Lower case, letters and digits only: 'RTX 4090' == 'rtx4090' == 'rtx-4090'."""
    return "".join(c for c in s.lower() if c.isalnum())


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The choices nearest to `name`, compared case- and punctuation-insensitively."""
    choices = list(choices)
    by_norm: dict[str, str] = {}
    for c in choices:
        by_norm.setdefault(norm(c), c)
    # a substring hit (e.g. "llama-3.1-8b" in "meta-llama/Llama-3.1-8B") is the strongest hint
    key = norm(name)
    hits = [c for k, c in by_norm.items() if key and key in k]
    hits.sort(key=len)
    fuzzy = difflib.get_close_matches(key, list(by_norm), n=n, cutoff=0.5)
    out: list[str] = []
    for c in [*hits, *(by_norm[k] for k in fuzzy)]:
        if c not in out:
            out.append(c)
    return out[:n]
