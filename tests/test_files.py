"""Files you own are yours (frugal.files): every command that writes a file refuses, with
one line and before any work, a path it cannot write and a file that exists (unless
--force), and writes whole files or none; `frugal train` writes only into a directory that
is new, empty or a run of its own; an emitted task trains the config written with it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_error, run_json

from frugal.cli.main import main
from frugal.errors import FrugalError
from frugal.files import check_dir, check_target, replacing, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny-llama")
SPELL = str(ROOT / "examples" / "data" / "spell.jsonl")
MINE = "# my notes: frugal must never touch this\nkeep: me\n"


def _digest(directory: Path) -> dict[str, str]:
    """Every file under `directory` and a hash of its bytes."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# -- the checks themselves --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("missing/out.yaml", "the directory missing does not exist"),
        ("a-file/out.yaml", "the directory a-file is a file"),
        ("a-dir", "is a directory: name a file in it"),
        ("x" * 256 + ".yaml", "the name is over 255 bytes"),
        ("/dev/null", "is not a regular file"),
        ("/proc/self/out.yaml", "cannot write in /proc/self"),
        ("mine.yaml", "exists: add --force to replace it"),
    ],
)
def test_a_target_that_cannot_or_must_not_be_written_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "mine.yaml").write_text(MINE)
    with pytest.raises(FrugalError, match=r"^--write ") as e:
        check_target(target, "--write")
    assert says in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "mine.yaml").read_text() == MINE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "a-file", "mine.yaml"]


def test_force_replaces_a_file_but_never_a_directory_or_a_device(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(MINE)
    assert check_target(tmp_path / "mine.yaml", "--write", force=True) == tmp_path / "mine.yaml"
    with pytest.raises(FrugalError, match="is a directory"):
        check_target(tmp_path, "--write", force=True)
    with pytest.raises(FrugalError, match="not a regular file"):
        check_target("/dev/null", "--write", force=True)


def test_a_directory_to_write_in(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert check_dir(tmp_path / "new" / "deeper", "--write") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checked, not made
    for bad, says in [
        (tmp_path / "f", "is a file, not a directory"),
        (tmp_path / "f" / "sub", "is a file, not a directory"),
        (tmp_path / ("d" * 300), "over 255 bytes"),
        (Path("/proc/self/new"), "cannot write in /proc/self"),
    ]:
        with pytest.raises(FrugalError, match=says):
            check_dir(bad, "--write")


def test_a_write_is_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(MINE)
    os.chmod(path, 0o640)
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        tmp.write_text("half of a new")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == MINE and [p.name for p in tmp_path.iterdir()] == ["cfg.yaml"]
    write_text_atomic(path, "new: 1\n")
    assert path.read_text() == "new: 1\n"
    assert path.stat().st_mode & 0o777 == 0o640  # the file's mode is kept
    write_text_atomic(tmp_path / "fresh.yaml", "x: 1\n")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "fresh.yaml").stat().st_mode & 0o777 == 0o666 & ~umask  # not 0600


# -- every command that writes: refused on the user's file, on an unwritable path ----------


def _ledger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FRUGAL_DB_URL", f"sqlite:///{tmp_path / 'ledger.sqlite'}")


WRITERS: dict[str, list[str]] = {
    "plan --write": ["plan", "{tiny}", "--tokens", "1M", "--write", "{target}"],
    "plan --emit hf": ["plan", "{tiny}", "--tokens", "1M", "--emit", "hf", "--emit-file",
                       "{target}"],
    "plan --emit skypilot": ["plan", "{tiny}", "--tokens", "1M", "--write", "{other}",
                             "--emit", "skypilot", "--emit-file", "{target}"],
    "plan --plot png": ["plan", "{tiny}", "--tokens", "1M", "--plot", "{target}.png"],
    "plan --plot html": ["plan", "{tiny}", "--tokens", "1M", "--plot", "{target}.html"],
    "plan --jobs --write": ["plan", "--jobs", "{jobs}", "--write", "{target}"],
    "data check --plot": ["data", "check", SPELL, "--model", TINY, "--plot", "{target}.png"],
    "costs export jsonl": ["costs", "export", "--output", "{target}"],
    "costs export focus": ["costs", "export", "--format", "focus", "--output", "{target}"],
    "serve plan --emit skypilot": ["serve", "plan", "meta-llama/Llama-3.1-8B", "--rate", "1",
                                   "--input-len", "100", "--output-len", "10", "--emit",
                                   "skypilot", "--emit-file", "{target}"],
}  # fmt: skip


def _argv(name: str, target: str, tmp_path: Path, tiny: Path) -> list[str]:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [{"name": "a", "model": str(tiny), "tokens": "1M"}]}))
    subs = {"{tiny}": str(tiny), "{other}": str(tmp_path / "other.yaml"), "{jobs}": str(jobs)}
    out = []
    for a in WRITERS[name]:
        for k, v in subs.items():
            a = a.replace(k, v)
        out.append(a.replace("{target}", target))
    return out


