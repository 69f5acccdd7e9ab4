"""Shared test set-up: profiles cached in a per-session temporary dir, never the user's."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core: a second intra-op thread in each only contends
    # for the cores (the tiny models gain nothing from it: the distillation example takes
    # as long on one thread, with 40% less CPU), and the runs the tests start inherit it
    os.environ["OMP_NUM_THREADS"] = "1"

from frugal.cli.main import main
from frugal.config import RunConfig, apply_overrides, validate_run_config
from frugal.models.specs import ModelSpec, load_spec


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("FRUGAL_CACHE_DIR")
    # one profile cache for the whole run: under pytest-xdist the workers' temp dirs share a
    # parent, and a profile is written atomically, so a worker reuses what another simulated
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    (shared / "profiles").mkdir(exist_ok=True)
    os.environ["FRUGAL_CACHE_DIR"] = str(shared / "profiles")
    # the ledger and the settings: never the user's (a test that needs its own sets them)
    os.environ["FRUGAL_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    os.environ["FRUGAL_SETTINGS"] = str(tmp_path_factory.mktemp("cfg") / "settings.toml")
    for name in [
        n
        for n in os.environ
        if n.startswith("FRUGAL_TAG") or n in ("FRUGAL_DB_URL", "FRUGAL_REQUIRED_TAGS")
    ]:
        del os.environ[name]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # prices: never the network, never the user's snapshot (a test that serves catalogs on
    # loopback points these at its server); nothing listens on port 9 of the loopback
    os.environ["FRUGAL_OFFERS_DIR"] = str(tmp_path_factory.mktemp("offers"))
    for name in ("FRUGAL_SKYPILOT_URL", "FRUGAL_SPOT_ADVISOR_URL", "GPUHUNT_CATALOG_URL"):
        os.environ[name] = "http://127.0.0.1:9/nothing-listens-here"
    yield
    if old is None:
        os.environ.pop("FRUGAL_CACHE_DIR", None)
    else:
        os.environ["FRUGAL_CACHE_DIR"] = old


# -- tiny models written from configs (shared by the estimate, CLI and model tests) ---------

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
}


# an untied head, so the LM head and the embedding are separate weights (step-level tests)
UNTIED_LLAMA: dict[str, Any] = {
    **TINY_LLAMA,
    "intermediate_size": 160,
    "vocab_size": 300,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def write_config(directory: Path, config: dict[str, Any]) -> Path:
    """Write `config` as `directory/config.json` and return the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("tiny-llama"), TINY_LLAMA)


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir: Path) -> ModelSpec:
    return load_spec(str(tiny_llama_dir / "config.json"))


