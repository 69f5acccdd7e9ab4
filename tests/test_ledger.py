"""The ledger's storage, on SQLite and on a real PostgreSQL server the tests start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from conftest import run_error
from sqlalchemy import create_engine, func, inspect, select, text

from frugal.errors import FrugalError
from frugal.ledger import db
from frugal.ledger.schema import Base, Heartbeat, RunRecord
from frugal.ledger.store import Ledger

PLAN = {"method": "qlora", "provider": "runpod", "instance": "1x RTX 4090", "region": "",
        "gpu": "RTX 4090", "gpus": 1, "spot": True, "price_per_hour_usd": 0.34,
        "est_hours": 2.5, "est_cost_usd": 0.85}  # fmt: skip


def test_the_migrations_make_the_schema_the_code_uses(ledger_url: str) -> None:
    eng = db.engine(ledger_url)
    with eng.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == db.HEAD
    heads = ScriptDirectory(str(Path(db.__file__).parent / "migrations")).get_heads()
    assert heads == [db.HEAD]
    db.migrate(eng)  # again: a no-op


def test_a_run_from_plan_to_end(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    plan_id = led.record_plan(PLAN, "meta-llama/Llama-3.1-8B", 2e7, {"project": "demo"})
    tags = {"project": "demo", "team": "nlp"}
    rid = led.start_run(model="meta-llama/Llama-3.1-8B", method="qlora", config={"a": 1},
                        price_per_hour_usd=0.34, gpu="RTX 4090", spot=True, plan_id=plan_id,
                        predicted={"hours": 2.5}, tags=tags)  # fmt: skip
    led.heartbeat(rid, step=10, tokens=1e5, cost_usd=0.05)
    led.end_run(rid, "completed", {"hours": 2.4}, step=20, tokens=2e5, cost_usd=0.82, hours=2.4)
    led.add_cost(3.5, "storage", "checkpoint bucket", tags={"project": "demo"})
    (run,) = led.runs()
    assert (run.outcome, run.step, run.plan_id, run.price_per_hour_usd) == (
        "completed", 20, plan_id, 0.34)  # fmt: skip
    assert run.predicted == {"hours": 2.5} and run.actual == {"hours": 2.4}
    assert led.tags("run", rid) == {"project": "demo", "team": "nlp"}
    assert led.total_cost() == pytest.approx(0.82 + 3.5)


WRITER = """
import sys
from frugal.ledger.store import Ledger
led = Ledger(sys.argv[1])
rid = led.start_run(model="m", method="lora", config={}, price_per_hour_usd=1.0,
                    run_id=sys.argv[2])
print("started", flush=True)
for step in range(1, int(sys.argv[3]) + 1):
    led.heartbeat(rid, step=step, tokens=step * 100.0, cost_usd=step / 1000)
