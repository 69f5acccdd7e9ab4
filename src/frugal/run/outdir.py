"""A run's output directory is frugal's, and one run's at a time: `frugal train` writes
there only where it is new, empty, or a run of its own, so pointing --output-dir at a
directory of the user's (the one holding their config.yaml, say) changes nothing in it;
and a second `frugal train` into a directory a running one holds is refused, so two runs
never write one set of checkpoints."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from frugal.errors import FrugalError
from frugal.files import check_dir, write_text_atomic

MARK = ".frugal-run"  # written first into a run's directory: the directory is frugal's
LOCK = ".frugal-run.lock"  # held (flock) by the one frugal train writing there
# what frugal train wrote into a run directory before it marked them (resumed after upgrading)
OWN = ("checkpoints", "run_summary.json", "metrics.jsonl", "dry-run", LOCK)
IGNORED = (".DS_Store", "Thumbs.db")  # what a file browser leaves in any directory


def check(out: Path) -> None:
    """Refuse, with one line and before any work, an output directory that cannot be one,
    or that holds files frugal did not write."""
    check_dir(out, "--output-dir")
    if (out / MARK).is_file():
        return
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir() if p.name not in IGNORED)
        if entries and not any(name in OWN for name in entries):
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise FrugalError(
                f"--output-dir {out}: holds files frugal did not write ({shown}): give a new "
                "or empty directory (nothing there was changed)"
            )


@contextmanager
def held(out: Path) -> Iterator[None]:
    """`out` made this run's (after `check`): created, marked frugal's, and locked while the
    block runs; a directory another `frugal train` holds is refused with one line. The lock
    is the operating system's (flock): a run killed with -9 lets go of it with its life."""
    out.mkdir(parents=True, exist_ok=True)
    f = open(out / LOCK, "a+")  # noqa: SIM115 (closed below, which lets the lock go)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise FrugalError(
            f"--output-dir {out} is in use by another frugal train ({holder}): wait for it "
            "to end, or give another output directory (nothing there was changed)"
        ) from None
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        if not (out / MARK).is_file():
            write_text_atomic(out / MARK, json.dumps({"written_by": "frugal train"}) + "\n")
        yield
    finally:
        f.close()
