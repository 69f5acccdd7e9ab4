"""Counts as people write them: `20M`, `1.5B`, `2e7`, `20_000_000`."""

from __future__ import annotations

import math

SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def parse_count(text: str | float) -> float:
    """A positive count; ValueError naming the accepted forms otherwise."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        v = float(text)
    else:
        t = str(text).strip().lower().replace("_", "").replace(",", "")
        try:
            v = float(t[:-1]) * SUFFIX[t[-1]] if t and t[-1] in SUFFIX else float(t)
        except ValueError:
            v = -1.0
    if not 0 < v < math.inf:
        raise ValueError(f"{text!r} is not a token count: write 20M, 1.5B or 2e7")
    return v
