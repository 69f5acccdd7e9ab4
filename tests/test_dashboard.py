"""The dashboard's JSON API over a real ledger, its token, and the command that serves it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TINY, free_port, make_cfg, run_error, run_json

from frugal.ledger import budgets as B
from frugal.ledger.store import Ledger

pytest.importorskip("fastapi", reason="the dashboard extra: pip install '.[dashboard]'")
from fastapi.testclient import TestClient

from frugal.web.app import create_app, is_loopback


@pytest.fixture
def books(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:  # fmt: skip
    """A ledger with a recorded plan, two runs (one with its metrics on disk), a cost and a
    budget that has fired."""
    url = f"sqlite:///{tmp_path / 'books.sqlite'}"
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    plan = run_json(capsys, "plan", "meta-llama/Llama-3.2-1B", "--tokens", "5M", "--json",
                    "--tag", "project=chat")  # fmt: skip
    led = Ledger(url)
    out = tmp_path / "run-a"
    out.mkdir()
    (out / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i, "loss": 3 - i / 10, "tokens_per_s": 900.0 + i}) + "\n"
                for i in range(1, 6)) + '{"step": 6, "lo'  # a line being written
    )  # fmt: skip
    a = led.start_run(model="m", method="lora", config={}, price_per_hour_usd=2.0,
                      gpu="A100 80GB", plan_id=plan["plan_id"], output_dir=str(out),
                      predicted={"hours": 1.0, "cost_usd": 2.0}, tags={"project": "chat",
                      "team": "<b>nlp</b>"})  # fmt: skip
    led.heartbeat(a, 5, 5e4, 1.5)
    led.end_run(a, "completed", {"hours": 1.1, "cost_usd": 2.2, "tokens_per_s": 902.0}, step=5,
                tokens=5e4, cost_usd=2.2, hours=1.1)  # fmt: skip
    b = led.start_run(model="m", method="qlora", config={}, price_per_hour_usd=0.5,
                      gpu="RTX 4090", tags={"project": "vision"})  # fmt: skip
    led.heartbeat(b, 2, 1e4, 0.3)
    led.add_cost(5.0, "storage", tags={"project": "chat"})
    B.set_budget(led, "chat", 10.0, "month", {"project": "chat"}, (50, 100))
    B.check_alerts(led)
    return {"url": url, "plan": plan, "a": a, "b": b}


@pytest.fixture
def client(books: dict[str, Any]) -> TestClient:
    return TestClient(create_app(books["url"]))


def test_overview_holds_the_reports_figures(client: TestClient) -> None:
    got = client.get("/api/overview", params={"by": "project"}).json()
    groups = {g["group"]: g for g in got["report"]["groups"]}
    assert groups["chat"]["spend_usd"] == pytest.approx(2.2 + 5.0)
    assert groups["vision"]["runs_by_outcome"]["running"] == 1
    (budget,) = got["budgets"]
    assert (budget["name"], budget["spent_usd"]) == ("chat", pytest.approx(7.2))
    assert got["report"]["projection"] is not None
    bad = client.get("/api/overview", params={"period": "fortnight"})
    assert bad.status_code == 422 and "--period 'fortnight'" in bad.json()["detail"]


def test_runs_filter_and_show_predicted_beside_actual(client: TestClient,
                                                      books: dict[str, Any]) -> None:  # fmt: skip
    every = client.get("/api/runs").json()["runs"]
    assert [r["id"] for r in every] == [books["b"], books["a"]]  # newest first
    (a,) = client.get("/api/runs", params={"tag": "project=chat"}).json()["runs"]
    assert a["predicted"]["cost_usd"] == 2.0 and a["actual"]["cost_usd"] == 2.2
    assert a["tags"]["team"] == "<b>nlp</b>"  # as recorded: pages escape it
    assert [r["id"] for r in client.get("/api/runs", params={"outcome": "running"}).json()[
        "runs"]] == [books["b"]]  # fmt: skip
    assert client.get("/api/runs", params={"gpu": "H100 SXM"}).json()["runs"] == []
    assert client.get("/api/runs", params={"tag": "project"}).status_code == 422
    bad = client.get("/api/runs", params={"outcome": "finished"})  # not an outcome: say so
    assert bad.status_code == 422 and "use completed, preempted" in bad.json()["detail"]


def test_a_run_with_its_heartbeats_and_metrics(client: TestClient, books: dict[str, Any]) -> None:
    run = client.get(f"/api/runs/{books['a']}").json()
    assert [m["step"] for m in run["metrics"]] == [1, 2, 3, 4, 5]  # the torn line skipped
    assert run["heartbeats"][0]["cost_usd"] == 1.5 and run["plan_id"] == books["plan"]["plan_id"]
    assert run["budgets"][0]["name"] == "chat"
    missing = client.get("/api/runs/nope")
    assert missing.status_code == 404 and "no run 'nope'" in missing.json()["detail"]


def test_budgets_with_their_alerts_and_a_plan_with_its_frontier(
    client: TestClient, books: dict[str, Any]
) -> None:
    got = client.get("/api/budgets").json()
    assert [a["threshold_pct"] for a in got["alerts"]] == [50.0]
    plan = client.get(f"/api/plans/{books['plan']['plan_id']}").json()
    assert plan["plan"]["recommendation"] == books["plan"]["recommendation"]
    assert plan["plan"]["frontier"] and plan["tags"]["project"] == "chat"
    assert client.get("/api/plans/999").status_code == 404
    for past in (2**63, 10**30, 0, -1):  # past the database's integers: it was an HTTP 500
        got = client.get(f"/api/plans/{past}")
        assert got.status_code == 404 and got.json()["detail"] == f"no plan {past} on the books"


def test_the_api_docs_are_served_whole_without_the_network(client: TestClient) -> None:
    """FastAPI's docs page loads Swagger UI from a CDN: blank offline. frugal's names only
    its own URLs, and serves them."""
    import re

    page = client.get("/api/docs")
    assert page.status_code == 200 and "/api/openapi.json" in page.text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: *["']([^"']+)["']""", page.text)
    urls = [u for pair in urls for u in pair if u]
    assert urls and all(u.startswith("/") for u in urls), urls  # no http(s):// anywhere
    for u in urls:
        assert client.get(u).status_code == 200, u


