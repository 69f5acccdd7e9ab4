"""The multi-GPU launcher (`frugal.run.launch`) with tiny workers: each worker's exit code
becomes the launcher's, one-line errors are shown once, torch's noise is held back, and
SIGTERM/SIGINT go on to the workers, which are left to finish however long that takes.
`tests/test_train.py` runs it end to end (two gloo processes training, stopped, resumed)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import signal_when

from frugal.errors import RESUMABLE_EXIT
from frugal.run.launch import launch

# argv[1 + RANK] is the worker's exit code; a few lines on stdout and stderr first
CODES = """
import os, sys, time
rank = int(os.environ["RANK"])
env = os.environ
line = f"out {rank} {env['WORLD_SIZE']} {env['LOCAL_RANK']} {sys.argv[1:]}\\n"
os.write(1, line.encode())  # one write: two workers' lines never interleave
print("[W1019 10:11:12.131415 ProcessGroupGloo.cpp:1] torch's noise", file=sys.stderr)
print(f"a warning from {rank}", file=sys.stderr)
code = sys.argv[1 + rank]
if code == "error":
    print("error: data.path: no such file", file=sys.stderr)
    sys.exit(2)
if code == "crash":
    raise ValueError("boom")
if code == "hang":
    time.sleep(600)
time.sleep(0.5 * (1 - rank))  # rank 0 ends last: the launcher waits for it
sys.exit(int(code))
"""


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = launch(2, list(argv), [sys.executable, "-c", CODES])
    out, err = capfd.readouterr()
    return rc, out, err


def test_both_succeed(capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capfd, "0", "0", "--debug")
    assert rc == 0, err
    # each worker has its rank, the world size and the arguments less --debug
    assert "out 0 2 0 ['0', '0']" in out and "out 1 2 1 ['0', '0']" in out
    assert "a warning from 0" in err and "a warning from 1" in err
    assert "noise" not in err and "torch.distributed" not in err


@pytest.mark.parametrize("codes", [("0", "75"), ("75", "0"), ("75", "75")])
def test_one_stopped_resumably_gives_75(
    capfd: pytest.CaptureFixture[str], codes: tuple[str, str]
) -> None:
    rc, _, err = run(capfd, *codes)
    assert rc == RESUMABLE_EXIT, err
    assert "noise" not in err and "exited with" not in err


def test_a_one_line_error_is_shown_once(capfd: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capfd, "error", "error")
    assert rc == 2
    assert err.count("error: data.path: no such file") == 1
    assert "noise" not in err and "Traceback" not in err


def test_a_crash_gives_1_with_the_tail(capfd: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    rc, _, err = run(capfd, "hang", "crash")
    # the crashed worker's peer is stopped (SIGTERM), not waited for
    assert rc == 1 and time.monotonic() - start < 60
    assert "ValueError: boom" in err and "process 1 exited with code 1" in err
    assert "process 0 was stopped by signal SIGTERM" in err
    # the launcher's own torch logging is not shown
    assert "Sending process" not in err and "closing signal" not in err


# stops on the first SIGTERM/SIGINT; rank 0 "writes its checkpoint" for 2 s after rank 1 has
# exited 75, and writes down every signal it got
SLOW_STOP = """
import os, signal, sys, time
from pathlib import Path
rank, out = int(os.environ["RANK"]), Path(sys.argv[1])
got = []
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, lambda n, f: got.append(n))
(out / f"ready{rank}").touch()
while not got:
    time.sleep(0.01)
time.sleep(2.0 if rank == 0 else 0.0)
(out / f"saved{rank}").write_text(" ".join(map(str, got)))
sys.exit(75)
"""


def ready(out: Path) -> bool:
    """Both workers have started (each touched its file)."""
    return all((out / f"ready{r}").exists() for r in (0, 1))


LAUNCHER = "import sys; from frugal.run.launch import launch; sys.exit(launch(2, sys.argv[2:], [sys.executable, '-c', sys.argv[1]]))"  # noqa: E501


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_goes_to_the_workers_who_finish_in_their_own_time(
    tmp_path: Path, sig: signal.Signals
) -> None:
    rc, err, sent = signal_when(
        [sys.executable, "-c", LAUNCHER, SLOW_STOP, str(tmp_path)], lambda: ready(tmp_path), sig
    )
    assert rc == RESUMABLE_EXIT, err
    assert time.monotonic() - sent >= 2.0  # the launcher waited for rank 0
    # each got the signal once: rank 1's exit did not make the launcher stop rank 0
    assert (tmp_path / "saved0").read_text() == (tmp_path / "saved1").read_text() == str(sig)
    assert err == ""


# a worker still starting: no handler of its own yet, so a signal ends it outright
STARTING = """
import os, sys, time
from pathlib import Path
(Path(sys.argv[1]) / f"ready{os.environ['RANK']}").touch()
time.sleep(600)
"""


@pytest.mark.slow
def test_a_signal_while_the_workers_start_is_resumable(tmp_path: Path) -> None:
    rc, err, _ = signal_when(
        [sys.executable, "-c", LAUNCHER, STARTING, str(tmp_path)],
        lambda: ready(tmp_path),
        signal.SIGTERM,
    )
    assert rc == RESUMABLE_EXIT, err
    assert err == (
        "stopped by SIGTERM while the processes were starting, before training began: run "
        "the same command again\n"
    )


# a real gloo process group on the launcher's store
ALL_REDUCE = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
if dist.get_rank() == 0:
    print("sum", int(t.item()), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_workers_form_a_process_group(capfd: pytest.CaptureFixture[str]) -> None:
    rc = launch(2, [], [sys.executable, "-c", ALL_REDUCE])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert "sum 3" in out
