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
import sqlite3
from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from frugal.errors import FrugalError
from frugal.ledger.schema import Base
from frugal.paths import user_path

HEAD = "0004"  # the newest revision in migrations/versions (a test checks)
REVISIONS = ("0001", "0002", "0003", HEAD)  # every revision frugal's migrations have written
LEDGER_TABLES = ("plans", "runs", "costs", "tags", "alembic_version")  # since 0001
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another's transaction to end
SQLITE_HEADER = b"SQLite format 3\x00"


def ledger_url() -> str:
    """`FRUGAL_DB_URL`, else `ledger.sqlite` in frugal's data dir (`FRUGAL_DATA_DIR` or the
    user data directory)."""
    return os.environ.get("FRUGAL_DB_URL") or default_url()


def default_url() -> str:
    return f"sqlite:///{user_path('FRUGAL_DATA_DIR', 'data', '') / 'ledger.sqlite'}"


def existing(url: str, flag: str) -> None:
    """Refuse a SQLite ledger URL naming no file: a reader (the dashboard) would otherwise
    make an empty ledger there and show nothing."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # open_engine says so, in one line
    name = parsed.database
    file = parsed.get_backend_name() == "sqlite" and name and name != ":memory:"
    if file and not Path(str(name)).is_file():
        raise FrugalError(f"{flag} {url}: no ledger there ({name} does not exist)")


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
    # read-only, before the engine's first connection sets WAL mode (a write to the file)
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        ) as c:
            tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            row = (
                c.execute("SELECT version_num FROM alembic_version").fetchone()
                if "alembic_version" in tables
                else None
            )
            # a damaged ledger is refused before a write could bury the damage deeper
            found = [ln for r in c.execute("PRAGMA quick_check(20)") for ln in r[0].splitlines()]
            problems = [ln for ln in found if ln != "ok" and not ln.startswith("***")]
            check = (
                problems[0] + (f" and {len(problems) - 1} more" if problems[1:] else "")
                if problems
                else "ok"
            )
    except sqlite3.DatabaseError as e:
        check = str(e)
    if check != "ok":
        raise FrugalError(
            f"ledger {path} is damaged ({check}): move it aside and import a backup "
            "(frugal costs import), or point FRUGAL_DB_URL elsewhere; it was not changed"
        )
    if row is None and set(tables) <= {*Base.metadata.tables, "alembic_version"}:
        return  # frugal's own tables, unstamped: maybe another process's migration under
        # way, which `migrate` waits for and judges under its lock
    _check_ours(tables, row[0] if row else None, str(path))


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
        if url == default_url():  # frugal's own place: made on first use
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.parent.is_dir():
            raise FrugalError(
                f"the ledger's directory {path.parent} does not exist: create it, or fix "
                "FRUGAL_DB_URL (or --db)"
            )
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
    """Whether the schema is at the newest revision: one query, without loading Alembic.
    A database that holds another application's tables, and no frugal ledger, is refused
    before anything is written to it."""
    with eng.connect() as conn:  # a damaged schema fails here
        return _at_head(conn, eng)


def _at_head(conn: Any, eng: Engine) -> bool:
    found = inspect(conn).get_table_names()
    version = (
        conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        if "alembic_version" in found
        else None
    )
    _check_ours(found, version, eng.url.render_as_string(hide_password=True))
    return version == HEAD


def _check_ours(tables: list[str], version: str | None, where: str) -> None:
    """Refuse a database that holds tables and no frugal ledger (another application's,
    even one with Alembic revisions named like frugal's), and a ledger a newer frugal wrote
    (its schema is past this one's)."""
    if not tables:
        return
    frugal = set(LEDGER_TABLES) <= set(tables)
    if frugal and version in REVISIONS:
        return
    if frugal and version is not None:
        raise FrugalError(
            f"the ledger at {where} was written by a newer frugal (schema {version}, this one "
            f"knows up to {HEAD}): upgrade frugal (pip install -U frugal-ft); nothing was "
            "changed"
        )
    shown = ", ".join(sorted(tables)[:3]) + (", ..." if len(tables) > 3 else "")
    raise FrugalError(
        f"the database at {where} holds another application's tables ({shown}) and no "
        "frugal ledger: point FRUGAL_DB_URL at a new or frugal database (nothing was "
        "changed)"
    )


def migrate(eng: Engine) -> None:
    """Bring the schema to the newest revision (a no-op when it is there). Processes that
    open a fresh ledger at once migrate one after the other: a file lock beside a SQLite
    file, an advisory lock on PostgreSQL. A process that finds tables and no revision yet
    may be looking at another one's migration half done (SQLite commits each table as it is
    made): it is judged again under the lock, once that migration is over."""
    try:
        if at_head(eng):
            return
    except FrugalError:
        pass  # refused for good below, under the lock, if no migration was under way
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
            if _at_head(conn, eng):  # another process migrated it meanwhile
                return
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
