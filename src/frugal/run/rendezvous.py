"""How the nodes of one job meet (`frugal train --nnodes N`): torch's elastic c10d
rendezvous at the head node, each node's rank and processes compared, the shared output
directory checked on every node, and a finished node's wait for the others to be done with
the store it hosts. `launch.py` runs a node's workers once its nodes have met."""

from __future__ import annotations

import contextlib
import uuid
from datetime import timedelta
from pathlib import Path

from frugal.errors import FrugalError
from frugal.run.nodes import Nodes

JOIN_TIMEOUT_S = 600  # torchrun's: how long the rendezvous waits for every node
DONE_WAIT_S = 60  # how long a finished node keeps the rendezvous store up for the others
REFUSED = "refused: "  # a node's answer in check_shared when it will not start


class Rendezvous:
    """This node's place in a multi-node job, from torch.distributed's elastic c10d
    rendezvous at the head node (torchrun's `--rdzv-backend c10d`).

    The rendezvous numbers the nodes in an order of its own; a node given its rank
    (`--node-rank`, SkyPilot's, Slurm's) keeps it, so that node 0, the head, holds rank 0
    (the one that writes the run's summary and books), and two nodes that claim one rank
    are refused. The workers join the store the rendezvous shares (as torchrun's do). A
    node that completed the run waits, for a while, for the others to be done with that
    store (`leave`)."""

    def __init__(self, nodes: Nodes) -> None:
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        self.nodes = nodes
        # the node whose address is the endpoint's hosts the store (on loopback, the first)
        params = RendezvousParameters(
            backend="c10d",
            endpoint=nodes.endpoint,
            run_id=nodes.run_id,
            min_nodes=nodes.count,
            max_nodes=nodes.count,
            local_addr=nodes.local_addr,
            join_timeout=JOIN_TIMEOUT_S,
        )
        self.handler = get_rendezvous_handler(params)
        self.node_rank = -1
        self.closed = False

    def join(self, n: int) -> dict[str, str]:
        """Wait for every node; the environment every worker of this node shares."""
        from torch.distributed.elastic.rendezvous import RendezvousError

        nodes = self.nodes
        try:
            info = self.handler.next_rendezvous()
        except RendezvousError as e:
            raise FrugalError(
                f"the rendezvous at {nodes.endpoint} did not gather {nodes.count} nodes in "
                f"{JOIN_TIMEOUT_S} s ({str(e).splitlines()[0][:160]}): start frugal train on "
                "every node, with the same --nnodes and the head's address"
            ) from None
        self.store = info.store
        self.group = info.rank
        rank = nodes.rank if nodes.rank is not None else info.rank
        said = self._exchange(f"{rank} {n}")
        ranks, procs = sorted(int(r) for r, _ in said), {int(p) for _, p in said}
        if ranks != list(range(nodes.count)):
            raise FrugalError(
                f"the {nodes.count} nodes gave node ranks {ranks}: give each node its own "
                f"--node-rank, 0 to {nodes.count - 1}"
            )
        if len(procs) > 1:
            raise FrugalError(
                f"the nodes would start {sorted(procs)} processes each: give every node the "
                "same run config (job.gpus) and --nnodes"
            )
        self.node_rank = rank
        boot = info.bootstrap_store_info
        assert boot is not None  # the c10d rendezvous shares its store
        return {
            "MASTER_ADDR": boot.master_addr,
            "MASTER_PORT": str(boot.master_port),
            "TORCHELASTIC_USE_AGENT_STORE": str(self.handler.use_agent_store),
            "TORCHELASTIC_RUN_ID": self.handler.get_run_id(),
            "WORLD_SIZE": str(nodes.count * n),
            "GROUP_WORLD_SIZE": str(nodes.count),
        }

    def _exchange(self, mine: str) -> list[list[str]]:
        """Every node's "rank processes", `mine` among them; no node leaves (a refusal ends
        the store it hosts) before all have read them: a node still reading lost it. Once
        a node has read them all, the store may go (the host saw every node's read mark
        and left): the wait's answer is not needed."""
        store, count = self.store, self.nodes.count
        try:
            store.set(f"frugal/node/{self.group}", mine)
            said = [store.get(f"frugal/node/{g}").decode().split() for g in range(count)]
        except Exception as e:  # the store's host stopped: its own message says why
            raise FrugalError(
                f"the node hosting the rendezvous stopped ({str(e)[:80]}): see "
                "its message, then start every node again"
            ) from None
        with contextlib.suppress(Exception):
            store.set(f"frugal/read/{self.group}", "1")
            store.wait([f"frugal/read/{g}" for g in range(count)], timedelta(seconds=60))
        return said

    def _key(self, rank: int) -> str:
        """Where node `rank` says what it saw of the shared directory (the head: its token)."""
        return "frugal/shared" if rank == 0 else f"frugal/seen/{rank}"

    def refuse(self, why: str) -> None:
        """This node will not start (`why`, its one-line error): the others are told
        where they wait for it (`check_shared`), and stop with the same reason."""
        with contextlib.suppress(Exception):  # the others may be gone already
            self.store.set(self._key(self.node_rank), REFUSED + why)

    def check_shared(self, path: Path) -> None:
        """Every node sees the head's files in `path` (checkpoints are written there shard
        by shard, by every node), or every node refuses to start."""
        mark = path / f".frugal-nodes-{self.nodes.run_id}"
        if self.node_rank == 0:
            token = uuid.uuid4().hex
            mark.write_text(token)
            self.store.set(self._key(0), token)
        else:
            token = self._said([0])[0]
            seen = mark.is_file() and mark.read_text() == token
            self.store.set(self._key(self.node_rank), "yes" if seen else "no")
        others = list(range(1, self.nodes.count))
        said = self._said(others)  # waits for every node's answer
        blind = [str(r) for r, v in zip(others, said, strict=True) if v != "yes"]
        if self.node_rank == 0:
            mark.unlink(missing_ok=True)
        if blind:
            raise FrugalError(
                f"output_dir {path} is not the same directory on every node (node "
                f"{', '.join(blind)} does not see node 0's files there): put it on storage "
                "all nodes share (a mounted bucket, NFS), as every node writes its checkpoint "
                "shards there"
            )

    def _said(self, ranks: list[int]) -> list[str]:
        """What nodes `ranks` said in `check_shared`, once they have; a node that refused
        to start, or is gone, stops this one with a line that says so."""
        from torch.distributed import DistError

        try:
            said = [v.decode() for v in self.store.multi_get([self._key(r) for r in ranks])]
        except DistError as e:
            raise FrugalError(
                f"a node stopped before the run began ({str(e).splitlines()[0][:120]}): see "
                "its output, then run the same command again on every node"
            ) from None
        for r, v in zip(ranks, said, strict=True):
            if v.startswith(REFUSED):
                raise FrugalError(f"node {r} refused to start: {v[len(REFUSED) :]}")
        return said

    def leave(self, wait: bool) -> None:
        """Done here. With `wait` (this node completed the run), wait a while for the other
        nodes to complete theirs, as their workers may still use the store this node hosts;
        a node that stopped (a signal, a lost peer) has agreed with the others to stop and
        does not wait for nodes that may be gone. Then close the rendezvous, always: a node
        stopped before it had a rank (or before it met the others) closes it too."""
        if self.node_rank >= 0:
            with contextlib.suppress(Exception):  # a node that is gone has nothing to use
                self.store.set(f"frugal/done/{self.group}", "1")
                if wait:
                    done = [f"frugal/done/{g}" for g in range(self.nodes.count)]
                    self.store.wait(done, timedelta(seconds=DONE_WAIT_S))
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.handler.shutdown()
