"""Writing a run's records when the ledger may be down: nothing is lost.

`Recorder.send(op, **kwargs)` calls `Ledger.<op>(**kwargs)`. When the ledger cannot be
reached (a server down, a damaged file, a full disk), the record is appended to a spool
file beside the run (JSON lines, fsynced) and training goes on. At every later send the
spool goes first, in order, so the books see the run's records as they happened, with
their original times; `flush()` sends what waits (the next run in the same directory does
it, and so does `frugal costs sync DIR`). Each operation is safe to send twice (a crash
between sending and rewriting the spool): starts and heartbeats sent again are kept once.
While the ledger is down it is tried again once a minute, not at every record; a record
the ledger refuses as it is (a constraint, a value too long) is dropped with a note rather
than blocking the ones behind it. One writer of the spool at a time (a lock file beside
it), and a line torn by a crash never swallows the next.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

from frugal.errors import FrugalError
from frugal.files import write_text_atomic
from frugal.ledger.store import Ledger, now

OPS = ("start_run", "resume_run", "heartbeat", "end_run")
SPOOL_NAME = "ledger-spool.jsonl"
_TIMES = ("at", "period_end")
RETRY_S = 60.0
UNREACHABLE = (OperationalError, InterfaceError)  # connection refused, timed out, dropped
T = TypeVar("T")


def attempt(
    call: Callable[[Ledger], T], books: Ledger | None = None
) -> tuple[T | None, str | None]:
    """`call(books)` (default: frugal's ledger), or (None, why) when the ledger cannot be
    reached: for records that must not hold up the command that makes them (a plan)."""
    try:
        return call(books or Ledger()), None
    except (FrugalError, SQLAlchemyError, OSError) as e:
        return None, _why(e)


class Recorder:
    def __init__(self, spool: Path, url: str | None = None, retry_s: float = RETRY_S) -> None:
        self.spool = spool
        self.url = url
        self.retry_s = retry_s  # while down, try the ledger again this often (not per record)
        self.down: str | None = None  # why the last attempt failed; None while reachable
        self.down_at = -float("inf")
        self.dropped: list[str] = []  # records the ledger refused as they were (not kept)
        self._lock = threading.Lock()  # the run's thread and its idle watchdog share it

    def ledger(self) -> Ledger:
        return Ledger(self.url)  # the engine is cached: opening again is cheap

    def send(self, op: str, **kwargs: Any) -> bool:
        """Record `op` now, or spool it; True when it is on the books. Never raises for
        the ledger: a run must not stop for its books."""
        if op not in OPS:
            raise ValueError(op)
        kwargs.setdefault("at", now())
        with self._locked():
            if self._flush():
                try:
                    getattr(self.ledger(), op)(**kwargs)
                    return True
                except Exception as e:
                    if self._refused(e, f"{op} of {kwargs.get('run_id', '?')}"):
                        return False  # dropped, with a note
            self._append({"op": op, **kwargs})  # the ledger is down: it waits
        return False

    def pending(self) -> int:
        if not self.spool.exists():
            return 0
        return sum(1 for ln in self.spool.read_text(encoding="utf-8").splitlines() if ln)

    def flush(self) -> bool:
        """Send what waits in the spool; True when nothing waits any more."""
        with self._locked():
            self.down_at = -float("inf")  # asked for: try now
            return self._flush()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer of the spool at a time: threads of this process, and other processes
        (`frugal costs sync` while the run appends)."""
        with self._lock:
            self.spool.parent.mkdir(parents=True, exist_ok=True)
            with open(f"{self.spool}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield

    def _flush(self) -> bool:
        if not self.spool.exists():
            return True
        if self.down is not None and time.monotonic() - self.down_at < self.retry_s:
            return False  # down a moment ago: do not wait on it again at every record
        lines = [ln for ln in self.spool.read_text(encoding="utf-8").splitlines() if ln.strip()]
        sent = 0
        for ln in lines:
            try:
                rec = json.loads(ln)
                op = rec.pop("op")
                for k in _TIMES:
                    if rec.get(k):
                        rec[k] = datetime.fromisoformat(rec[k])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                self.dropped.append(f"an unreadable line of {self.spool.name}")  # torn
                sent += 1
                continue
            try:
                getattr(self.ledger(), op)(**rec)
            except KeyError:  # an end whose start was lost: nothing to attach it to
                self.dropped.append(f"{op} of {rec.get('run_id', '?')}")
            except Exception as e:
                if not self._refused(e, f"{op} of {rec.get('run_id', '?')}"):
                    if sent:
                        write_text_atomic(self.spool, "".join(x + "\n" for x in lines[sent:]))
                    return False
            sent += 1
        self.spool.unlink(missing_ok=True)
        self.down = None
        return True

    def _refused(self, e: Exception, what: str) -> bool:
        """True when the ledger refused this record as it is (a constraint, a value too
        long): sending it again would not help, so it is dropped with a note. False when
        the ledger could not be reached (noted in `down`): the record waits."""
        if isinstance(e, SQLAlchemyError) and not isinstance(e, UNREACHABLE):
            self.dropped.append(f"{what} ({_why(e)})")
            return True
        if not isinstance(e, (FrugalError, SQLAlchemyError, OSError)):
            raise e
        self.down, self.down_at = _why(e), time.monotonic()
        return False

    def _append(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, default=_encode) + "\n"
        with open(self.spool, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():  # a line torn by a crash mid-append must not swallow this one
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())


@dataclass(frozen=True)
class Synced:
    spool: Path
    sent: int  # records now on the books
    left: int  # records still waiting (the ledger is down: `why`)
    why: str | None


def sync(dirs: list[Path], url: str | None = None) -> list[Synced]:
    """Send the spools waiting in `dirs` (run dirs, or dirs that hold them) to the ledger."""
    out = []
    for d in dirs:
        if not d.exists():
            raise FrugalError(f"{d} does not exist: give the run's output_dir (or a dir above it)")
        spools = [d] if d.is_file() else sorted(d.rglob(SPOOL_NAME))
        for path in spools:
            rec = Recorder(path, url)
            before = rec.pending()
            rec.flush()
            left = rec.pending()
            out.append(Synced(path, before - left, left, rec.down))
    return out


def _encode(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    raise TypeError(type(v).__name__)


def _why(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig or e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
