"""Multi-node runs: where a node learns the job's shape (options, torchrun, SkyPilot, Slurm,
in that order), and launchers on loopback that meet at torch's c10d rendezvous as the
nodes of one job. `tests/test_train.py` trains across two such nodes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, signal_when

from frugal.errors import RESUMABLE_EXIT, FrugalError
from frugal.run.nodes import DEFAULT_PORT, Nodes, first_host, resolve

SKY = {
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NODE_RANK": "1",
    "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.9\n",
    "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    "SKYPILOT_TASK_ID": "sky-2026-11-26-12-00-00_frugal_1",
}
SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_JOB_NODELIST": "gpu[007-008]",
}
TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}


def test_one_machine_when_nothing_says_otherwise() -> None:
    nodes = resolve(env={})
    assert nodes == Nodes() and nodes.count == 1 and not nodes.worker


def test_skypilot_gives_the_head_the_rank_and_the_gpus() -> None:
    n = resolve(env=SKY)
    head = f"10.0.0.7:{DEFAULT_PORT}"
    assert (n.count, n.rank, n.endpoint, n.local_addr) == (2, 1, head, "10.0.0.9")
    assert n.source == "SkyPilot" and n.run_id == "sky-2026-11-26-12-00-00_frugal_1"
    assert n.per_node(16) == 8
    with pytest.raises(FrugalError, match=r"set job\.gpus=16"):
        n.per_node(8)  # 4 a node, but SkyPilot gave each node 8


def test_slurm_gives_the_first_host_of_the_node_list() -> None:
    n = resolve(env=SLURM)
    assert (n.count, n.rank, n.endpoint, n.run_id) == (2, 1, "gpu007:29500", "slurm-4242")
    assert first_host("gpu[003-004,010],cpu7") == "gpu003"
    assert first_host("a1,b[2-3]") == "a1" and first_host("rack[2-3]-n[01-04]") == "rack2-n01"


def test_slurm_with_a_task_per_gpu_is_refused() -> None:
    with pytest.raises(FrugalError, match="ntasks-per-node=1"):
        resolve(env={**SLURM, "SLURM_NTASKS": "16"})


def test_options_come_first_then_torchrun_then_skypilot_then_slurm() -> None:
    everything = {**SKY, **SLURM, **TORCHRUN}
    opts = resolve(2, 0, "127.0.0.1", 6000, env=everything)
    assert (opts.source, opts.rank, opts.endpoint, opts.local_addr) == (
        "--nnodes", 0, "127.0.0.1:6000", "127.0.0.1"  # loopback: every node is here
    )  # fmt: skip
    assert resolve(env=everything).worker  # torchrun started this process: no launching
    assert resolve(env={**SKY, **SLURM}).source == "SkyPilot"
    assert resolve(env=SLURM).source == "Slurm"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"node_rank": 1}, "need --nnodes"),
        ({"nnodes": 2}, "head node's address"),
        ({"nnodes": 2, "node_rank": 2, "master_addr": "h"}, "give 0 to 1"),
        ({"nnodes": 2, "rdzv_endpoint": "h"}, "HOST:PORT"),
        ({"nnodes": 2, "rdzv_endpoint": "h:1", "master_addr": "h"}, "or --master-addr"),
        ({"nnodes": 1, "node_rank": 3}, r"--node-rank 3: give 0 to 0"),  # it trained
        ({"nnodes": 0}, "--nnodes 0: give the number of machines"),
        ({"nnodes": 2, "master_addr": "h", "master_port": 70000}, "port from 1 to 65535"),
    ],
)
def test_bad_node_options_are_one_line(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(FrugalError, match=match):
        resolve(**kwargs, env={})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "match"),
    [  # each waited at the rendezvous until killed, or was an internal error
        ({**SLURM, "SLURM_JOB_NODELIST": "gpu[01-"}, "not a Slurm node list"),
        ({**SLURM, "SLURM_NODEID": "2"}, "SLURM_NODEID=2 is past the job's 2 nodes"),
        ({**SKY, "SKYPILOT_NUM_GPUS_PER_NODE": "0"}, "SkyPilot gave the nodes no GPU"),
        ({**SKY, "SKYPILOT_NODE_RANK": "2"}, "lists 2 nodes for SKYPILOT_NUM_NODES=2"),
        ({**SLURM, "SLURM_NODEID": "-1"}, "not a whole number"),
    ],
    ids=["nodelist-cut", "nodeid-past", "no-gpus", "sky-rank-past", "nodeid-negative"],
)
def test_launchers_environments_that_cannot_work_are_one_line(
    env: dict[str, str], match: str
) -> None:
    with pytest.raises(FrugalError, match=match):
        resolve(env=env)


def test_gpus_must_spread_evenly_over_the_nodes() -> None:
    with pytest.raises(FrugalError, match="multiple of 2"):
        resolve(2, 0, "h", env={}).per_node(3)


# each launcher is one "node": it meets the other at the rendezvous, then starts its workers
NODE = """
import sys
from pathlib import Path
from frugal.errors import FrugalError
from frugal.run.launch import launch
from frugal.run.nodes import resolve
count, rank, port, per, shared = sys.argv[1:6]
nodes = resolve(int(count), None if rank == "-" else int(rank), "127.0.0.1", int(port), env={})
try:
    sys.exit(launch(int(per), [], [sys.executable, "-c", sys.argv[6]], nodes=nodes,
                    shared=Path(shared)))
