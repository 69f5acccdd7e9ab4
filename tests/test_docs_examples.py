"""What a new user reads is what they get: every `$ frugal ...` example in the README and
docs runs as written, from a fresh directory holding the repository's examples, and prints
the output shown (the same words in the same order; numbers may differ), and the Quickstart's
two commands are Makefile targets. `.ci/run` runs `make test`."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def examples() -> list[tuple[str, str, str]]:
    """(where, command, shown output) of each fenced block that starts with `$ frugal`."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), flags=re.S):
            lines = block.splitlines()
            if lines and lines[0].startswith("$ frugal "):
                out.append((doc.name, lines[0][2:], "\n".join(lines[1:])))
    return out


def words(text: str) -> list[str]:
    """The text as words, numbers as N and table borders dropped, so that wrapping, column
    widths and figures do not matter; an elided '...' line is skipped."""
    text = re.sub(r"[│┃┏┓┗┛┡┩└┘├┤┼╇━─┳┻╈┯┷═║]", " ", text)
    text = re.sub(r"\$?\d[\d,]*(\.\d+)?", " N ", text)
    return [w for w in re.findall(r"[A-Za-z_][\w.\-/]*|N|[()%$:;@]", text) if w != "..."]


def is_subsequence(want: list[str], have: list[str]) -> bool:
    it = iter(have)
    return all(w in it for w in want)


@pytest.mark.parametrize(("where", "command", "shown"), examples(), ids=lambda x: str(x)[:40])
@pytest.mark.slow
def test_documented_example_runs_as_written(
    where: str, command: str, shown: str, tmp_path: Path
) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # a user in a fresh checkout
    argv = shlex.split(command)
    assert argv[0] == "frugal"
    env = {**os.environ, "COLUMNS": "120"}
    run = subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", *argv[1:]], cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, env=env,
    )  # fmt: skip
    printed = run.stdout  # both streams, in the order a terminal shows them
    expect_error = shown.lstrip().startswith("error:")
    assert (run.returncode == 2) if expect_error else (run.returncode == 0), printed[-3000:]
    want, have = words(shown), words(printed)
    assert is_subsequence(want, have), f"{where}: `{command}` printed\n{printed[-3000:]}"


def test_the_quickstart_is_two_make_targets() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quickstart") :].split("```")[1]
    commands = [ln.split("#")[0].strip() for ln in quick.splitlines()[1:] if ln.strip()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    # `make test` itself sets up the system packages its tests drive (not only CI)
    test_recipe = makefile[makefile.index("\ntest:") :].split("\n\n")[0]
    assert "system-packages" in test_recipe
    target = makefile[makefile.index("\nsystem-packages:") :].split("\n\n")[0]
    assert "scripts/system-packages" in target


def test_make_test_says_exactly_why_it_cannot_install_a_browser(tmp_path: Path) -> None:
    """Where Chromium is missing and cannot be installed (no apt-get here), the set-up says
    so, names the tests that will be skipped, and lets the suite run."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ls", "id"):  # what the script needs, and nothing it looks for
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    run = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "system-packages")],
                         env={"PATH": str(bin_dir)}, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0
    assert "chromium missing and no apt-get here" in run.stderr
    assert "dashboard's page tests will be skipped" in run.stderr


def test_the_word_comparison_can_fail() -> None:
    assert is_subsequence(words("fits: 56.9 of 80.0 GiB"), words("fits: 12 of 24 GiB per GPU"))
    assert not is_subsequence(words("fits: 56.9 of 80.0 GiB"), words("does not fit: 80 GiB"))
