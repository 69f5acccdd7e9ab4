"""Caches that heal: a damaged profile or tokenized-data cache entry (truncated, emptied, its
bytes changed) is said once on stderr, rebuilt, and the answer is the one an intact cache
gives; the next command finds the rebuilt entry and says nothing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from frugal import errors
from frugal.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny-llama")
SPELL = str(ROOT / "examples" / "data" / "spell.jsonl")


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _flip(p: Path) -> None:  # the same size, other bytes: the zip's CRC no longer matches
    raw = bytearray(p.read_bytes())
    for i in range(len(raw) // 3, len(raw) // 3 + 64):
        raw[i] ^= 0x5A
    p.write_bytes(bytes(raw))


DAMAGE: dict[str, Callable[[Path], None]] = {"truncated": _truncate, "empty": _empty,
                                             "flipped": _flip}  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, object], str]:
    """A command's answer and what it said on stderr, as a new process would say it (a note
    is said once per process: forget the ones said before)."""
    errors._said.clear()
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    return json.loads(out), err


ESTIMATE = ("estimate", "--seq", "64", "--json")


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    """A cache holding the tiny model's profile (simulated once for the module's tests,
    each of which damages its own copy)."""
    cache = tmp_path_factory.mktemp("intact")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRUGAL_CACHE_DIR", str(cache))
        assert main([ESTIMATE[0], str(tiny_llama_dir), *ESTIMATE[1:]]) == 0
    return cache


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_profile_is_said_once_and_simulated_again(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    tiny_llama_dir: Path, intact: Path, how: str,
) -> None:  # fmt: skip
    shutil.copytree(intact, tmp_path / "cache")
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "cache"))
    argv = (ESTIMATE[0], str(tiny_llama_dir), *ESTIMATE[1:])
    capsys.readouterr()
    first, err = _run(capsys, *argv)  # from the intact cache: nothing to say
    assert err == ""
    (entry,) = (tmp_path / "cache" / "profiles").glob("*.npz")
    DAMAGE[how](entry)
    again, err = _run(capsys, *argv)
    assert again == first
    notes = err.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith(f"note: the cached profile {entry} was dam")
    assert "removed, and made again" in notes[0]
    third, err = _run(capsys, *argv)  # healed: found, and nothing to say
    assert third == first and err == ""


@pytest.mark.parametrize("how", ["truncated", "flipped-meta"])
def test_damaged_cached_tokens_are_said_once_and_made_again(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    how: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path))
    argv = ("data", "check", SPELL, "--model", TINY, "--seq", "64", "--json")
    first, _ = _run(capsys, *argv)
    (entry,) = (p for p in (tmp_path / "data").iterdir() if p.is_dir())
    if how == "truncated":
        _truncate(max(entry.glob("*.arrow"), key=lambda p: p.stat().st_size))
    else:
        (entry / "format.json").write_text('{"format": ')
    again, err = _run(capsys, *argv)
    assert again == first
    assert err.count("note: the cached tokens of") == 1 and "tokenizing again" in err
    third, err = _run(capsys, *argv)
    assert third == first and err == ""