def test_the_api_is_described_and_reads_only_but_to_plan(client: TestClient) -> None:
    paths = client.get("/api/openapi.json").json()["paths"]
    assert {"/api/overview", "/api/runs", "/api/runs/{run_id}", "/api/budgets",
            "/api/plans/{plan_id}", "/api/plans"} <= set(paths)  # fmt: skip
    writes = {(p, m) for p, ms in paths.items() for m in ms if m != "get"}
    assert writes == {("/api/plans", "post")}  # only a new plan changes the books


PLAN_ARGS = ("meta-llama/Llama-3.2-1B", "--tokens", "5M", "--methods", "lora,qlora",
             "--deadline", "2h", "--spot", "--tag", "project=chat")  # fmt: skip
PLAN_ASKED = {"model": "meta-llama/Llama-3.2-1B", "tokens": 5e6, "methods": ["lora", "qlora"],
              "deadline": "2h", "spot": True, "tag": ["project=chat"]}  # fmt: skip


def test_a_plan_asked_of_the_api_is_the_commands_plan_on_the_books(
    client: TestClient, books: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cli = run_json(capsys, "plan", *PLAN_ARGS, "--json")
    got = client.post("/api/plans", json=PLAN_ASKED)
    assert got.status_code == 200, got.text
    api = got.json()
    assert api["plan_id"] == cli["plan_id"] + 1  # recorded on the dashboard's books
    drop = ("plan_id", "prices")  # the prices' age is read at each call
    assert {k: v for k, v in api.items() if k not in drop} == {
        k: v for k, v in cli.items() if k not in drop
    }
    kept = client.get(f"/api/plans/{api['plan_id']}").json()
    assert kept["plan"]["recommendation"] == api["recommendation"]
    assert kept["tags"]["project"] == "chat"


def test_plans_asked_at_once_are_made_one_after_the_other(client: TestClient) -> None:
    """FastAPI runs POST /api/plans in its thread pool: two plans asked at once are made one
    at a time (the estimator's caches are the process's), each whole, and both recorded."""
    from concurrent.futures import ThreadPoolExecutor

    asked = PLAN_ASKED | {"tokens": 7e6}
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda _: client.post("/api/plans", json=asked), range(2)))
    assert [g.status_code for g in got] == [200, 200], got[0].text[:300]
    a, b = (g.json() for g in got)
    assert a["recommendation"] == b["recommendation"] and a["plan_id"] != b["plan_id"]


