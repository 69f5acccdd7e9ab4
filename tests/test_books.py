"""Keeping the books: tags, what plan and train record, the spool while the ledger is down,
budgets with their alerts, the guardrail, stop budgets, max hours and the idle watchdog."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from conftest import free_port, make_cfg, run_error, run_json

from frugal.errors import FrugalError
from frugal.ledger import budgets as B
from frugal.ledger.notify import deliver
from frugal.ledger.spool import SPOOL_NAME, Recorder
from frugal.ledger.store import Ledger
from frugal.ledger.tags import Settings, resolve
from frugal.run import recipe

ROOT = Path(__file__).resolve().parents[1]
PLAN = {"provider": "runpod", "instance": "1x RTX 4090", "gpu": "RTX 4090", "gpus": 1,
        "spot": False, "price_per_hour_usd": 0.69, "est_hours": 2.0, "est_cost_usd": 10.0,
        "tokens_per_s": 3000.0, "peak_reserved_gib": 12.0}  # fmt: skip


@pytest.fixture
def books(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Ledger:
    """A fresh SQLite ledger that the command line and the recipe use."""
    url = f"sqlite:///{tmp_path / 'books.sqlite'}"
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    return Ledger(url)


# -- tags ---------------------------------------------------------------------------------------


def test_tags_come_from_settings_env_config_and_flags_later_ones_winning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text('[tags]\nteam = "nlp"\nproject = "from-file"\nenv = "dev"\n')
    monkeypatch.setenv("FRUGAL_SETTINGS", str(settings))
    monkeypatch.setenv("FRUGAL_TAGS", "project=from-env, cost_center=42")
    monkeypatch.setenv("FRUGAL_TAG_ENV", "staging")
    tags = resolve(["project=flag"], config={"env": "prod"}, model="m")
    assert tags == {"user": tags["user"], "model": "m", "team": "nlp", "project": "flag",
                    "env": "prod", "cost_center": "42"}  # fmt: skip
    assert tags["user"]


def test_a_missing_required_tag_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FrugalError, match=r"--tag project=NAME --tag team=NAME"):
        resolve([], settings=Settings(required=("project", "team"), source="X"))
    assert resolve([], settings=Settings(required=("project",)), required=False)
    with pytest.raises(FrugalError, match="write key=value"):
        resolve(["project"])
    with pytest.raises(FrugalError, match="tag name"):
        resolve(["bad key=1"])


def test_a_broken_settings_file_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = tmp_path / "settings.toml"
    bad.write_text("required_tags = [project\n")
    monkeypatch.setenv("FRUGAL_SETTINGS", str(bad))
    with pytest.raises(FrugalError, match="cannot read settings file"):
        resolve([])
    bad.write_text('required_tags = "project"\n')
    with pytest.raises(FrugalError, match="required_tags"):
        resolve([])


def test_train_without_a_required_tag_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    books: Ledger,
) -> None:  # fmt: skip
    monkeypatch.setenv("FRUGAL_REQUIRED_TAGS", "project,team")
    cfg = tmp_path / "c.yaml"
    make_cfg(tmp_path / "run").write(cfg)
    err = run_error(capsys, "train", str(cfg), "--tag", "project=a")
    assert "missing required tag team" in err and "--tag team=NAME" in err
    assert not (tmp_path / "run").exists() and books.runs() == []


# -- what plan and train record --------------------------------------------------------------


def test_plan_records_its_choice_and_hands_the_id_to_the_run_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, books: Ledger
) -> None:
    cfg = tmp_path / "f.yaml"
    out = run_json(capsys, "plan", "meta-llama/Llama-3.2-1B", "--tokens", "5M", "--json",
                   "--loss-chunks", "0", "--no-offload-activations",  # not the point here
                   "--tag", "project=chat", "--write", str(cfg))  # fmt: skip
    assert out["plan_id"] and out["tags"]["project"] == "chat"
    with books.session() as s:
        from frugal.ledger.schema import PlanRecord

        (p,) = s.query(PlanRecord).all()
        assert p.id == out["plan_id"] and p.est_cost_usd == out["recommendation"]["est_cost_usd"]
    assert books.tags("plan", str(p.id))["model"] == "meta-llama/Llama-3.2-1B"
    written = yaml.safe_load(cfg.read_text())
    assert written["plan"]["ledger_id"] == p.id and written["tags"] == {"project": "chat"}


def test_a_run_is_on_the_books_from_start_to_end(tmp_path: Path, books: Ledger) -> None:
    cfg = make_cfg(tmp_path / "run", "training.max_steps=3", "price_per_hour_usd=3.6",
                   "training.heartbeat_min=0.0001", "tags={project: chat}")  # fmt: skip
    s = recipe.train(cfg, quiet=True, tags=["team=nlp"])
    (run,) = books.runs()
    assert (run.outcome, run.step, run.dry_run, run.provider) == ("completed", 3, False, "local")
    assert run.price_per_hour_usd == 3.6 and run.gpu == "cpu"
    assert run.cost_usd == pytest.approx(s.actual.cost_usd) and run.tokens == s.actual.tokens
    assert run.actual["steps"] == 3 and run.actual["best_eval_loss"] == s.best_eval_loss
    assert run.config["training"]["max_steps"] == 3 and run.output_dir.endswith("run")
    tags = books.tags("run", run.id)
    assert tags["project"] == "chat" and tags["team"] == "nlp" and tags["user"]
    with books.session() as ses:
        from frugal.ledger.schema import Heartbeat

        beats = ses.query(Heartbeat).filter_by(run_id=run.id).order_by(Heartbeat.id).all()
    steps = [b.step for b in beats]  # a beat at each decision, at this cadence
    assert steps == sorted(steps) and set(steps) == {0, 1, 2, 3}
    # a dry run is recorded as one
    recipe.train(make_cfg(tmp_path / "run2"), quiet=True, dry_run=2)
    dry = [r for r in books.runs() if r.dry_run]
    assert len(dry) == 1 and dry[0].step == 2 and dry[0].outcome == "completed"


def test_a_resumed_run_carries_on_its_record(
    tmp_path: Path, books: Ledger, one_second_steps: recipe.Clock
) -> None:
    over = ("training.max_steps=4", "price_per_hour_usd=3600", "training.save_every_min=1000")
    clock = one_second_steps

    def stop_at_2(step: int, m: dict[str, float]) -> None:
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    a = recipe.train(make_cfg(tmp_path / "r", *over), quiet=True, on_step=stop_at_2, clock=clock)
    assert a.outcome == "preempted"
    (run,) = books.runs()
    assert run.outcome == "preempted" and run.cost_usd == pytest.approx(2.0)
    b = recipe.train(make_cfg(tmp_path / "r", *over), quiet=True, clock=clock)
    (again,) = books.runs()
    assert again.id == run.id and again.outcome == "completed" and again.step == 4
    assert again.cost_usd == pytest.approx(b.actual.cost_usd) and b.actual.cost_usd >= 4.0


def test_a_run_that_fails_is_ended_as_failed(tmp_path: Path, books: Ledger) -> None:
    def boom(step: int, m: dict[str, float]) -> None:
        raise RuntimeError("the data loader broke")

    with pytest.raises(RuntimeError):
        recipe.train(make_cfg(tmp_path / "r", "training.max_steps=3"), quiet=True, on_step=boom)
    (run,) = books.runs()
    assert run.outcome == "failed" and "data loader broke" in run.actual["reason"]


# -- the ledger down ---------------------------------------------------------------------------


def test_a_run_whose_ledger_is_down_finishes_and_its_records_arrive_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    down = f"postgresql+psycopg://frugal@127.0.0.1:{free_port()}/nothing"
    monkeypatch.setenv("FRUGAL_DB_URL", down)
    out = tmp_path / "run"
    s = recipe.train(make_cfg(out, "training.max_steps=3", "training.heartbeat_min=0.0001"),
                     quiet=True)  # fmt: skip
    assert s.outcome == "completed" and (out / "final").exists()
    assert "ledger unreachable" in capsys.readouterr().err
    spooled = [json.loads(ln) for ln in (out / SPOOL_NAME).read_text().splitlines()]
    assert [r["op"] for r in spooled][:2] == ["start_run", "heartbeat"]
    assert spooled[-1]["op"] == "end_run" and spooled[-1]["outcome"] == "completed"
    up = f"sqlite:///{tmp_path / 'up.sqlite'}"
    rec = Recorder(out / SPOOL_NAME, up)
    assert rec.flush() and not (out / SPOOL_NAME).exists()
    (run,) = Ledger(up).runs()
    assert run.outcome == "completed" and run.step == 3
    assert run.started_at.isoformat()[:19] == spooled[0]["at"][:19]  # its own time, not now's
    # sent twice (a crash between sending and clearing the spool): kept once
    (out / SPOOL_NAME).write_text("".join(json.dumps(r) + "\n" for r in spooled))
    assert Recorder(out / SPOOL_NAME, up).flush()
    with Ledger(up).session() as ses:
        from frugal.ledger.schema import Heartbeat

        n = ses.query(Heartbeat).count()
    assert n == sum(r["op"] == "heartbeat" for r in spooled) and len(Ledger(up).runs()) == 1


# -- budgets and alerts ------------------------------------------------------------------------


def test_alerts_fire_once_each_and_in_order(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    B.set_budget(led, "nlp", 100.0, "month", {"team": "nlp"}, (50, 75, 90, 100))
    B.set_budget(led, "other", 1.0, "week", {"team": "vision"})
    fired: list[float] = []

    def spend(usd: float) -> list[float]:
        led.add_cost(usd, "notebook", tags={"team": "nlp"})
        got = [e.threshold_pct for e in B.check_alerts(led, {"team": "nlp"})]
        fired.extend(got)
        return got

    assert spend(40) == []
    assert spend(20) == [50.0]
    assert B.check_alerts(led) == []  # seen again: not again
    assert spend(35) == [75.0, 90.0]  # crossed together: in order
    assert spend(10) == [100.0]
    assert fired == [50, 75, 90, 100]
    assert [a.threshold for _, a in B.alerts(led)] == [50, 75, 90, 100]
    (st,) = [s for s in B.statuses(led) if s.budget.name == "nlp"]
    assert st.spent_usd == pytest.approx(105) and st.left_usd == pytest.approx(-5)


def test_an_alert_seen_by_many_writers_at_once_fires_once(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    B.set_budget(led, "all", 10.0, "total", {})
    led.add_cost(11.0, "storage")
    results: list[list[B.AlertEvent]] = []
    threads = [threading.Thread(target=lambda: results.append(B.check_alerts(Ledger(ledger_url))))
               for _ in range(6)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fired = sorted(e.threshold_pct for r in results for e in r)
    assert fired == [50, 75, 90, 100]


def test_budget_commands(capsys: pytest.CaptureFixture[str], books: Ledger) -> None:
    from conftest import main

    assert main(["budget", "set", "nlp", "--amount", "500", "--scope", "team=nlp",
                 "--action", "stop", "--thresholds", "80,100"]) == 0  # fmt: skip
    books.add_cost(100.0, "notebook", tags={"team": "nlp"})
    capsys.readouterr()
    (b,) = run_json(capsys, "budget", "list", "--json")["budgets"]
    assert (b["name"], b["action"], b["thresholds_pct"], b["spent_usd"], b["left_usd"]) == (
        "nlp", "stop", [80.0, 100.0], 100.0, 400.0)  # fmt: skip
    assert "--period" in run_error(capsys, "budget", "set", "x", "--amount", "5", "--period", "y")
    assert "--thresholds" in run_error(capsys, "budget", "set", "x", "--amount", "5",
                                       "--thresholds", "half")  # fmt: skip
    assert "no budget named 'x'" in run_error(capsys, "budget", "rm", "x")
    assert main(["budget", "rm", "nlp"]) == 0
    capsys.readouterr()
    assert run_json(capsys, "budget", "list", "--json") == {"budgets": []}


class _Hook(BaseHTTPRequestHandler):
    got: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.got.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    _Hook.got = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/SECRET-TOKEN"
    server.shutdown()


def test_alerts_reach_a_webhook_and_a_mailbox(
    monkeypatch: pytest.MonkeyPatch, books: Ledger, webhook: str
) -> None:
    from aiosmtpd.controller import Controller

    mails: list[Any] = []

    class Box:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            mails.append(envelope)
            return "250 OK"

    smtp = Controller(Box(), hostname="127.0.0.1", port=free_port())
    smtp.start()
    try:
        monkeypatch.setenv("FRUGAL_ALERT_WEBHOOK", webhook)
        monkeypatch.setenv("FRUGAL_SMTP_HOST", "127.0.0.1")
        monkeypatch.setenv("FRUGAL_SMTP_PORT", str(smtp.port))
        monkeypatch.setenv("FRUGAL_SMTP_STARTTLS", "0")
        monkeypatch.setenv("FRUGAL_ALERT_EMAIL_TO", "lead@example.com")
        B.set_budget(books, "nlp", 10.0, "month", {}, (50, 100))
        books.add_cost(12.0, "notebook")
        events = B.check_alerts(books)
        assert deliver(events) == []
    finally:
        smtp.stop()
    assert [h["alert"]["threshold_pct"] for h in _Hook.got] == [50, 100]
    assert "budget nlp" in _Hook.got[0]["text"]
    (mail,) = mails
    text = mail.content.decode()
    assert "budget alert: nlp at 50% (+1 more)" in text and "100% reached" in text
    assert mail.rcpt_tos == ["lead@example.com"]


def test_a_failed_delivery_is_reported_without_its_secret(
    monkeypatch: pytest.MonkeyPatch, books: Ledger
) -> None:
    monkeypatch.setenv("FRUGAL_ALERT_WEBHOOK", f"http://127.0.0.1:{free_port()}/SECRET")
    B.set_budget(books, "b", 1.0, "total", {})
    books.add_cost(2.0, "x")
    (problem,) = deliver(B.check_alerts(books))
    assert "alert webhook http://127.0.0.1 failed" in problem and "SECRET" not in problem


# -- what budgets allow a run --------------------------------------------------------------------


def test_the_guardrail_refuses_a_plan_that_would_overspend(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, books: Ledger
) -> None:
    B.set_budget(books, "chat", 25.0, "month", {"project": "chat"})
    books.add_cost(20.0, "notebook", tags={"project": "chat"})
    cfg = tmp_path / "c.yaml"
    make_cfg(tmp_path / "run", "training.max_steps=2", f"plan={json.dumps(PLAN)}",
             "tags={project: chat}").write(cfg)  # fmt: skip
    err = run_error(capsys, "train", str(cfg))
    assert "budget chat has $5.00 left" in err and "$10.00" in err and "--force" in err
    assert not (tmp_path / "run").exists() and books.runs() == []
    # another project's run is not in the budget's scope
    assert main_ok(["train", str(cfg), "--quiet", "--tag", "project=other",
                    "--output-dir", str(tmp_path / "other")])  # fmt: skip
    rc = main_ok(["train", str(cfg), "--quiet", "--force"])
    assert rc and "started under --force" in capsys.readouterr().err


def main_ok(argv: list[str]) -> bool:
    from conftest import main

    return main(argv) == 0


def test_a_stop_budget_stops_the_run_before_it_is_crossed(
    tmp_path: Path, books: Ledger, one_second_steps: recipe.Clock
) -> None:
    clock = one_second_steps
    B.set_budget(books, "cap", 5.5, "total", {"project": "p"}, action="stop")
    # $1 a second, a heartbeat at every decision: the run may spend what is left
    cfg = make_cfg(tmp_path / "r", "data.epochs=50", "price_per_hour_usd=3600",
                   "training.heartbeat_min=0.001", "tags={project: p}")  # fmt: skip
    s = recipe.train(cfg, quiet=True, clock=clock)
    assert s.outcome == "budget-stopped" and "stop budget cap" in s.reason
    assert s.steps == 5 and s.actual.cost_usd == pytest.approx(5.0)
    (st,) = B.statuses(books)
    assert st.spent_usd <= 5.5 and (tmp_path / "r" / "final").exists()


def test_max_hours_stops_cleanly(tmp_path: Path, one_second_steps: recipe.Clock) -> None:
    clock = one_second_steps
    cfg = make_cfg(tmp_path / "r", "data.epochs=50", f"training.max_hours={2.5 / 3600}")
    s = recipe.train(cfg, quiet=True, clock=clock)
    assert s.outcome == "budget-stopped" and "max_hours" in s.reason and s.steps == 2


def test_an_idle_run_stops_with_a_checkpoint(
    tmp_path: Path, books: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from frugal.run.books import Watchdog

    dogs: list[Watchdog] = []
    enter = Watchdog.__enter__
    monkeypatch.setattr(Watchdog, "__enter__", lambda self: dogs.append(self) or enter(self))

    def stall(step: int, m: dict[str, float]) -> None:
        if step == 2:  # step 2 runs until the watchdog calls it idle (4 s), then returns:
            deadline = time.monotonic() + 30  # a hang (8 s) would exit the process
            while not dogs[-1].idle and time.monotonic() < deadline:
                time.sleep(0.05)

    cfg = make_cfg(tmp_path / "r", "data.epochs=20", "training.idle_stop_min=4s")
    s = recipe.train(cfg, quiet=True, on_step=stall)
    assert s.outcome == "idle-stopped" and s.resumable and s.steps == 2
    assert (tmp_path / "r" / "checkpoints").exists()
    (run,) = books.runs()
    assert run.outcome == "idle-stopped"


HUNG = """
import sys, time
from conftest import make_cfg
from pathlib import Path
from frugal.run import recipe
cfg = make_cfg(Path(sys.argv[1]), "data.epochs=20", "training.idle_stop_min=3s")
recipe.train(cfg, quiet=True, on_step=lambda step, m: step == 2 and time.sleep(3600))
"""


@pytest.mark.slow
def test_a_hung_run_is_ended_on_the_books_and_exits_resumable(
    tmp_path: Path, books: Ledger
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run([sys.executable, "-c", HUNG, str(tmp_path / "r")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 75, done.stderr[-2000:]
    (run,) = books.runs()
    assert run.outcome == "idle-stopped" and "hung" in run.actual["reason"]


STALLS = """
import sys, time
from conftest import make_cfg
from pathlib import Path
from frugal.run import recipe
cfg = make_cfg(Path(sys.argv[1]), "data.epochs=50", "price_per_hour_usd=1800",
               "training.heartbeat_min=2s", "training.save_every_min=1e-6", *sys.argv[2:])