# -- the command line, called in process ----------------------------------------------------


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def run_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 2, (rc, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error:")
    return lines[0]


# -- a tiny training run on the bundled example model and data ------------------------------

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-llama"
DATA = ROOT / "examples" / "data"


def make_cfg(out: Path, *overrides: str) -> RunConfig:
    base: dict[str, Any] = {
        "model": str(TINY),
        "init": "random",
        "job": {
            "method": "lora",
            "precision": "fp32",
            "lora_r": 8,
            "batch": 4,
            "seq": 96,
            "grad_checkpointing": False,
        },
        "data": {"path": str(DATA / "spell.jsonl"), "epochs": 1},
        "training": {
            "effective_batch": 8,
            "learning_rate": 0.01,
            "eval_every": 0,
            "loggers": ["jsonl"],
            "warmup_ratio": 0.0,
        },
        "output_dir": str(out),
    }
    return validate_run_config(apply_overrides(base, list(overrides)), "test")


def weights(out: Path) -> dict[str, Any]:
    """The trained weights a run saved (the adapter's, or the whole model's)."""
    from safetensors.torch import load_file

    final = out / "final"
    name = (
        "adapter_model.safetensors"
        if (final / "adapter_config.json").exists()
        else ("model.safetensors")
    )
    return load_file(str(final / name))


def assert_same_weights(a: Path, b: Path, tol: float = 1e-6) -> None:
    """Two runs' saved weights agree to `tol` (largest absolute difference)."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and wa
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert worst <= tol, f"weights differ by {worst}"


def losses(out: Path) -> dict[int, float]:
    """Each step's training loss, from the run's metrics log."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(ln) for ln in lines]
    return {d["step"]: d["loss"] for d in rows if "loss" in d}  # eval lines have eval_loss


@pytest.fixture
def one_second_steps(monkeypatch: pytest.MonkeyPatch) -> Callable[[], float]:
    """A clock on which every training step takes exactly one second (and nothing else
    takes any time); pass it to `recipe.train`."""
    from frugal.run import training_loop

    now = [0.0]
    real_step = training_loop.train_step

    def one_second_step(run: Any, step: int) -> dict[str, float]:
        now[0] += 1.0
        return real_step(run, step)

    monkeypatch.setattr(training_loop, "train_step", one_second_step)
    return lambda: now[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need CUDA; without it they are skipped, not failed."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- a real PostgreSQL server, started by the tests ----------------------------------------


def _pg_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server of the system's postgresql package on a free loopback port in a
    temp dir (as the `postgres` user when the tests run as root); yields the base URL."""
    pg = _pg_bin()
    if pg is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; make test does)")
    as_user: list[str] = []
    # not under pytest's temp root: that is private to the user running the tests
    root = Path(tempfile.mkdtemp(prefix="frugal-pg-"))
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run PostgreSQL as")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    data = root / "data"

    def run(*cmd: str) -> None:
        done = subprocess.run([*as_user, *cmd], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{cmd[0]} failed: {done.stderr or done.stdout}"

    run(str(pg / "initdb"), "-D", str(data), "-A", "trust", "-U", "frugal", "-E", "UTF8",
        "--no-sync")  # fmt: skip
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=64"
    run(str(pg / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "start")
    try:
        yield f"postgresql+psycopg://frugal@127.0.0.1:{port}"
    finally:
        run(str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty ledger on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    import psycopg

    base = request.getfixturevalue("postgres_server")
    name = f"t{uuid.uuid4().hex[:12]}"
    port = base.rsplit(":", 1)[1]
    with psycopg.connect(f"host=127.0.0.1 port={port} user=frugal dbname=postgres",
                         autocommit=True) as conn:  # fmt: skip
        conn.execute(f"CREATE DATABASE {name}")
    return f"{base}/{name}"


# -- SkyPilot's own schemas (tests/data/skypilot) -------------------------------------------


def skypilot_validator(name: str) -> Any:
    """SkyPilot's validator for its `name` schema: Draft 7 with its two enum keywords."""
    import jsonschema

    def enum(case: bool) -> Any:
        def check(validator: Any, enums: Any, instance: Any, schema: Any) -> Any:
            have = instance if case else str(instance).lower()
            if have not in (enums if case else [e.lower() for e in enums]):
                yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

        return check

    cls = jsonschema.validators.extend(
        jsonschema.Draft7Validator,
        validators={"case_insensitive_enum": enum(False), "case_sensitive_enum": enum(True)},
    )
    schemas = Path(__file__).parent / "data" / "skypilot"
    return cls(json.loads((schemas / f"{name}.schema.json").read_text()))


def load_benchmark(name: str) -> Any:
    """A script of benchmarks/ as a module (tests hold its figures to their targets)."""
    import importlib.util
    import sys

    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A loopback port nothing listens on now (the OS's pick, closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def signal_when(
    argv: list[str], ready: Callable[[], bool], sig: int, timeout: float = 60
) -> tuple[int, str, float]:
    """Run `argv` in a session of its own; once `ready()` holds (while it still runs), send
    it `sig`. Returns its exit code, its stderr and when the signal went; it is killed if it
    outlives `timeout` after that."""
    import time

    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.02)
        p.send_signal(sig)
        sent = time.monotonic()
        _, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, err, sent