@pytest.mark.parametrize(
    ("body", "headers", "status", "said"),
    [
        (PLAN_ASKED | {"budget": -1}, {}, 422, "--budget -1: give a number above 0"),
        (PLAN_ASKED | {"epochs": 0}, {}, 422, "--epochs 0: give a number above 0"),
        (PLAN_ASKED | {"bogus": 1}, {}, 422, "--bogus: extra inputs are not permitted"),
        ([PLAN_ASKED], {}, 422, "the request: input should be a valid dictionary"),
        (PLAN_ASKED | {"budget": 0.001}, {}, 422, "these would give a plan: --budget"),
        ({"model": "meta-llama/Llama-3.2-1B"}, {}, 422, "give the amount of training"),
        (PLAN_ASKED | {"methods": "lora,bogus"}, {}, 422, "--method: input should be"),
        (PLAN_ASKED, {"content-type": "text/plain"}, 415, "application/json"),
    ],
    ids=[
        "bad-number",
        "bad-epochs",
        "unknown-field",
        "not-an-object",
        "no-plan",
        "no-tokens",
        "bad-method",
        "not-json",
    ],
)
def test_a_plan_the_api_cannot_make_is_one_line_and_not_on_the_books(
    client: TestClient, body: Any, headers: dict[str, str], status: int, said: str
) -> None:
    got = client.post("/api/plans", content=json.dumps(body),
                      headers={"content-type": "application/json"} | headers)  # fmt: skip
    assert got.status_code == status and said in got.json()["detail"], got.text[:300]
    assert client.get("/api/plans/2").status_code == 404  # the fixture's plan is the only one


def test_the_token_is_asked_of_every_request(books: dict[str, Any]) -> None:
    c = TestClient(create_app(books["url"], token="s3cret"))
    assert c.get("/api/runs").status_code == 401
    assert c.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.get("/api/runs", params={"token": "s3cret"}).status_code == 200
    assert c.get("/api/budgets").status_code == 200  # the browser keeps it in a cookie
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")


def _get(url: str, token: str | None = None) -> int:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _serve(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "frugal.cli.main", "dashboard", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(url: str, proc: subprocess.Popen[str], token: str | None = None) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            return _get(url, token)
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    raise AssertionError("the dashboard never answered")


def test_the_command_serves_on_loopback_and_asks_a_token_elsewhere(
    books: dict[str, Any],
) -> None:
    env = {**os.environ, "FRUGAL_DB_URL": books["url"]}
    port = free_port()
    proc = _serve("--port", str(port), env=env)
    try:
        assert _wait(f"http://127.0.0.1:{port}/api/overview", proc) == 200
    finally:
        proc.terminate()
        proc.wait(10)
    port = free_port()
    proc = _serve("--host", "0.0.0.0", "--port", str(port),
                  env={**env, "FRUGAL_DASHBOARD_TOKEN": "t0ken"})  # fmt: skip
    try:
        assert _wait(f"http://127.0.0.1:{port}/api/runs", proc) == 401
        assert _get(f"http://127.0.0.1:{port}/api/runs", "t0ken") == 200
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str],
                                   books: dict[str, Any]) -> None:  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = run_error(capsys, "dashboard", "--port", str(port))
    assert f"cannot serve on 127.0.0.1:{port}" in err and "--port" in err


