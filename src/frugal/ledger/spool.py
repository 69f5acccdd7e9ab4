"""Writing a run's records when the ledger may be down: nothing is lost.

`Recorder.send(op, **kwargs)` calls `Ledger.<op>(**kwargs)`. When the ledger cannot be
reached (a server down, a damaged file, a full disk), the record is appended to a spool
file beside the run (JSON lines, fsynced) and training goes on. At every later send the
spool goes first, in order, so the books see the run's records as they happened, with
their original times; `flush()` sends what waits (the next run in the same directory does
it, and so does `frugal costs sync DIR`). Each operation is safe to send twice (a crash
between sending and rewriting the spool): starts and heartbeats sent again are kept once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from frugal.errors import FrugalError
from frugal.files import write_text_atomic
from frugal.ledger.store import Ledger, now

OPS = ("start_run", "resume_run", "heartbeat", "end_run", "add_cost")
SPOOL_NAME = "ledger-spool.jsonl"
_TIMES = ("at", "period_end")
T = TypeVar("T")


def attempt(call: Callable[[Ledger], T], url: str | None = None) -> tuple[T | None, str | None]:
    """`call(Ledger(url))`, or (None, why) when the ledger cannot be reached: for records
    that must not hold up the command that makes them (a plan)."""
    try:
        return call(Ledger(url)), None
    except (FrugalError, SQLAlchemyError, OSError) as e:
        return None, _why(e)


class Recorder:
    def __init__(self, spool: Path, url: str | None = None) -> None:
        self.spool = spool
        self.url = url
        self.down: str | None = None  # why the last attempt failed; None while reachable
        self.dropped: list[str] = []  # spooled records the ledger refused (not kept)

    def ledger(self) -> Ledger:
        return Ledger(self.url)  # the engine is cached: opening again is cheap

    def send(self, op: str, **kwargs: Any) -> bool:
        """Record `op` now, or spool it; True when it is on the books."""
        if op not in OPS:
            raise ValueError(op)
        kwargs.setdefault("at", now())
        if self.flush():
            try:
                getattr(self.ledger(), op)(**kwargs)
                return True
            except IntegrityError as e:  # not the ledger being down: sending again won't help
                raise FrugalError(f"the ledger refused a {op} record: {_why(e)}") from None
            except (FrugalError, SQLAlchemyError, OSError) as e:
                self.down = _why(e)
        self._append({"op": op, **kwargs})
        return False

    def pending(self) -> int:
        if not self.spool.exists():
            return 0
        return sum(1 for ln in self.spool.read_text(encoding="utf-8").splitlines() if ln)

    def flush(self) -> bool:
        """Send what waits in the spool; True when nothing waits any more."""
        if not self.spool.exists():
            return True
        lines = [ln for ln in self.spool.read_text(encoding="utf-8").splitlines() if ln.strip()]
        sent = 0
        try:
            led = self.ledger()
            for ln in lines:
                try:
                    rec = json.loads(ln)
                except json.JSONDecodeError:  # a line torn by a crash mid-append
                    sent += 1
                    continue
                op = rec.pop("op")
                for k in _TIMES:
                    if rec.get(k):
                        rec[k] = datetime.fromisoformat(rec[k])
                try:
                    getattr(led, op)(**rec)
                except (KeyError, IntegrityError):  # e.g. a heartbeat whose start was lost
                    self.dropped.append(f"{op} of {rec.get('run_id', '?')}")
                sent += 1
        except (FrugalError, SQLAlchemyError, OSError) as e:
            self.down = _why(e)
            if sent:
                write_text_atomic(self.spool, "".join(ln + "\n" for ln in lines[sent:]))
            return False
        self.spool.unlink(missing_ok=True)
        self.down = None
        return True

    def _append(self, rec: dict[str, Any]) -> None:
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(rec, default=_encode) + "\n"
        with open(self.spool, "a", encoding="utf-8") as f:
            f.write(line)
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
