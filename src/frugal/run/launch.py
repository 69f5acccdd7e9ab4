"""One process per GPU for `frugal train` with `job.gpus > 1`, through torch's elastic
multiprocessing API (`start_processes`), as torchrun does it but without its agent. On one
machine the launcher hosts the c10d store on a free port of localhost; on several
(`frugal.run.nodes`) each node's launcher first joins torch's elastic c10d rendezvous at the
head node (`frugal.run.rendezvous`). Then it starts its workers (`python -m
frugal.cli.main` with the same arguments; gloo on CPU, NCCL on CUDA is theirs to choose)
and reads each one's exit code from torch's result.

- SIGTERM/SIGINT to the launcher go straight to the workers, which checkpoint and stop
  however long that takes: the launcher waits for every worker to exit by itself. (torch's
  agent would give them 30 s, then kill them; its process context does that as soon as one
  worker exits non-zero, so it is asked for the result only once all have exited, or once
  one has failed outright: then the others are stopped its way, SIGTERM, then SIGKILL.)
  One that comes while a node waits for the others at the rendezvous ends the wait: exit
  75, nothing started.
- The exit code is the workers': 0 if all succeeded, 75 (RESUMABLE_EXIT) if any stopped
  resumably (or a stop signal passed on ended one still starting), 2 if one printed a
  one-line `error: ...` (each distinct line shown once, not once per worker), else 1 with
  a short tail of what failed.
- The workers' stderr goes to files the launcher follows: their own lines are shown as they
  come, torch's C++ log lines and Python tracebacks are held back (shown only on exit 1),
  and torch's own logging in the launcher is silenced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any

import psutil

from frugal.errors import RESUMABLE_EXIT, FrugalError
from frugal.run.interrupt import LAUNCHER
from frugal.run.nodes import Nodes
from frugal.run.rendezvous import Rendezvous

STOPS = (signal.SIGTERM, signal.SIGINT)  # passed on to the workers
TORCH_HANDLES = "SIGHUP,SIGQUIT"  # left to torch: it stops the workers with them
NOISE = re.compile(r"^(\[rank\d+\]:)?(\[?[WEIF]\d{4} |\[[WEIF] |torch\.distributed)")
TAIL = 40  # lines of held output shown when a worker failed
POLL_S = 0.1


def launch(
    n: int,
    argv: Sequence[str],
    worker: Sequence[str] | None = None,
    nodes: Nodes | None = None,
    hold: Callable[[int], AbstractContextManager[Any]] | None = None,
    shared: Path | None = None,
) -> int:
    """Run `worker` (default `python -m frugal.cli.main`) with `argv` (less `--debug`) in
    `n` processes on this machine, of `nodes` (one, this one, by default); returns the exit
    code for the launcher (see above). `hold(node rank)` is held while the workers run;
    `shared` is a directory every node must see as the same (the run's output)."""

    from torch.distributed import TCPStore

    nodes = nodes or Nodes()
    with _quiet_torch(), _Forward() as forward:
        if nodes.count > 1:
            met = _meet(nodes, n, forward)
            if met is None:
                return RESUMABLE_EXIT
            rdzv, same = met
            rank = rdzv.node_rank
        else:
            rdzv, rank = None, 0
            store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # free port
            same = {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(store.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",  # the workers join the launcher's store
                "TORCHELASTIC_RUN_ID": uuid.uuid4().hex,
                "WORLD_SIZE": str(n),
            }
        code = 1
        try:
            with contextlib.ExitStack() as held:
                if hold is not None:
                    try:
                        held.enter_context(hold(rank))
                    except FrugalError as e:
                        if rdzv is not None:
                            rdzv.refuse(str(e))  # the other nodes stop with this node's reason
                        raise
                if rdzv is not None and shared is not None:
                    rdzv.check_shared(shared)
                code = _run(n, argv, worker, rank, same, forward)
                return code
        finally:
            if rdzv is not None:
                rdzv.leave(wait=code == 0)


def _meet(nodes: Nodes, n: int, forward: _Forward) -> tuple[Rendezvous, dict[str, str]] | None:
    """This node's rendezvous with the others and the environment its workers share; None
    when a stop signal ended the wait (said). The wait can only be cut by raising from the
    signal handler (torch's rendezvous blocks): whatever it cuts, or refuses, the
    rendezvous is shut down (its store and keep-alive, even before this node has a rank)."""
    rdzv = None
    try:
        with forward.ending_the_wait():
            rdzv = Rendezvous(nodes)
            return rdzv, rdzv.join(n)
    except BaseException as e:
        if rdzv is not None:
            rdzv.leave(wait=False)
        if not isinstance(e, _Stopped):
            raise
        why = f"stopped by {e.name} while waiting for the other nodes"
        print(
            f"{why}, before anything started: run the same command again on every node",
            file=sys.stderr,
        )
        return None


def _run(
    n: int,
    argv: Sequence[str],
    worker: Sequence[str] | None,
    node: int,
    same: dict[str, str],
    forward: _Forward,
) -> int:
    """The `n` workers of node `node`, started and waited for; `forward` passes the stop
    signals on to them."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, start_processes

    cmd = list(worker or (sys.executable, "-m", "frugal.cli.main"))
    args = (*cmd[1:], *(a for a in argv if a != "--debug"))
    same = {
        **same,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "LOCAL_WORLD_SIZE": str(n),
        "GROUP_RANK": str(node),
        LAUNCHER: str(os.getpid()),  # a worker whose launcher is killed stops (orphaned)
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),  # as torchrun: not N x cores
    }
    envs = {r: {**same, "RANK": str(node * n + r), "LOCAL_RANK": str(r)} for r in range(n)}
    logs = tempfile.mkdtemp(prefix="frugal-launch-")
    try:
        with _env("TORCHELASTIC_SIGNALS_TO_HANDLE", TORCH_HANDLES):  # read at the start
            pc = start_processes(
                name="frugal",
                entrypoint=cmd[0],
                args=dict.fromkeys(range(n), args),
                envs=envs,
                logs_specs=DefaultLogsSpecs(log_dir=logs, redirects=Std.ERR),
            )
        procs = {r: psutil.Process(pid) for r, pid in pc.pids().items()}
        forward.to(list(procs.values()))
        err = _Stderr(pc.stderrs)
        try:
            codes = _wait(pc, procs, err)
        finally:
            err.close()
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    return _launcher_code(codes, forward, err)


def _launcher_code(codes: dict[int, int], forward: _Forward, err: _Stderr) -> int:
    """The launcher's exit code from its workers' (0, resumable, bad input, a bug)."""
    if all(c == 0 for c in codes.values()):
        return 0
    # a worker that a stop signal passed on to ended outright was still starting (its own
    # handler checkpoints and exits 75): nothing of the run had begun there
    early = {r for r, c in codes.items() if -c in forward.sent}
    if RESUMABLE_EXIT in codes.values() or early:
        if early and RESUMABLE_EXIT not in codes.values():
            names = sorted({signal.Signals(-codes[r]).name for r in early})
            print(
                f"stopped by {', '.join(names)} while the processes were starting, before "
                "training began: run the same command again",
                file=sys.stderr,
            )
        return RESUMABLE_EXIT
    if err.errors:
        return 2
    err.report(codes)
    return 1


def _wait(pc: Any, procs: dict[int, psutil.Process], err: _Stderr) -> dict[int, int]:
    """Every worker's exit code, by local rank, once all have exited: as long as each exits
    0 or 75, the others are left to finish however long that takes; once one fails
    otherwise, torch's process context stops the rest (SIGTERM, then SIGKILL after 30 s)."""

    from torch.distributed.elastic.multiprocessing import SignalException

    try:
        while True:
            time.sleep(POLL_S)
            err.pump()
            codes = [_exit_code(p) for p in procs.values()]
            if None not in codes:
                break
            if any(c not in (None, 0, RESUMABLE_EXIT) for c in codes):
                break  # failed outright: the others are stopped below
    except SignalException as e:  # SIGHUP/SIGQUIT: torch's own handling
        pc.close(e.sigval)
    result = pc.wait(period=POLL_S)  # reaps them all (stopping any still running)
    err.pump()
    return {r: 0 for r in procs} | {r: f.exitcode for r, f in result.failures.items()}


def _exit_code(p: psutil.Process) -> int | None:
    """A worker's exit code once it has exited (None while it runs), read without reaping
    it: torch reads it again for the result. Where os.waitid is missing (macOS before
    Python 3.13), 0 for any exit: the others are then always left to finish."""

    if hasattr(os, "waitid"):
        st = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if st is None:
            return None
        return st.si_status if st.si_code == os.CLD_EXITED else -st.si_status
    with contextlib.suppress(psutil.NoSuchProcess):
        if p.status() != psutil.STATUS_ZOMBIE:
            return None
    return 0


class _Stopped(Exception):
    """A stop signal that ended this node's wait for the others."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name


class _Forward:
    """SIGTERM/SIGINT to the launcher, passed on to each worker (each runs in a session of
    its own, so a Ctrl-C in the terminal reaches the launcher alone). One that comes before
    the workers exist is passed on as soon as they do; one that comes while the node waits
    at the rendezvous ends the wait (`_Stopped`)."""

    def __init__(self) -> None:
        self.procs: list[psutil.Process] = []
        self.pending: list[int] = []
        self.sent: set[int] = set()  # the signals passed on
        self.waiting = False
        self.old: dict[int, Any] = {}

    def __enter__(self) -> _Forward:
        for name in TORCH_HANDLES.split(","):  # torch's handlers go when the launcher does
            s = getattr(signal, name)
            self.old[s] = signal.getsignal(s)
        for s in STOPS:
            self.old[s] = signal.signal(s, self._handle)
        return self

    @contextlib.contextmanager
    def ending_the_wait(self) -> Iterator[None]:
        """A block a stop signal ends (`_Stopped`), including one that came before it."""
        if self.pending:
            raise _Stopped(self.pending[0])
        self.waiting = True
        try:
            yield
        finally:
            self.waiting = False

    def to(self, procs: list[psutil.Process]) -> None:
        self.procs = procs
        for s in self.pending:
            self._handle(s, None)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.waiting:
            self.waiting = False  # once: a second signal is passed on as usual
            raise _Stopped(signum)
        if not self.procs:
            self.pending.append(signum)
            return
        self.sent.add(signum)
        for p in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signum)

    def __exit__(self, *exc: Any) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """torch's elastic logging (process starts, closing signals, failures) is not shown."""

    log = logging.getLogger("torch.distributed.elastic")
    null = logging.NullHandler()
    propagate = log.propagate
    log.addHandler(null)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(null)
        log.propagate = propagate


class _Stderr:
    """The workers' stderr, followed in the files torch writes it to."""

    def __init__(self, paths: dict[int, str]) -> None:
        self.files: dict[int, IO[str]] = {
            r: open(p, encoding="utf-8", errors="replace")  # noqa: SIM115
            for r, p in paths.items()
        }
        self.partial = dict.fromkeys(self.files, "")
        self.traced: set[int] = set()  # workers that printed a traceback: the rest is held
        self.held: list[str] = []
        self.errors: list[str] = []

    def pump(self) -> None:
        for r, f in self.files.items():
            text = self.partial[r] + f.read()
            lines = text.splitlines(keepends=True)
            self.partial[r] = lines.pop() if lines and not lines[-1].endswith("\n") else ""
            for line in lines:
                self._line(r, line)
        sys.stderr.flush()

    def _line(self, rank: int, line: str) -> None:
        if line.startswith("error: "):
            if line not in self.errors:  # every worker prints the same one-line error
                self.errors.append(line)
                sys.stderr.write(line)
        elif rank in self.traced or NOISE.match(line):
            self.held.append(f"[{rank}] {line}")
        elif line.startswith("Traceback (most recent call last)"):
            self.traced.add(rank)
            self.held.append(f"[{rank}] {line}")
        else:
            sys.stderr.write(line)

    def report(self, codes: dict[int, int]) -> None:
        sys.stderr.write("".join(self.held[-TAIL:]))
        for r, c in sorted(codes.items()):
            if c > 0:
                sys.stderr.write(f"process {r} exited with code {c}\n")
            elif c < 0:
                name = signal.Signals(-c).name if -c in signal.valid_signals() else -c
                sys.stderr.write(f"process {r} was stopped by signal {name}\n")

    def close(self) -> None:
        for r, rest in self.partial.items():
            if rest:
                self._line(r, rest + "\n")
        for f in self.files.values():
            f.close()