except FrugalError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
"""

WORKER = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
env = os.environ
line = (f"rank {env['RANK']} of {env['WORLD_SIZE']} local {env['LOCAL_RANK']} "
        f"node {env['GROUP_RANK']} sum {int(t.item())}\\n")
os.write(1, line.encode())  # one write: two workers' lines never interleave
dist.destroy_process_group()
"""


def nodes(
    ranks: list[str], per: int, dirs: list[Path], worker: str = WORKER
) -> list[subprocess.CompletedProcess[str]]:
    """Launchers for `ranks` ("-": the rendezvous picks), `per` workers each, run together."""
    port = str(free_port())
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NODE, str(len(ranks)), r, port, str(per), str(d), worker],
            **pipes,  # type: ignore[call-overload]
        )
        for r, d in zip(ranks, dirs, strict=True)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [["1", "0"], ["-", "-"]])
def test_two_launchers_meet_as_the_nodes_of_one_job(tmp_path: Path, ranks: list[str]) -> None:
    done = nodes(ranks, 2, [tmp_path, tmp_path])
    assert all(p.returncode == 0 for p in done), [p.stderr[-2000:] for p in done]
    lines = sorted(line for p in done for line in p.stdout.splitlines())
    # four processes in one process group: 1 + 2 + 3 + 4
    assert [ln.split()[1] for ln in lines] == ["0", "1", "2", "3"]
    assert all("of 4" in ln and ln.endswith("sum 10") for ln in lines)
    if ranks == ["1", "0"]:  # a node given its rank keeps it: the head holds ranks 0 and 1
        assert "rank 2 of 4 local 0 node 1" in done[0].stdout
        assert "rank 0 of 4 local 0 node 0" in done[1].stdout


@pytest.mark.slow
def test_nodes_that_claim_one_rank_or_see_different_directories_are_refused(
    tmp_path: Path,
) -> None:
    same = nodes(["1", "1"], 1, [tmp_path, tmp_path])
    assert [p.returncode for p in same] == [2, 2], [p.stderr[-2000:] for p in same]
    assert all("give each node its own --node-rank" in p.stderr for p in same), [
        p.stderr[-2000:] for p in same
    ]
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    apart = nodes(["0", "1"], 1, [a, b])
    assert [p.returncode for p in apart] == [2, 2], [p.stderr for p in apart]
    assert all("not the same directory on every node (node 1" in p.stderr for p in apart)
    assert not list(a.iterdir()) and not list(b.iterdir())  # nothing left behind


@pytest.mark.slow
def test_a_signal_while_waiting_for_the_other_nodes_ends_the_wait(tmp_path: Path) -> None:
    import socket

    def waiting() -> bool:  # the head hosts the rendezvous' store: it waits once that answers
        with socket.socket() as s, contextlib.suppress(OSError):
            s.connect(("127.0.0.1", port))
            return True
        return False

    port = free_port()
    argv = [sys.executable, "-c", NODE, "2", "0", str(port), "1", str(tmp_path), WORKER]
    rc, err, _ = signal_when(argv, waiting, signal.SIGTERM, timeout=30)
    assert rc == RESUMABLE_EXIT, err
    assert err.splitlines() == [
        "stopped by SIGTERM while waiting for the other nodes, before anything started: run "
        "the same command again on every node"
    ]


def test_a_rendezvous_left_before_its_node_had_a_rank_is_closed() -> None:
    """A node stopped while it waited (no rank yet) or refused at the join still closes
    its rendezvous handler: leave skipped shutdown() for a node without a rank."""
    from frugal.run.rendezvous import Rendezvous

    r = Rendezvous(resolve(2, 0, "127.0.0.1", free_port(), env={}))
    assert r.node_rank < 0 and not r.handler.is_closed()
    r.leave(wait=False)
    assert r.handler.is_closed() and r.closed
    r.leave(wait=False)  # twice is once


def test_only_an_exchange_whose_other_end_is_gone_counts_as_a_lost_peer() -> None:
    import torch.distributed as dist

    from frugal.run.recipe import peer_gone

    gloo = "[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:58507: Connection reset"
    assert peer_gone(RuntimeError(gloo))
    assert peer_gone(RuntimeError("Timed out waiting 6000ms for recv operation to complete"))
    assert peer_gone(dist.DistNetworkError("failed to connect"))
    assert not peer_gone(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not peer_gone(ValueError("Connection reset"))  # not an exchange's error
