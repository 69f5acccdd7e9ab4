"""A run's output directory is frugal's: `frugal train` writes there only where it is new,
empty, or a run of its own, so pointing --output-dir at a directory of the user's (the one
holding their config.yaml, say) changes nothing in it."""

from __future__ import annotations

import json
from pathlib import Path

from frugal.errors import FrugalError
from frugal.files import check_dir, write_text_atomic

MARK = ".frugal-run"  # written first into a run's directory: the directory is frugal's
# what frugal train wrote into a run directory before it marked them (resumed after upgrading)
OWN = ("checkpoints", "run_summary.json", "metrics.jsonl")


def check(out: Path) -> None:
    """Refuse, with one line and before any work, an output directory that cannot be one,
    or that holds files frugal did not write."""
    check_dir(out, "--output-dir")
    if (out / MARK).is_file():
        return
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        if entries and not any(name in OWN for name in entries):
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise FrugalError(
                f"--output-dir {out}: holds files frugal did not write ({shown}): give a new "
                "or empty directory (nothing there was changed)"
            )


def claim(out: Path) -> None:
    """Make `out` this run's directory (after `check`): created, and marked frugal's."""
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARK).is_file():
        write_text_atomic(out / MARK, json.dumps({"written_by": "frugal train"}) + "\n")