def test_a_db_naming_no_ledger_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'ledger.sqlite'}"
    assert "no ledger there" in run_error(capsys, "dashboard", "--db", url)
    assert not (tmp_path / "missing").exists()  # nothing made where nothing was


# -- the pages, in a real headless Chromium ---------------------------------------------------


@pytest.fixture
def browser() -> Any:
    """Debian's chromium driven by Playwright (`make test` installs the package when missing,
    scripts/system-packages)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install chromium; make test does)")
    sync = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


def _serving(url: str) -> Any:
    """The dashboard over the ledger at `url` on a free loopback port, served by uvicorn in
    a thread: its address, until the generator is closed."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(url), host="127.0.0.1", port=port,
                                           log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def served(books: dict[str, Any]) -> Any:
    yield from _serving(books["url"])


@pytest.fixture
def served_empty(tmp_path: Path) -> Any:
    """The dashboard over a ledger with nothing on it yet."""
    url = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    Ledger(url)
    yield from _serving(url)


def _shot(page: Any, name: str) -> None:
    """With FRUGAL_SCREENSHOTS=DIR, the page as shown, for docs/dashboard.md."""
    where = os.environ.get("FRUGAL_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)


def _open(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready]", timeout=20_000)
    return page, errors


def test_the_overview_page_draws_the_ledgers_numbers(
    browser: Any, served: str, client: TestClient, tmp_path: Path
) -> None:
    page, errors = _open(browser, served + "/?by=project")
    assert page.get_attribute("body", "data-ready") == "1" and errors == []
    want = client.get("/api/overview", params={"by": "project"}).json()
    groups = want["report"]["groups"]
    drawn = page.evaluate("document.getElementById('spend').data[0]")
    assert drawn["x"] == [g["group"] for g in groups]
    assert drawn["y"] == pytest.approx([g["spend_usd"] for g in groups])
    spent = page.evaluate("document.getElementById('budgets').data[0].x")
    assert spent == pytest.approx([b["spent_usd"] for b in want["budgets"]])
    assert "projected" in page.inner_text("#projection")
    daily = page.evaluate("document.getElementById('daily').data")
    stacked = {t["name"]: sum(t["y"]) for t in daily}
    assert stacked == pytest.approx({g["group"]: g["spend_usd"] for g in groups})
    top = page.query_selector_all("#top tbody tr")
    assert len(top) == len(want["top_runs"]) == 2
    _shot(page, "overview")


def test_a_bad_period_shows_its_one_line(browser: Any, served: str) -> None:
    page, _ = _open(browser, served + "/?period=fortnight")
    assert page.get_attribute("body", "data-ready") == "error"
    assert "--period 'fortnight'" in page.inner_text("#projection")


def test_the_runs_page_lists_predicted_beside_actual_and_escapes_tags(
    browser: Any, served: str
) -> None:
    page, errors = _open(browser, served + "/runs?tag=project%3Dchat")
    assert page.get_attribute("body", "data-ready") == "1" and errors == []
    rows = page.query_selector_all("#runs tbody tr")
    assert len(rows) == 1
    cells = [c.inner_text() for c in rows[0].query_selector_all("td")]
    assert cells[7:9] == ["2.00", "2.20"]  # dollars: predicted, actual
    assert "team=<b>nlp</b>" in cells[-1] and page.query_selector("#runs b") is None


@pytest.mark.slow
def test_the_run_page_follows_a_run_as_it_trains(
    browser: Any, served: str, books: dict[str, Any], tmp_path: Path
) -> None:
    cfg, out = tmp_path / "live.yaml", tmp_path / "live"
    # the model as a user names it, from the checkout (the page shows what was recorded)
    make_cfg(out, "data.epochs=400", "price_per_hour_usd=36", "training.heartbeat_min=1s",
             "tags={project: chat}", f"model={TINY.relative_to(ROOT)}").write(cfg)  # fmt: skip
    env = {**os.environ, "FRUGAL_DB_URL": books["url"], "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "frugal.cli.main", "train", str(cfg),
                             "--quiet"], env=env, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (out / "ledger.json").exists() or not (out / "metrics.jsonl").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.2)
        run_id = json.loads((out / "ledger.json").read_text())["run_id"]
        page, errors = _open(browser, f"{served}/runs/{run_id}")
        first = int(page.get_attribute("body", "data-step") or 0)
        page.wait_for_function(f"Number(document.body.dataset.step) > {first}", timeout=30_000)
        assert "live" in page.inner_text("#status") and errors == []
        points = page.evaluate("document.getElementById('loss').data[0].x.length")
        assert points > 0
        assert page.inner_text("[data-fact=outcome]") == "running"
        page.wait_for_function(
            "document.querySelector('[data-fact=ETA]').textContent !== '-'", timeout=30_000
        )  # two heartbeats give the pace
        assert page.inner_text("[data-fact='total steps']") != "-"
        assert page.inner_text("[data-fact=projected]").startswith("$")
        _shot(page, "run")
    finally:
        proc.terminate()
        proc.wait(60)


