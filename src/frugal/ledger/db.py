"""Where the ledger lives and how it is opened.

`FRUGAL_DB_URL` (any SQLAlchemy URL: `postgresql+psycopg://...`, `sqlite:///path`), else
`ledger.sqlite` in the user data directory. SQLite runs in WAL mode with a busy timeout, so
concurrent writers (several runs, their heartbeats) wait for each other instead of failing.
Opening migrates the schema to the newest Alembic revision. A file that is not a SQLite
database, or fails SQLite's own check, is refused with one line and never written to.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from frugal.errors import FrugalError
from frugal.paths import user_path

HEAD = "0003"  # the newest revision in migrations/versions (a test checks)
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another's transaction to end
SQLITE_HEADER = b"SQLite format 3\x00"


def ledger_url() -> str:
    """`FRUGAL_DB_URL`, else `ledger.sqlite` in frugal's data dir (`FRUGAL_DATA_DIR` or the
    user data directory)."""
    url = os.environ.get("FRUGAL_DB_URL")
    return url or f"sqlite:///{user_path('FRUGAL_DATA_DIR', 'data', '') / 'ledger.sqlite'}"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = NORMAL")  # durable at each checkpoint of the WAL
    cur.execute("PRAGMA foreign_keys = ON")
    cur.close()


def _check_sqlite(path: Path) -> None:
    """Refuse a file that is not a SQLite database, before SQLite writes anything to it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_HEADER))
    if head != SQLITE_HEADER:
        raise FrugalError(
            f"ledger {path} is not a SQLite database (it was left untouched): move it "
            "aside and run again, or point FRUGAL_DB_URL at the right database"
        )


def engine(url: str | None = None) -> Engine:
    """The ledger's engine at `url` (default: `ledger_url()`, read each time), migrated to
    the newest schema; one per process and URL."""
    return open_engine(url or ledger_url())


@cache
def open_engine(url: str) -> Engine:
    """The engine at `url`, opened and migrated once per process."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise FrugalError(
            f"FRUGAL_DB_URL {url!r} is not a database URL, e.g. sqlite:///ledger.sqlite or "
            "postgresql+psycopg://host/db"
        ) from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and parsed.database and parsed.database != ":memory:":
        path = Path(parsed.database)
        _check_sqlite(path)
        path.parent.mkdir(parents=True, exist_ok=True)
    # a server that does not answer must not hold a run up: give up connecting after 10 s,
    # and any statement after 60 s (the run spools its records meanwhile)
    pg = parsed.get_backend_name() == "postgresql"
    args: dict[str, Any] = (
        {"connect_timeout": 10, "options": "-c statement_timeout=60000"} if pg else {}
    )
    eng = create_engine(url, pool_pre_ping=not sqlite, connect_args=args)
    if sqlite:
        event.listen(eng, "connect", _sqlite_pragmas)
    try:
        migrate(eng)
    except (DatabaseError, OperationalError) as e:
        eng.dispose()
        why = str(e.orig).splitlines()[0] if e.orig else type(e).__name__
        where = parsed.render_as_string(hide_password=True)
        raise FrugalError(
            f"cannot open the ledger at {where} ({why}): check FRUGAL_DB_URL, or move a "
            "damaged file aside (it was not changed)"
        ) from None
    return eng


def at_head(eng: Engine) -> bool:
    """Whether the schema is at the newest revision: one query, without loading Alembic."""
    with eng.connect() as conn:  # a damaged schema fails here
        if not inspect(conn).has_table("alembic_version"):
            return False
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD


def migrate(eng: Engine) -> None:
    """Bring the schema to the newest revision (a no-op when it is there). Processes that
    open a fresh ledger at once migrate one after the other: a file lock beside a SQLite
    file, an advisory lock on PostgreSQL."""
    if at_head(eng):
        return
    from alembic import command  # only when the schema changes: it takes a while to import
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    sqlite = eng.dialect.name == "sqlite"
    database = eng.url.database if sqlite else None
    lock_path = Path(f"{database}.lock") if database and database != ":memory:" else None
    with contextlib.ExitStack() as stack:
        if lock_path is not None:
            lock = stack.enter_context(open(lock_path, "w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        with eng.begin() as conn:
            if sqlite:
                conn.execute(text("PRAGMA quick_check"))  # a damaged file fails here
            else:
                conn.execute(text("SELECT pg_advisory_xact_lock(7340031)"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