# the second step stalls for a minute (a loaded host, a hung exchange): $30 by the clock
recipe.train(cfg, quiet=True, on_step=lambda step, m: step == 2 and time.sleep(60))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "limit", ["budget_usd=10", "tags={project: stall}"], ids=["own-budget", "stop-budget"]
)
def test_a_stalled_step_does_not_spend_past_the_budget(
    tmp_path: Path, books: Ledger, limit: str
) -> None:
    """A step that stalls spends by the hour all the same; the guards between steps never
    see it. The money guard watches the clock: the run is stopped, resumable, within its
    $10 (its own budget, or a stop budget of its scope), to the cent, with nothing lost of
    its last checkpoint."""
    B.set_budget(books, "stall", 10.0, "total", {"project": "stall"}, action="stop")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STALLS, str(tmp_path / "r"), limit], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 75, done.stderr[-2000:]
    assert time.monotonic() - t0 < 45  # stopped, not waited out
    (run,) = books.runs()
    assert run.outcome == "budget-stopped" and "stopped at once" in run.actual["reason"]
    assert 5.0 < run.cost_usd <= 10.0  # $0.50 a second: held to the cent
    assert "budget:" in done.stderr and "is kept" in done.stderr
    from frugal.run import checkpoint as ckpt

    kept = ckpt.latest(tmp_path / "r" / "checkpoints")
    assert kept is not None and ckpt.damage(kept) is None


