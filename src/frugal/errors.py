"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import sys


class FrugalError(Exception):
    """Bad input or no feasible answer: the message names the fix."""

    exit_code = 2


_said: set[str] = set()


def notice(message: str) -> None:
    """Something the user should know that does not stop the command (a damaged cache
    entry, rebuilt): one line on stderr, once per process (stdout stays the answer's)."""
    if message not in _said:
        _said.add(message)
        print(f"note: {message}", file=sys.stderr)


INTERRUPTED_EXIT = 130  # 128 + SIGINT: a second Ctrl-C stopped it at once
RESUMABLE_EXIT = 75  # EX_TEMPFAIL: stopped on a signal, checkpoint saved, run `--resume auto`


class PeerLost(FrugalError):
    """Another process of a multi-process run is gone (its node died, or it was killed):
    this one stops, and the run resumes from its newest complete checkpoint."""

    exit_code = RESUMABLE_EXIT
