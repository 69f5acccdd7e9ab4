"""Numbers as frugal prints them: dollars, and large quantities with an SI prefix. One
place for each, so that a figure reads the same in every command and report."""

from __future__ import annotations


def usd(x: float) -> str:
    """Dollars with cents, or four decimals below a dollar (a CPU demo costs fractions):
    what a run's meter and the cost tables show."""
    return f"${x:,.2f}" if abs(x) >= 1 or x == 0 else f"${x:.4f}"


def usd_cents(x: float) -> str:
    """Dollars with cents, the sign before the dollar sign (-$3.00): a report's totals."""
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def si(x: float) -> str:
    """A large quantity with its SI prefix, one decimal (3.2 T): FLOPs and the like."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f}"


def as_count(n: float) -> str:
    """A count as people write it (20M, 1.5G, 300k), three significant digits: the form
    `frugal.counts.parse_count` reads back."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def duration_h(h: float) -> str:
    """Hours as a plan says them: minutes under a tenth of an hour (a run of a few minutes
    read "0.0 h"), else hours to a tenth."""
    return f"{max(1, round(h * 60))} min" if h < 0.1 else f"{h:.1f} h"
