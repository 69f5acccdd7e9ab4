"""Counts as people write them: `20M`, `1.5B`, `2e7`, `20_000_000`."""

from __future__ import annotations

import math

SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
MOST = 1e15  # a thousand trillion tokens: more than any model has been trained on


def parse_count(text: str | float) -> float:
    """A whole count from 1 to MOST; ValueError naming the accepted forms otherwise."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        v = float(text)
    else:
        t = str(text).strip().lower().replace("_", "").replace(",", "")
        try:
            v = float(t[:-1]) * SUFFIX[t[-1]] if t and t[-1] in SUFFIX else float(t)
        except ValueError:
            v = math.nan
    # 1.33M is 1,330,000.0000000002 in floating point: whole within rounding
    if not 1 <= v <= MOST or abs(v - round(v)) > 1e-9 * v:
        raise ValueError(
            f"{text!r} is not a token count: give a whole count from 1 to 1e15, "
            "such as 20M, 1.5B or 2e7"
        )
    return float(round(v))