@pytest.mark.slow
def test_a_stop_budget_shared_by_two_concurrent_runs_stops_the_second_in_time(
    tmp_path: Path, ledger_url: str
) -> None:
    led = Ledger(ledger_url)
    B.set_budget(led, "shared", 24.0, "total", {"project": "shared"}, action="stop")
    env = {**os.environ, "FRUGAL_DB_URL": ledger_url, "OMP_NUM_THREADS": "1"}  # a core each
    procs = []
    for name in ("first", "second"):
        cfg = tmp_path / f"{name}.yaml"
        # $0.50 a second each, a heartbeat every 2 s, a checkpoint every 3 s (its time is
        # measured: the guard keeps the cost of the last one and the export in hand)
        make_cfg(tmp_path / name, "data.epochs=200", "price_per_hour_usd=1800",
                 "training.heartbeat_min=2s", "training.save_every_min=3s",
                 "tags={project: shared}").write(cfg)  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-m", "frugal.cli.main", "train",
                                       str(cfg), "--quiet", "--json"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
        deadline = time.monotonic() + 60
        while not led.runs() or (name == "second" and len(led.runs()) < 2):
            assert time.monotonic() < deadline, "the run never reached the books"
            time.sleep(0.2)
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    # the first to ask takes the last dollars: here the clocks of a loaded machine decide
    # which, so only the shared money is checked
    first, second = sorted(led.runs(), key=lambda r: r.started_at)
    assert first.outcome == second.outcome == "budget-stopped"
    assert first.cost_usd + second.cost_usd <= 24.0
    assert first.cost_usd + second.cost_usd > 20.0  # and most of the money was used


