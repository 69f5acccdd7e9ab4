"""Which machines a run spans, and this one's place among them.

`frugal train` reads a multi-node job from the first of these that says anything:

1. its options: `--nnodes`, `--node-rank`, `--master-addr`, `--master-port`, or
   `--rdzv-endpoint HOST:PORT` (without a node rank, the rendezvous numbers the nodes);
2. torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`): torchrun started this process
   as one of its workers, so it trains and launches nothing;
3. SkyPilot's (`SKYPILOT_NUM_NODES`, `SKYPILOT_NODE_RANK`, `SKYPILOT_NODE_IPS`, head node
   first; `SKYPILOT_NUM_GPUS_PER_NODE`; `SKYPILOT_TASK_ID` names the rendezvous);
4. Slurm's (`SLURM_JOB_NUM_NODES`, `SLURM_NODEID`, `SLURM_JOB_NODELIST`, whose first host is
   the head; `SLURM_JOB_ID` names the rendezvous), with one task per node: frugal starts a
   process per GPU itself.

Every node then joins torch.distributed's elastic c10d rendezvous at the head node
(`frugal.run.launch`).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from frugal.errors import FrugalError

DEFAULT_PORT = 29500  # torchrun's


@dataclass(frozen=True)
class Nodes:
    """The machines of one run. `rank` is this node's (None: the rendezvous numbers the
    nodes in the order it likes); `endpoint` the head node's HOST:PORT, where the
    rendezvous is held; `gpus_per_node` what the launcher of the job says each node has."""

    count: int = 1
    rank: int | None = None
    endpoint: str = ""
    run_id: str = "frugal"
    local_addr: str | None = None  # this node's address, as the others reach it
    gpus_per_node: int | None = None
    source: str = ""  # what said so: "--nnodes", "torchrun", "SkyPilot", "Slurm"
    worker: bool = False  # torchrun's worker: the process trains, launches nothing

    @property
    def host(self) -> str:
        return self.endpoint.rsplit(":", 1)[0].strip("[]")

    @property
    def loopback(self) -> bool:
        """Every node on this machine (a test, or a rehearsal on one box)."""
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    def per_node(self, gpus: int) -> int:
        """Processes on each node for `gpus` in all (job.gpus), refused with one line where
        they do not divide or disagree with the launcher's count."""
        if gpus % self.count:
            raise FrugalError(
                f"job.gpus={gpus} cannot be spread over {self.count} nodes ({self.source}): "
                f"set job.gpus to the GPUs of all nodes together, a multiple of {self.count}"
            )
        here = gpus // self.count
        if self.gpus_per_node is not None and self.gpus_per_node != here:
            raise FrugalError(
                f"job.gpus={gpus} over {self.count} nodes is {here} a node, but {self.source} "
                f"gives each node {self.gpus_per_node}: set "
                f"job.gpus={self.gpus_per_node * self.count}"
            )
        return here

    def line(self, gpus: int) -> str:
        """What `frugal train` says once at the start of a multi-node run."""
        which = f"node {self.rank}" if self.rank is not None else "a node the rendezvous numbers"
        here = self.per_node(gpus)
        return (
            f"{self.count} nodes ({self.source}): this is {which}, {here} "
            f"process{'es' if here > 1 else ''} here, {gpus} in all; rendezvous {self.run_id} "
            f"at {self.endpoint}"
        )