def test_the_budgets_page_shows_burn_and_the_alerts(
    browser: Any, served: str, client: TestClient
) -> None:
    page, errors = _open(browser, served + "/budgets")
    assert page.get_attribute("body", "data-ready") == "1" and errors == []
    want = client.get("/api/budgets").json()
    spent = page.evaluate("document.getElementById('burn').data[0].x")
    assert spent == pytest.approx([b["spent_usd"] for b in want["budgets"]])
    burn = page.evaluate("document.getElementById('burndown').data[0].y")
    assert burn[-1] == pytest.approx(want["budgets"][0]["spent_usd"])  # it adds up to the spend
    (row,) = page.query_selector_all("#budgets tbody tr")
    assert [c.inner_text() for c in row.query_selector_all("td")][:2] == ["chat", "project=chat"]
    (alert,) = page.query_selector_all("#alerts tbody tr")
    assert alert.query_selector_all("td")[2].inner_text() == "50%"


def test_the_plan_page_draws_the_recorded_frontier(
    browser: Any, served: str, books: dict[str, Any]
) -> None:
    page, errors = _open(browser, f"{served}/plans/{books['plan']['plan_id']}")
    assert page.get_attribute("body", "data-ready") == "1" and errors == []
    frontier = books["plan"]["frontier"]
    drawn = page.evaluate("document.getElementById('frontier').data[0]")
    assert drawn["y"] == pytest.approx([p["est_cost_usd"] for p in frontier])
    chosen = page.evaluate("document.getElementById('frontier').data[1].y[0]")
    rec = books["plan"]["recommendation"]
    assert chosen == pytest.approx(rec["est_cost_usd"])
    # each plan with its range: error bars from the fastest to the slowest speed expected
    bars = page.evaluate("document.getElementById('frontier').data[0].error_y")
    lo = [y - m for y, m in zip(drawn["y"], bars["arrayminus"], strict=True)]
    hi = [y + p for y, p in zip(drawn["y"], bars["array"], strict=True)]
    assert lo == pytest.approx([p["est_cost_usd_range"][0] for p in frontier])
    assert hi == pytest.approx([p["est_cost_usd_range"][1] for p in frontier])
    c_lo, c_hi = rec["est_cost_usd_range"]
    facts = page.inner_text("dd[data-fact=estimate]")
    (h_lo, h_hi), usd = rec["est_hours_range"], rec["est_cost_usd"]

    def dollars(x: float) -> str:  # the page's cents: four places only under a cent
        return f"{x:.2f}" if abs(x) >= 0.01 or x == 0 else f"{x:.4f}"

    said = f"${dollars(usd)} (${dollars(c_lo)}-{dollars(c_hi)}) in {rec['est_hours']:.2f} h "
    assert facts.startswith(said + f"({h_lo:.2f}-{h_hi:.2f})")  # as the command prints it
    assert f"{rec['bound']}-bound" in facts
    missing, _ = _open(browser, f"{served}/plans/999")
    assert "no plan 999" in missing.inner_text("#status")