"""


@pytest.mark.slow
def test_eight_writers_at_once_lose_nothing(ledger_url: str) -> None:
    n, each = 8, 300
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, ledger_url, f"run-{i}", str(each)])
             for i in range(n)]  # fmt: skip
    assert all(p.wait(timeout=600) == 0 for p in procs)
    led = Ledger(ledger_url)
    with led.session() as s:
        assert s.scalar(select(func.count()).select_from(Heartbeat)) == n * each
        steps = s.scalars(select(RunRecord.step)).all()
    assert sorted(steps) == [each] * n


def test_a_ledger_found_half_migrated_by_another_process_is_waited_for(tmp_path: Path) -> None:
    """SQLite commits each table as a migration makes it: a process opening a fresh ledger
    while another migrates it sees frugal's tables and no revision yet. It waits for the
    migration's lock and looks again, instead of calling them another application's
    (eight writers starting at once on a new ledger hit this under load)."""
    import fcntl

    path = tmp_path / "ledger.sqlite"
    url = f"sqlite:///{path}"
    made = subprocess.run([sys.executable, "-c", OPEN, url], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    raw = create_engine(url)
    with raw.begin() as conn:  # the state midway: every table, the revision not yet stamped
        head = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        conn.execute(text("DELETE FROM alembic_version"))
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other process, migrating
        opener = subprocess.Popen([sys.executable, "-c", OPEN, url], stderr=subprocess.PIPE,
                                  text=True)  # fmt: skip
        time.sleep(3)
        assert opener.poll() is None  # waiting, not refusing
        with raw.begin() as conn:  # the migration ends: the revision stamped
            conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": head})
    _, err = opener.communicate(timeout=60)
    assert opener.returncode == 0, err
    # with nobody migrating, tables without a frugal revision are still refused
    with raw.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
    raw.dispose()
    refused = subprocess.run([sys.executable, "-c", OPEN, url], capture_output=True, text=True)
    assert refused.returncode != 0 and "another application's tables" in refused.stderr


OPEN = "import sys; from frugal.ledger.store import Ledger; Ledger(sys.argv[1])"


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_the_ledger_consistent(ledger_url: str) -> None:
    p = subprocess.Popen([sys.executable, "-c", WRITER, ledger_url, "killed", "100000"],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "started"
    time.sleep(1.0)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    led = Ledger(ledger_url)
    with led.session() as s:
        run = s.get(RunRecord, "killed")
        beats = s.scalar(select(func.max(Heartbeat.step)).where(Heartbeat.run_id == "killed"))
        count = s.scalar(select(func.count()).select_from(Heartbeat))
    assert run is not None and beats is not None and beats > 0
    assert run.step == beats == count  # each heartbeat and its run update, both or neither


def test_a_file_that_is_not_a_ledger_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"not a database at all\n" * 100)
    before = path.read_bytes()
    with pytest.raises(FrugalError, match="is not a SQLite database"):
        db.engine(f"sqlite:///{path}")
    assert path.read_bytes() == before


def test_a_damaged_sqlite_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(f"sqlite:///{path}").add_cost(1.0, "other")
    db.open_engine.cache_clear()
    with create_engine(f"sqlite:///{path}").connect() as c:  # fold the WAL into the file
        c.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    raw = bytearray(path.read_bytes())
    raw[100:4096] = b"\xff" * (4096 - 100)  # the schema page, past the header
    path.write_bytes(bytes(raw))
    with pytest.raises(FrugalError, match="is damaged"):
        db.engine(f"sqlite:///{path}")
    assert path.read_bytes() == bytes(raw)


def test_a_ledger_damaged_past_its_schema_takes_no_new_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A page of costs damaged: `costs add` refuses to write where `costs report` would
    then fail, and the file stays as it was."""
    path = tmp_path / "ledger.sqlite"
    led = Ledger(f"sqlite:///{path}")
    for i in range(400):
        led.add_cost(1.0 + i, "other", description="x" * 200)
    db.open_engine.cache_clear()
    with create_engine(f"sqlite:///{path}").connect() as c:
        c.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    raw = bytearray(path.read_bytes())
    page = len(raw) // 4096 - 2  # a page of cost rows near the end
    raw[page * 4096 + 8 : page * 4096 + 4000] = b"\x5a" * (4000 - 8)
    path.write_bytes(bytes(raw))
    monkeypatch.setenv("FRUGAL_DB_URL", f"sqlite:///{path}")
    assert "is damaged" in run_error(capsys, "costs", "add", "5")
    assert path.read_bytes() == bytes(raw)


def test_another_applications_database_is_left_alone(ledger_url: str) -> None:
    eng = create_engine(ledger_url)
    with eng.begin() as c:  # an application with its own Alembic migrations
        c.execute(text("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)"))
        c.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        c.execute(text("INSERT INTO alembic_version VALUES ('9f1e2a')"))
    eng.dispose()
    path = Path(ledger_url.removeprefix("sqlite:///"))
    before = path.read_bytes() if ledger_url.startswith("sqlite") else b""
    with pytest.raises(FrugalError, match=r"another application's tables \(alembic_version, cust"):
        db.engine(ledger_url)
    if ledger_url.startswith("sqlite"):
        assert path.read_bytes() == before
    with create_engine(ledger_url).connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == "9f1e2a"
        assert not inspect(c).has_table("runs")


@pytest.mark.parametrize(
    ("tables", "version", "says"),
    [
        # another application whose Alembic revisions are numbered as frugal's are
        (("customers",), "0001", "another application's tables (alembic_version, customers)"),
        # frugal's tables at a revision past this frugal's: a newer frugal wrote it
        (("plans", "runs", "costs", "tags"), "0099", "written by a newer frugal (schema 0099"),
    ],
)
def test_a_ledger_not_this_frugals_is_left_alone(
    ledger_url: str, tables: tuple[str, ...], version: str, says: str
) -> None:
    eng = create_engine(ledger_url)
    with eng.begin() as c:
        for t in tables:
            c.execute(text(f"CREATE TABLE {t} (id INTEGER PRIMARY KEY)"))
        c.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        c.execute(text(f"INSERT INTO alembic_version VALUES ('{version}')"))
    eng.dispose()
    with pytest.raises(FrugalError, match=re.escape(says)):
        db.engine(ledger_url)
    with create_engine(ledger_url).connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == version


def test_every_migration_is_known_to_the_ledger() -> None:
    scripts = ScriptDirectory(str(Path(db.__file__).parent / "migrations"))
    assert sorted(r.revision for r in scripts.walk_revisions()) == list(db.REVISIONS)


def test_a_bad_url_is_one_line() -> None:
    with pytest.raises(FrugalError, match="is not a database URL"):
        db.engine("not a url")