def test_a_budget_counts_the_spend_a_report_shows(ledger_url: str) -> None:
    """Budgets and reports add the same money: runs by their start, costs not matched to
    a run by their date (a matched cost is in its run's dollars)."""
    from frugal.ledger.report import report

    led = Ledger(ledger_url)
    for project, usd in (("a", 3.0), ("a", 4.5), ("b", 100.0)):
        rid = led.start_run(model="m", method="lora", config={}, price_per_hour_usd=1.0,
                            tags={"project": project})  # fmt: skip
        led.end_run(rid, "completed", {}, step=1, tokens=1e6, cost_usd=usd, hours=usd)
    led.add_cost(2.0, "storage", tags={"project": "a"})
    led.add_cost(50.0, "compute", tags={"project": "a"}, run_id=rid)  # matched: not again
    B.set_budget(led, "a", 1000.0, "month", {"project": "a"})
    (st,) = B.statuses(led)
    (group,) = [g for g in report(led, by="project", period="this-month").groups if g.name == "a"]
    assert st.spent_usd == pytest.approx(group.spend_usd) == pytest.approx(9.5)


# -- what the review of the books found --------------------------------------------------------


def test_a_stop_budget_counts_a_run_in_the_period_it_started(ledger_url: str) -> None:
    from datetime import UTC, datetime

    led = Ledger(ledger_url)
    B.set_budget(led, "m", 100.0, "month", {"team": "t"}, action="stop")
    jan31 = datetime(2026, 1, 31, 23, 0, tzinfo=UTC)
    rid = led.start_run(model="m", method="lora", config={}, price_per_hour_usd=1.0,
                        tags={"team": "t"}, at=jan31)  # fmt: skip
    led.heartbeat(rid, 10, 1e6, 95.0, at=jan31)
    feb1 = datetime(2026, 2, 1, 1, 0, tzinfo=UTC)
    got = B.reserve(led, rid, {"team": "t"}, 95.0, 60.0, 60.0, at=feb1)
    assert got is not None and got.usd == pytest.approx(5.0)  # January's money, not February's


