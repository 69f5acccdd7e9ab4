"""Random bytes and random damage to valid files: `frugal data check` and the run config
loader answer with a result or one line naming the problem (exit 2), never a traceback or
an internal error (exit 1). Seeded, so a failure reproduces."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from frugal.cli.main import main
from frugal.config import RunConfig, load_run_config
from frugal.errors import FrugalError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny-llama")
CASES = 120


def _valid_files(tmp: Path) -> dict[str, bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(x) for x in (ROOT / "examples" / "data" / "spell.jsonl").open()][:20]
    chat = [json.loads(x) for x in (ROOT / "examples" / "data" / "chat.jsonl").open()][:10]
    csv = "text\n" + "".join(f'"{r["text"]}"\n' for r in rows)
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return {
        ".jsonl": "".join(json.dumps(r) + "\n" for r in rows + chat[:0]).encode(),
        ".json": "".join(json.dumps(r) + "\n" for r in chat).encode(),
        ".csv": csv.encode(),
        ".parquet": buf.getvalue(),
    }


def _mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("flip", "insert", "delete", "truncate", "duplicate", "garbage"))
        at = rng.randrange(len(b) + 1) if b else 0
        if kind == "flip" and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif kind == "insert":
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == "delete" and b:
            del b[at : at + rng.randint(1, 64)]
        elif kind == "truncate":
            del b[at:]
        elif kind == "duplicate" and b:
            j = rng.randrange(len(b))
            b[at:at] = b[j : j + rng.randint(1, 128)]
        elif kind == "garbage":
            b = bytearray(rng.randbytes(rng.randint(0, 512)))
    return bytes(b)


def _one_line_or_result(capsys: pytest.CaptureFixture[str], rc: int, what: str) -> None:
    err = capsys.readouterr().err
    assert rc in (0, 2), f"{what}: exit {rc}: {err[-500:]}"
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {err[-500:]}"
    assert "Traceback" not in err and "internal error" not in err, f"{what}: {err[-500:]}"


@pytest.mark.slow
def test_data_check_never_crashes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rng = random.Random(20261123)
    valid = _valid_files(tmp_path)
    for case in range(CASES):
        suffix = rng.choice(list(valid))
        data = _mutate(valid[suffix], rng)
        path = tmp_path / f"case{case}{suffix}"
        path.write_bytes(data)
        rc = main(["data", "check", str(path), "--model", TINY, "--seq", "64", "--json"])
        _one_line_or_result(capsys, rc, f"case {case} ({suffix}, {len(data)} bytes)")


def test_config_loading_never_crashes(tmp_path: Path) -> None:
    rng = random.Random(7)
    good = RunConfig.model_validate(
        {"model": TINY, "data": {"path": "d.jsonl"}, "training": {"max_time_min": 30}}
    ).to_yaml()
    for case in range(CASES * 2):
        path = tmp_path / f"c{case}.yaml"
        path.write_bytes(_mutate(good.encode(), rng))
        try:
            load_run_config(path, ["training.max_steps=5"] if case % 3 == 0 else [])
        except FrugalError as e:
            assert "\n" not in str(e).strip(), f"case {case}: {e}"


# -- every option of every command ---------------------------------------------------------

BAD_NUMBERS = ("nan", "inf", "-inf", "-1", "0", "1e400", "1e30", "0.5", "abc", "", "1,5")
BAD_TEXT = ("", " ", "x" * 300, "\u00e9t\u00e9", "a,b,,", "/proc/self/frugal-x", "../..", "-",
            "=", "a=", "=b", "2026-13-45", "9999-12", "nan", "\t", "DROP TABLE runs")  # fmt: skip
SKIP = {("dashboard",)}  # it serves until stopped when its options are good


def _commands() -> list[tuple[tuple[str, ...], Any]]:
    import typer.main

    from frugal.cli.main import app

    out = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk(sub, (*path, name))
        elif path not in SKIP:
            out.append((path, cmd))

    walk(typer.main.get_command(app), ())
    return out


def _argv(path: tuple[str, ...], cmd: Any, rng: random.Random) -> list[str]:
    """The command with its required arguments (a model that is not there, a file that is
    not there) and one to three of its options given a bad or odd value."""
    import typing

    hints = typing.get_type_hints(cmd.callback)
    argv = [*path]
    options, positional = [], []
    for p in cmd.params:
        types = typing.get_args(hints[p.name]) or (hints[p.name],)
        numeric = (int in types or float in types) and bool not in types
        values = BAD_NUMBERS if numeric else BAD_TEXT
        flag = next((o for o in getattr(p, "opts", []) if o.startswith("--")), None)
        if flag is None:  # a positional argument: the tiny model, the toy data, or nothing
            real = {"model": TINY, "file": str(ROOT / "examples" / "data" / "spell.jsonl")}
            given = real.get(p.name, "no-such-thing") if rng.random() < 0.7 else "no-such-thing"
            positional.append(given if not numeric else rng.choice(values))
        elif bool in types or hints[p.name] is bool:
            options.append([flag])
        else:
            options.append([flag, rng.choice(values)])
    for picked in rng.sample(options, k=min(len(options), rng.randint(1, 3))):
        argv += picked
    return [*argv, *positional]


@pytest.mark.slow
def test_every_command_answers_bad_options_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random bad values for every command's options: a result or one line (exit 0 or 2),
    never a traceback or an internal error; `--json` is one JSON object."""
    monkeypatch.setenv("FRUGAL_DB_URL", f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    monkeypatch.chdir(tmp_path)  # what a command may write lands here
    rng = random.Random(int(os.environ.get("FUZZ_SEED", "20261125")))
    for path, cmd in _commands():
        for _ in range(int(os.environ.get("FUZZ_N", "6"))):
            argv = _argv(path, cmd, rng)
            rc = main(argv)
            out, err = capsys.readouterr()
            what = " ".join(repr(a) if " " in a or not a else a for a in argv)
            assert rc in (0, 2), f"frugal {what}: exit {rc}: {err[-600:]}"
            assert "Traceback" not in err and "internal error" not in err, f"{what}: {err}"
            if rc == 2:
                lines = err.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {err}"
            if rc == 0 and "--json" in argv:
                json.loads(out)
