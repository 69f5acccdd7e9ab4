"""`frugal init` (issue 31): asked through a pseudo-terminal as a person types, bad answers
asked again with the reason; the config it writes is what `frugal train` reads and the
plan it prints is `frugal plan`'s."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY

from frugal.config import validate_run_config

FRUGAL = [sys.executable, "-m", "frugal.cli.main"]
SENTIMENT = ROOT / "examples" / "sentiment" / "train.jsonl"


class Terminal:
    """A command on a pseudo-terminal: wait for text, type a line."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the command, its terminal the pty
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        self.seen, self.at = "", 0

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 4096)
        except OSError:  # the child closed the terminal: it exited
            return False
        if not chunk:
            return False
        self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")
        return True

    def expect(self, text: str, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while text not in self.seen[self.at :]:
            if time.monotonic() > end or not self._read(0.2):
                raise AssertionError(f"{text!r} never came; the terminal showed:\n{self.seen}")
        got = self.seen[self.at :]
        self.at = self.seen.index(text, self.at) + len(text)
        return got

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")

    def finish(self, timeout: float = 180) -> int:
        end = time.monotonic() + timeout
        while self._read(0.2) and time.monotonic() < end:
            pass
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


@pytest.mark.slow
def test_init_asks_again_with_the_reason_then_writes_a_config_train_reads(
    tmp_path: Path,
) -> None:
    t = Terminal([*FRUGAL, "init"], tmp_path)
    answers = [
        ("Task", "regression", "answer causal (next-token"),
        ("Task", "classification", None),
        ("Training data file", "missing.jsonl", "missing.jsonl: no such file"),
        ("Training data file", str(SENTIMENT), None),
        ("Model", "", None),  # Enter: the default (a 1B model for a classifier)
        ("Budget", "-5", "give dollars, more than 0"),
        ("Budget", "$5", None),
        ("Deadline", "soon", "soon"),
        ("Deadline", "2d", None),
        ("Hardware", "", None),
        ("Quality or cost first", "speed", "answer cost (QLoRA or LoRA) or quality"),
        ("Quality or cost first", "quality", None),
    ]
    for prompt, line, reason in answers:
        t.expect(prompt)
        t.type(line)
        if reason:
            assert reason in t.expect("try again"), t.seen
    t.expect("next: frugal train frugal.yaml", timeout=180)
    assert t.finish() == 0
    assert "plan:" in t.seen and "wrote frugal.yaml" in t.seen
    raw = yaml.safe_load((tmp_path / "frugal.yaml").read_text())
    cfg = validate_run_config(raw, "frugal.yaml")
    assert (cfg.model, cfg.job.task, cfg.job.num_labels) == ("meta-llama/Llama-3.2-1B",
                                                             "classification", 2)  # fmt: skip
    assert cfg.job.method in ("lora", "full")  # quality first: no 4-bit base
    assert cfg.job.seq == 64  # the longest review (~90 characters, ~23 tokens), at least 64
    assert cfg.plan is not None and cfg.plan.est_cost_usd <= 5
    # frugal train takes it (here on the tiny model's random weights, one dry step)
    rc = subprocess.run(
        [*FRUGAL, "train", "frugal.yaml", f"model={TINY}", "init=random", "--dry-run", "1",
         "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rc.returncode == 0, rc.stderr


def test_init_without_a_terminal_needs_yes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from frugal.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert main(["init"]) == 2
    assert "answer with --yes and flags" in capsys.readouterr().err
    assert main(["init", "--yes"]) == 2  # the data has no default
    assert "--yes: give --dataset" in capsys.readouterr().err
    assert main(["init", "--yes", "--dataset", str(SENTIMENT), "--task", "classification",
                 "--budget", "abc"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a number: give a number above 0" in err[0]
    assert not (tmp_path / "frugal.yaml").exists()


def test_init_yes_takes_flags_and_a_model_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from frugal.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["init", "--yes", "--dataset", str(ROOT / "examples" / "data" / "spell.jsonl"),
                 "--model", "8B", "--priority", "cost"]) == 0  # fmt: skip
    cfg = yaml.safe_load((tmp_path / "frugal.yaml").read_text())
    assert cfg["model"] == "meta-llama/Llama-3.1-8B" and cfg["job"]["task"] == "causal"
    assert cfg["job"]["method"] in ("qlora", "lora")
    # an existing config is not replaced without --force, before anything is asked
    assert main(["init", "--yes", "--dataset", "x.jsonl"]) == 2
    assert "exists" in capsys.readouterr().err


def test_init_ended_at_a_question_says_so_and_writes_nothing(tmp_path: Path) -> None:
    t = Terminal([*FRUGAL, "init"], tmp_path)
    t.expect("Task")
    t.type("classification")
    t.expect("Training data file")
    os.write(t.fd, b"\x04")  # Ctrl-D: the input ends
    assert t.finish(60) == 2
    assert "no answer to 'Training data file' (the input ended)" in t.seen
    assert list(tmp_path.iterdir()) == []