def test_what_a_run_reserved_of_a_stop_budget_no_other_run_is_given(ledger_url: str) -> None:
    """A run reserves what it will spend until it asks again, and the books keep it: the
    next asker gets what is left beside it; a run on the books that has reserved nothing
    yet holds its price since its heartbeat and an interval; one silent for long, nothing."""
    from datetime import UTC, datetime, timedelta

    led = Ledger(ledger_url)
    B.set_budget(led, "s", 100.0, "total", {"team": "t"}, action="stop")
    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    a, b, c, dead = (led.start_run(model="m", method="lora", config={},
                                   price_per_hour_usd=3600.0, tags={"team": "t"}, at=at)
                     for at in (t0, t0, t0, t0 - timedelta(hours=2)))  # fmt: skip
    led.heartbeat(dead, 1, 1.0, 1.0, at=t0 - timedelta(hours=1))
    for rid, usd in ((a, 10.0), (b, 20.0), (c, 5.0)):
        led.heartbeat(rid, 1, 1.0, usd, at=t0 + timedelta(seconds=10))
    at = t0 + timedelta(seconds=12)
    got_a = B.reserve(led, a, {"team": "t"}, 10.0, 30.0, 5.0, at=at)
    assert got_a is not None and (got_a.usd, got_a.budget) == (30.0, "s")
    # $100 - $36 on the books - a's $30 - c's $1/s for 2 s since its heartbeat and 5 s
    got_b = B.reserve(led, b, {"team": "t"}, 20.0, 50.0, 5.0, at=at)
    assert got_b is not None and got_b.usd == got_b.left_usd == pytest.approx(100 - 36 - 30 - 7)
    assert led.run(b).reserved_usd == pytest.approx(20.0 + got_b.usd)  # type: ignore[union-attr]
    got_c = B.reserve(led, c, {"team": "t"}, 5.0, 50.0, 5.0, at=at)  # what it was held to
    assert got_c is not None and got_c.usd == got_c.left_usd == pytest.approx(7.0)
    again = B.reserve(led, b, {"team": "t"}, 20.0, 50.0, 5.0, at=at)  # b's own is b's again
    assert again is not None and again.usd == pytest.approx(got_b.usd)
    assert B.reserve(led, a, {"other": "scope"}, 10.0, 30.0, 5.0, at=at) is None


