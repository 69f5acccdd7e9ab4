"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class FrugalError(Exception):
    """Bad input or no feasible answer: the message names the fix."""

    exit_code = 2


RESUMABLE_EXIT = 75  # EX_TEMPFAIL: stopped on a signal, checkpoint saved, run `--resume auto`
INTERRUPTED_EXIT = 130  # 128 + SIGINT: a second Ctrl-C stopped it at once