@pytest.mark.parametrize("name", list(WRITERS))
def test_no_command_changes_a_file_of_yours_without_force(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    tiny_llama_dir: Path, name: str,
) -> None:  # fmt: skip
    _ledger(monkeypatch, tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    target = str(mine / "out")
    argv = _argv(name, target, tmp_path, tiny_llama_dir)
    written = next(a for a in argv if a.startswith(target))
    if name == "plan --jobs --write":  # a directory: the job's run config is the user's
        Path(target).mkdir()
        written = str(Path(target) / "a.yaml")
    Path(written).write_text(MINE)
    before = _digest(mine)
    msg = run_error(capsys, *argv)
    assert "exists: add --force to replace it" in msg and written in msg
    assert _digest(mine) == before
    # a path nobody can write: one line naming it, before any work
    argv = _argv(name, "/proc/self/frugal-out", tmp_path, tiny_llama_dir)
    assert "cannot write in /proc/self" in run_error(capsys, *argv)


def test_force_replaces_them_whole_and_json_stays_one_object(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    tiny_llama_dir: Path,
) -> None:  # fmt: skip
    _ledger(monkeypatch, tmp_path)
    cfg, task, chart = tmp_path / "cfg.yaml", tmp_path / "sky.yaml", tmp_path / "chart.html"
    for p in (cfg, task, chart):
        p.write_text(MINE)
    out = run_json(capsys, "plan", str(tiny_llama_dir), "--tokens", "1M", "--write", str(cfg),
                   "--emit", "skypilot", "--emit-file", str(task), "--plot", str(chart),
                   "--force", "--json")  # fmt: skip
    assert (out["wrote"], out["wrote_skypilot"], out["wrote_plot"]) == tuple(
        map(str, (cfg, task, chart))
    )
    assert yaml.safe_load(cfg.read_text())["model"] == str(tiny_llama_dir)
    assert chart.read_text().startswith("<!doctype html>")
    # the task trains the config written with it in this same call, nothing else: outside
    # the synced workdir, it is mounted onto the VM and trained there
    sky = yaml.safe_load(task.read_text())
    assert sky["run"].startswith("frugal train ~/frugal-config/cfg.yaml ")
    assert sky["file_mounts"]["~/frugal-config/cfg.yaml"] == str(cfg)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_skypilot_task_needs_the_run_config_it_launches(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_llama_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "frugal.yaml").write_text(MINE)  # another plan's config, in the way
    msg = run_error(capsys, "plan", str(tiny_llama_dir), "--tokens", "1M", "--emit", "skypilot")
    assert "add --write FILE" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frugal.yaml"]
    msg = run_error(capsys, "plan", str(tiny_llama_dir), "--tokens", "1M", "--write", "a.yaml",
                    "--emit", "hf", "--emit-file", "./a.yaml")  # fmt: skip
    assert "name the same file" in msg


# -- frugal train's output directory ----------------------------------------------------------


def _tiny_config(tmp_path: Path) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "tiny-train.yaml").read_text())
    data["model"] = TINY
    data["data"]["path"] = SPELL
    data["training"]["max_steps"] = 1
    cfg = tmp_path / "project" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text("# my run, with my comments\n" + yaml.safe_dump(data))
    return cfg


def test_train_writes_nothing_into_a_directory_of_yours(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _ledger(monkeypatch, tmp_path)
    cfg = _tiny_config(tmp_path)
    before = _digest(cfg.parent)
    msg = run_error(capsys, "train", str(cfg), "--output-dir", str(cfg.parent),
                    "training.max_steps=2")  # fmt: skip
    assert "holds files frugal did not write (config.yaml)" in msg
    assert _digest(cfg.parent) == before
    assert "is a file, not a directory" in run_error(
        capsys, "train", str(cfg), "--output-dir", str(cfg)
    )


def test_train_takes_an_empty_directory_and_its_own_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _ledger(monkeypatch, tmp_path)
    cfg = _tiny_config(tmp_path)
    out = tmp_path / "empty"
    out.mkdir()
    summary: Any = run_json(capsys, "train", str(cfg), "--output-dir", str(out), "--json")
    assert summary["outcome"] == "completed"
    assert (out / ".frugal-run").is_file() and (out / "config.yaml").is_file()
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    (out / "run_summary.json").unlink()
    (out / "final").exists() and shutil.rmtree(out / "final")
    # marked as frugal's: the same directory is taken again
    assert json.loads((out / ".frugal-run").read_text()) == {"written_by": "frugal train"}
    assert main(["train", str(cfg), "--output-dir", str(out), "--json"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["offers", "--prices", "{long}"],
        ["data", "check", "{long}", "--model", TINY],
        ["costs", "import", "{long}"],
        ["train", "{long}"],
        ["estimate", "{long}"],
        ["plan", "--jobs", "{long}"],
    ],
)
def test_a_path_to_read_that_cannot_be_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    argv: list[str],
) -> None:  # fmt: skip
    _ledger(monkeypatch, tmp_path)
    long = str(tmp_path / ("x" * 300))
    msg = run_error(capsys, *(a.replace("{long}", long) for a in argv))
    assert "xxxxxxxx" in msg or "not found" in msg or "no such" in msg.lower(), msg


@pytest.mark.parametrize("name", ["中" * 83 + ".csv", "a" * 10 + "." + "b" * 200])
def test_a_name_that_passes_the_check_is_written(tmp_path: Path, name: str) -> None:
    """The temporary file beside a long name (253 bytes of CJK, a 201-byte suffix) still
    fits a file name: a name the check passes is written, not refused after the work."""
    target = tmp_path / name
    assert len(name.encode()) <= 255
    write_text_atomic(check_target(target, "--output"), "x\n")
    assert target.read_text() == "x\n" and [p.name for p in tmp_path.iterdir()] == [name]