@pytest.mark.parametrize("seed", range(4))
def test_runs_sharing_a_stop_budget_are_never_allowed_more_than_it_however_late_they_beat(
    ledger_url: str, seed: int
) -> None:
    """Two runs at $1/s share a $100 stop budget, each heartbeat due every 5 s but coming
    up to 20 s late (slow steps on a loaded machine); each run spends only what it has
    reserved, asks again when that runs out, and stops when nothing is left for a step.
    Together they spend most of the money and never more (the previous rule, which only
    projected the other runs' spending until their next heartbeat, let them reach $106.59
    in such a schedule)."""
    import random
    from datetime import UTC, datetime, timedelta

    rnd = random.Random(seed)
    led = Ledger(ledger_url)
    B.set_budget(led, "s", 100.0, "total", {"team": "t"}, action="stop")
    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    runs = {led.start_run(model="m", method="lora", config={}, price_per_hour_usd=3600.0,
                          tags={"team": "t"}, at=t0 + timedelta(seconds=i)): {
                "spent": 0.0, "cap": 0.0, "beat": -1e9, "late": 0.0, "stopped": False}
            for i in range(2)}  # fmt: skip
    t = 2.0
    while not all(r["stopped"] for r in runs.values()):
        assert t < 1000, "the runs never stopped"
        dt = rnd.uniform(0.2, 2.0)  # the next step: at most its reservation is spent
        t += dt
        for rid, r in runs.items():
            if r["stopped"]:
                continue
            if r["spent"] + 1.0 > r["cap"] or t - r["beat"] >= 5.0 + r["late"]:
                r["beat"], r["late"] = t, rnd.choice([0, 0, 0, 8, 20])
                at = t0 + timedelta(seconds=t)
                led.heartbeat(rid, 1, 1.0, r["spent"], at=at)
                got = B.reserve(led, rid, {"team": "t"}, r["spent"], 7.0, 5.0, at=at)
                assert got is not None
                r["cap"] = r["spent"] + got.usd
            if r["spent"] + 1.0 > r["cap"]:  # not a step's worth left: the guard stops it
                r["stopped"] = True
                continue
            r["spent"] += min(dt, r["cap"] - r["spent"])
    total = sum(r["spent"] for r in runs.values())
    assert 95.0 < total <= 100.0