def test_the_plan_form_asks_the_api_and_draws_its_answer(
    browser: Any, served: str, client: TestClient
) -> None:
    page, errors = _open(browser, served + "/plan")
    page.fill("input[name=model]", "meta-llama/Llama-3.2-1B")
    page.fill("input[name=tokens]", "5000000")
    page.fill("input[name=methods]", "lora,qlora")
    page.fill("input[name=deadline]", "2h")
    page.select_option("select[name=spot]", "only")
    page.fill("input[name=tag]", "project=chat")
    page.click("button")
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)
    assert errors == []
    kept = client.get("/api/plans/2").json()  # what the form asked was recorded
    assert kept["tags"]["project"] == "chat"
    assert page.get_attribute("#recorded", "href") == "/plans/2"
    drawn = page.evaluate("document.getElementById('frontier').data[0]")
    assert drawn["y"] == pytest.approx([p["est_cost_usd"] for p in kept["plan"]["frontier"]])
    assert page.inner_text("#reasons").startswith("fits:")
    settings = page.inner_text("#settings")  # each setting with its reason and source
    assert "job.lora_r 16: " in settings and "[QLoRA]" in settings
    assert "data.epochs 3: a small dataset" in settings  # 5M tokens, epochs not given
    page.fill("input[name=deadline]", "a week")
    page.click("button")
    page.wait_for_selector("body[data-ready='error']", timeout=30_000)
    assert "--deadline 'a week'" in page.inner_text("#status")


def test_the_quality_page_ranks_a_sweep_by_what_each_run_bought(
    browser: Any, served: str, books: dict[str, Any], client: TestClient
) -> None:
    led = Ledger(books["url"])
    for lr, loss, usd in ((1e-4, 2.5, 1.0), (1e-3, 2.1, 1.0), (1e-2, 2.0, 3.0), (1e-1, 4.0, 0.5)):
        config = {"model": "m", "job": {"method": "lora", "lora_r": 8},
                  "training": {"learning_rate": lr}}  # fmt: skip
        rid = led.start_run(model="m", method="lora", config=config, price_per_hour_usd=1.0,
                            tags={"sweep": "lr"})  # fmt: skip
        led.end_run(rid, "completed", {"best_eval_loss": loss}, step=9, tokens=1.0,
                    cost_usd=usd, hours=usd)  # fmt: skip
    got = client.get("/api/quality", params={"scope": "sweep=lr"}).json()
    # frontier: the cheapest ($0.50, loss 4.0), the best at $1 (2.1), the best (2.0 at $3)
    assert [(r["settings"]["learning_rate"], r["frontier"]) for r in got["runs"]] == [
        (1e-2, True), (1e-3, True), (1e-1, True), (1e-4, False)]  # fmt: skip
    assert client.get("/api/quality", params={"scope": "bad"}).status_code == 422
    page, errors = _open(browser, served + "/quality?scope=sweep%3Dlr")
    assert page.get_attribute("body", "data-ready") == "1" and errors == []
    front = page.evaluate("document.getElementById('quality').data[1]")
    assert front["x"] == [0.5, 1.0, 3.0] and front["y"] == [4.0, 2.1, 2.0]
    assert page.inner_text("#ranked tbody tr:first-child td:first-child") == "1 *"
    assert "learning_rate moved the best loss by 2.0000" in page.inner_text("#effects")


def test_the_api_docs_page_draws_every_route_offline(browser: Any, served: str) -> None:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(served + "/api/docs")
    page.wait_for_selector(".opblock", timeout=20_000)  # Swagger UI drew the operations
    drawn = page.inner_text(".swagger-ui")
    assert "/api/plans/{plan_id}" in drawn and "/api/overview" in drawn and errors == []


