"""The `frugal` command line: thin commands that parse, call the library and print."""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from frugal.hardware.catalog import PriceBasis

ARGV: list[str] = []  # the running command's arguments (`frugal train` relaunches them)


def console() -> Console:
    """stdout's console; 120 columns when it is not a terminal (a pipe, a file, a test),
    so tables are not cut to 80."""
    con = Console()
    return con if con.is_terminal else Console(width=120)


def show_prices(basis: PriceBasis, json_out: bool = False) -> None:
    """What every priced answer says last: which prices, how old (in --json: its `prices`);
    prices past their age: a warning on stderr, naming `frugal offers update`."""
    if not json_out:
        console().print(f"[dim]{basis.line()}[/]")
    if warning := basis.warning():
        print(f"warning: {warning}", file=sys.stderr)


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