def test_a_run_asks_again_when_its_reservation_would_not_cover_its_next_step(
    tmp_path: Path, books: Ledger
) -> None:
    """Between heartbeats, a run whose next step would go past what it reserved asks the
    books again at once (its steps are slower than its interval planned); while the
    ledger is down it cannot, and goes on to what the budget had left."""
    from frugal.run.books import RunBooks
    from frugal.run.predict import Prediction

    B.set_budget(books, "s", 100.0, "total", {"project": "p"}, action="stop")
    cfg = make_cfg(tmp_path / "r", "price_per_hour_usd=3600", "training.heartbeat_min=1")
    rb = RunBooks(cfg, {"project": "p"}, tmp_path / "r", False, lambda _: None)
    rb.start(Prediction(), None)
    rb.beat(0.0, 1, 1.0, 10.0, lag_s=5.0, usd_per_s=1.0)  # $1/s: 60 s and 5 s reserved
    assert rb.cap is not None and rb.cap.limit_usd == pytest.approx(100.0, abs=0.1)
    assert rb.cap.usd == pytest.approx(75.0, abs=0.1)
    assert books.run(rb.run_id).reserved_usd == pytest.approx(rb.cap.usd)  # type: ignore[union-attr]
    assert not rb.due(30.0, 70.0)  # the next step's end is within the reservation
    assert rb.due(30.0, 76.0)  # it is not: ask again now, not at 60 s
    rb.recorder.down = "refused"
    assert not rb.due(30.0, 76.0)  # the ledger is down: on to the limit, asked at 60 s
    assert rb.due(60.0, 0.0)