def test_the_calibration_page_puts_measured_beside_predicted(
    browser: Any, served: str, books: dict[str, Any], client: TestClient
) -> None:
    led = Ledger(books["url"])
    predicted = {"tokens_per_s": 1000.0, "peak_reserved_gib": 12.0}
    for tps, gib in ((700.0, 13.5), (720.0, 13.4)):
        rid = led.start_run(model="m", method="lora", config={}, price_per_hour_usd=1.0,
                            gpu="A100 80GB", dry_run=True, predicted=predicted)  # fmt: skip
        led.end_run(rid, "completed", {"tokens_per_s": tps, "peak_reserved_gib": gib}, step=3,
                    tokens=1.0, cost_usd=0.1, hours=0.1)  # fmt: skip
    (group,) = client.get("/api/calibration").json()["groups"]
    assert group["group"] == "A100 80GB/lora" and group["runs"] == 2
    assert group["median_actual_over_predicted_tokens_per_s"] == pytest.approx(0.71)
    page, errors = _open(browser, served + "/calibration")
    assert page.get_attribute("body", "data-ready") == "1" and errors == []
    drawn = page.evaluate("document.getElementById('speed').data[0]")
    assert drawn["name"] == "A100 80GB/lora" and sorted(drawn["y"]) == [700.0, 720.0]
    assert page.inner_text("#groups tbody td:nth-child(3)") == "0.71"


EMPTY = {  # page -> its charts, and what each says with nothing to draw
    "/": {"budgets": "no budgets yet: frugal budget set", "spend": "no spend in this period",
          "daily": "no spend in this period"},
    "/budgets": {"burn": "no budgets yet", "burndown": "no budgets yet"},
    "/calibration": {"speed": "no run has measured its tokens/s yet",
                     "memory": "no run has measured its GiB reserved yet"},
    "/quality": {"quality": "no run in this scope has its loss on the books yet"},
}  # fmt: skip


def test_an_empty_ledger_says_what_to_do_instead_of_drawing_bare_axes(
    browser: Any, served_empty: str
) -> None:
    """An empty budget chart was bare axes from -1 to 6, an empty calibration page two
    diagonal lines: each chart with nothing to draw says so, and how to get something."""
    for path, charts in EMPTY.items():
        page, errors = _open(browser, served_empty + path)
        assert page.get_attribute("body", "data-ready") == "1" and errors == [], path
        for div, said in charts.items():
            assert page.get_attribute(f"#{div}", "data-empty") == "1", (path, div)
            assert said in page.inner_text(f"#{div}"), (path, div)
            assert not page.query_selector(f"#{div} .main-svg"), (path, div)  # no axes
        _shot(page, "empty-" + (path.strip("/") or "overview"))


def test_every_chart_names_its_axes_units(browser: Any, served: str, books: dict[str, Any]) -> None:
    """No axis without its unit (the spend chart's dollars, the frontier's log hours and
    dollars were bare): every axis of every chart drawn has a title, and it shows."""
    pages = ["/", "/budgets", f"/plans/{books['plan']['plan_id']}", f"/runs/{books['a']}"]
    for path in pages:
        page, errors = _open(browser, served + path)
        assert errors == [], path
        titles = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
            .map(d => [d.id, (d.layout.xaxis.title || {}).text,
                       (d.layout.yaxis.title || {}).text])""")
        assert titles, path
        for div, x, y in titles:
            if div in ("budgets", "burn"):  # horizontal bars: their names are the y axis
                assert x, (path, div)
            else:
                assert x and y, (path, div, x, y)
        shown = page.inner_text("body")
        assert all(x in shown for _, x, _ in titles), path  # drawn, not only set
        if path.startswith(("/budgets", "/plans")):  # the overview and run have their own
            _shot(page, path.split("/")[1])
