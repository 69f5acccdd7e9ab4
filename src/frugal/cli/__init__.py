"""The `frugal` command line: thin commands that parse, call the library and print."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Console

ARGV: list[str] = []  # the running command's arguments (`frugal train` relaunches them)


def console() -> Console:
    """stdout's console; 120 columns when it is not a terminal (a pipe, a file, a test),
    so tables are not cut to 80."""
    con = Console()
    return con if con.is_terminal else Console(width=120)


def print_json(obj: Any) -> None:
    """What `--json` prints: one JSON object on one line of stdout. NaN and infinities are
    not JSON: a number that is not finite (an unbounded latency, say) is null."""
    print(json.dumps(_finite(obj), allow_nan=False))


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x