def test_the_guardrail_lets_a_run_resume_and_a_dry_run_measure(
    tmp_path: Path, books: Ledger
) -> None:
    from frugal.run.books import ID_FILE, preflight

    B.set_budget(books, "b", 20.0, "month", {"project": "p"})
    cfg = make_cfg(tmp_path / "r", f"plan={json.dumps(PLAN)}", "tags={project: p}")  # $10
    rid = books.start_run(model="m", method="lora", config={}, price_per_hour_usd=1.0,
                          tags={"project": "p"})  # fmt: skip
    books.end_run(rid, "preempted", {}, step=5, tokens=1.0, cost_usd=14.0, hours=1.0)
    with pytest.raises(FrugalError, match=r"has \$6\.00 left"):
        preflight(cfg, [], out=tmp_path / "new")  # a new run's $10 does not fit
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ID_FILE).write_text(json.dumps({"run_id": rid}))
    assert preflight(cfg, [], out=tmp_path / "r").warnings == []  # $14 of it is spent
    assert preflight(cfg, [], out=tmp_path / "d", dry_run=True).warnings == []


def test_the_watchdog_does_not_watch_what_is_not_a_step() -> None:
    from frugal.run.books import Watchdog

    def hung() -> None:
        raise AssertionError("a checkpoint or an export was taken for a hang")

    with Watchdog(0.2, hung) as dog:
        dog.watch(False)  # an evaluation, a checkpoint, the final export
        time.sleep(0.7)
        assert not dog.idle
        dog.watch(True)  # a step
        time.sleep(0.3)  # the first step of a session has twice as long
        assert not dog.idle
        dog.touch()
        time.sleep(0.3)
        assert dog.idle


def test_a_torn_spool_line_does_not_swallow_the_next_record(tmp_path: Path) -> None:
    spool = tmp_path / SPOOL_NAME
    start = {"op": "start_run", "run_id": "r", "model": "m", "method": "lora", "config": {},
             "price_per_hour_usd": 1.0, "at": "2026-05-01T00:00:00+00:00"}  # fmt: skip
    spool.write_text(json.dumps(start) + '\n{"op": "heartbeat", "run_id": "r", "st')  # torn
    down = Recorder(spool, f"postgresql+psycopg://x@127.0.0.1:{free_port()}/none")
    assert not down.send("heartbeat", run_id="r", step=2, tokens=5.0, cost_usd=0.5)
    up = f"sqlite:///{tmp_path / 'up.sqlite'}"
    rec = Recorder(spool, up)
    assert rec.flush() and rec.dropped == [f"an unreadable line of {SPOOL_NAME}"]
    (run,) = Ledger(up).runs()
    assert (run.step, run.cost_usd) == (2, 0.5)


def test_a_record_the_ledger_refuses_is_dropped_not_blocking(ledger_url: str,
                                                            tmp_path: Path) -> None:  # fmt: skip
    rec = Recorder(tmp_path / SPOOL_NAME, ledger_url)
    assert not rec.send("heartbeat", run_id="never-started", step=1, tokens=1.0, cost_usd=1.0)
    assert rec.dropped and rec.down is None and not (tmp_path / SPOOL_NAME).exists()
    assert rec.send(
        "start_run",
        run_id="r",
        model="m",
        method="lora",
        config={},
        price_per_hour_usd=1.0,
        plan_id=12345,
    )  # a plan of another ledger
    (run,) = Ledger(ledger_url).runs()
    assert run.plan_id is None


def test_a_bad_mail_setting_is_a_line_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, books: Ledger
) -> None:
    monkeypatch.setenv("FRUGAL_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("FRUGAL_SMTP_PORT", "smtp")
    monkeypatch.setenv("FRUGAL_ALERT_EMAIL_TO", "lead@example.com")
    B.set_budget(books, "b", 1.0, "total", {})
    books.add_cost(2.0, "x")
    (problem,) = deliver(B.check_alerts(books))
    assert problem.startswith("alert e-mail via 127.0.0.1 failed")


def test_costs_add_fires_the_alerts_it_crosses(
    capsys: pytest.CaptureFixture[str], books: Ledger
) -> None:
    from conftest import main

    B.set_budget(books, "nlp", 10.0, "month", {"team": "nlp"}, (50,))
    assert main(["costs", "add", "6", "--tag", "team=nlp"]) == 0
    assert "budget nlp (team=nlp): 50% reached" in capsys.readouterr().err
    assert main(["costs", "add", "1", "--tag", "team=nlp"]) == 0
    assert "budget alert" not in capsys.readouterr().err  # once
