"""Durations as people write them: `24h`, `90m`, `2d`, `1h30m`, `45s`, `1.5h`.

A plain number is in the unit the option names: hours for `plan --deadline`, minutes for
`training.max_time_min`. One parser for every place a time is asked.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

SECONDS = {"d": 86400.0, "h": 3600.0, "min": 60.0, "m": 60.0, "s": 1.0}
UNIT_NAMES = {"h": "hours", "min": "minutes"}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(d|h|min|m|s)")


def parse_duration(value: str | float, unit: str) -> float:
    """`value` in `unit` ("h" or "min"); ValueError with the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(_bad(value, unit))
    if isinstance(value, int | float):
        amount = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        try:
            amount = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for m in _PART.finditer(text):
                if m.start() != pos:
                    break
                seconds += float(m[1]) * SECONDS[m[2]]
                pos = m.end()
            if pos == 0 or pos != len(text):
                raise ValueError(_bad(value, unit)) from None
            amount = seconds / SECONDS[unit]
    if not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"{value!r} is not a positive duration: {_forms(unit)}")
    return amount


def _forms(unit: str) -> str:
    return f"write 24h, 90m, 2d or 1h30m (a plain number is {UNIT_NAMES[unit]})"


def _bad(value: object, unit: str) -> str:
    return f"{value!r} is not a duration: {_forms(unit)}"


def _in(unit: str) -> BeforeValidator:
    return BeforeValidator(lambda v: v if v is None else parse_duration(v, unit))


# pydantic field types: a duration as people write it, held as a number of hours / minutes
Hours = Annotated[float | None, _in("h")]
Minutes = Annotated[float | None, _in("min")]