def resolve(
    nnodes: int | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Nodes:
    """The nodes of this run, from the options or else the environment (see the module)."""
    env = os.environ if env is None else env
    given = (nnodes, node_rank, master_addr, master_port, rdzv_endpoint)
    if any(v is not None for v in given):
        return _from_options(nnodes, node_rank, master_addr, master_port, rdzv_endpoint, rdzv_id)
    if all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return Nodes(source="torchrun", worker=True)
    if "SKYPILOT_NUM_NODES" in env:
        return _from_skypilot(env, rdzv_id)
    if "SLURM_JOB_ID" in env and ("SLURM_JOB_NUM_NODES" in env or "SLURM_NNODES" in env):
        return _from_slurm(env, rdzv_id)
    return Nodes()


def _from_options(
    nnodes: int | None,
    node_rank: int | None,
    master_addr: str | None,
    master_port: int | None,
    rdzv_endpoint: str | None,
    rdzv_id: str | None,
) -> Nodes:
    if nnodes is None:
        raise FrugalError("--node-rank, --master-addr and --rdzv-endpoint need --nnodes N")
    if nnodes < 1:
        raise FrugalError(f"--nnodes {nnodes}: give the number of machines, 1 or more")
    if rdzv_endpoint is not None and (master_addr is not None or master_port is not None):
        raise FrugalError("give --rdzv-endpoint HOST:PORT, or --master-addr and --master-port")
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise FrugalError(f"--node-rank {node_rank}: give 0 to {nnodes - 1} (0 is the head)")
    if master_port is not None and not 0 < master_port < 65536:
        raise FrugalError(f"--master-port {master_port}: give a port from 1 to 65535")
    if nnodes == 1:
        return Nodes(source="--nnodes")
    if rdzv_endpoint is None:
        if master_addr is None:
            raise FrugalError(
                f"--nnodes {nnodes}: give the head node's address (--master-addr HOST, and "
                "--node-rank on each node), or --rdzv-endpoint HOST:PORT"
            )
        rdzv_endpoint = f"{master_addr}:{master_port or DEFAULT_PORT}"
    _endpoint(rdzv_endpoint, "--rdzv-endpoint")
    return _local(Nodes(nnodes, node_rank, rdzv_endpoint, rdzv_id or "frugal", source="--nnodes"))


def _from_skypilot(env: Mapping[str, str], rdzv_id: str | None) -> Nodes:
    count = _int(env, "SKYPILOT_NUM_NODES")
    if count <= 1:
        return Nodes(source="SkyPilot")
    ips = env.get("SKYPILOT_NODE_IPS", "").split()
    rank = _int(env, "SKYPILOT_NODE_RANK")
    if len(ips) != count or not 0 <= rank < count:
        raise FrugalError(
            f"SkyPilot's SKYPILOT_NODE_IPS lists {len(ips)} nodes for SKYPILOT_NUM_NODES="
            f"{count} (node rank {rank}): run frugal train from the task's run section"
        )
    gpus = "SKYPILOT_NUM_GPUS_PER_NODE"
    per_node = _int(env, gpus) if gpus in env else None
    if per_node == 0:
        raise FrugalError(
            f"{gpus}=0: SkyPilot gave the nodes no GPU; ask for them in the task's resources "
            "(accelerators: H100:8), or run frugal train on one machine"
        )
    run_id = rdzv_id or _safe_id(env.get("SKYPILOT_TASK_ID", "frugal"))
    endpoint = f"{ips[0]}:{_port(env)}"
    return Nodes(count, rank, endpoint, run_id, ips[rank], per_node or None, "SkyPilot")


def _from_slurm(env: Mapping[str, str], rdzv_id: str | None) -> Nodes:
    count = _int(env, "SLURM_JOB_NUM_NODES" if "SLURM_JOB_NUM_NODES" in env else "SLURM_NNODES")
    if count <= 1:
        return Nodes(source="Slurm")
    tasks = env.get("SLURM_NTASKS")
    if tasks is not None and tasks.isdigit() and int(tasks) > count:
        raise FrugalError(
            f"Slurm started {tasks} tasks on {count} nodes: run one task a node (srun "
            "--ntasks-per-node=1 frugal train ...); frugal starts a process per GPU itself"
        )
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not nodelist:
        raise FrugalError("Slurm's SLURM_JOB_NODELIST is not set: run frugal train under srun")
    rank = _int(env, "SLURM_NODEID")
    if rank >= count:
        raise FrugalError(
            f"SLURM_NODEID={rank} is past the job's {count} nodes (0 to {count - 1}): run "
            "frugal train under srun in the job, not with Slurm's variables set by hand"
        )
    run_id = rdzv_id or f"slurm-{_safe_id(env['SLURM_JOB_ID'])}"
    endpoint = f"{first_host(nodelist)}:{_port(env)}"
    return _local(Nodes(count, rank, endpoint, run_id, source="Slurm"))


# a Slurm host list: names with bracketed ranges, comma-separated (gpu[003-004,010],cpu7)
_RANGES = r"\[\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\]"
_HOST = rf"(?:[A-Za-z0-9_.-]|{_RANGES})+"
NODELIST = re.compile(rf"{_HOST}(?:,{_HOST})*")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list, as `scontrol show hostnames` would print it first:
    `gpu[003-004,010],cpu7` gives gpu003 (the zero-padding kept). A list that is not one
    (cut short, `gpu[01-`) is one line."""
    if not NODELIST.fullmatch(nodelist.strip()):
        raise FrugalError(
            f"SLURM_JOB_NODELIST={nodelist!r} is not a Slurm node list (e.g. gpu[01-04],cpu7): "
            "run frugal train under srun in the job"
        )
    head = re.split(r",(?![^\[]*\])", nodelist.strip(), maxsplit=1)[0]
    m = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", head)
    if not m:
        return head
    first = m.group(2).split(",")[0].split("-")[0]
    return m.group(1) + first + (first_host(m.group(3)) if m.group(3) else "")


def _local(nodes: Nodes) -> Nodes:
    """On loopback every node is this machine: it is reached at the same address."""
    return replace(nodes, local_addr=nodes.host) if nodes.loopback else nodes


def _endpoint(value: str, what: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FrugalError(f"{what} {value!r}: give HOST:PORT, e.g. 10.0.0.1:{DEFAULT_PORT}")


def _port(env: Mapping[str, str]) -> int:
    """The rendezvous port: MASTER_PORT where the job's script sets it, else torchrun's."""
    value = env.get("MASTER_PORT", "")
    return int(value) if value.isdigit() else DEFAULT_PORT


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    if not value.strip().isdigit():
        raise FrugalError(f"{name}={value!r} is not a whole number: check the job's launcher")
    return int(value)


def _safe_id(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", value)[:64] or "frugal"
