"""`ps` and `dtf` on hosts of several GPUs: a host's workers sum their gradients inside it and push once per host.

One set of 6 spawned gloo ranks (4 workers on 2 hosts of 2, and 2 PS ranks) runs every case in turn: the update
is single-process SGD's on the global batch, the bytes the ranks send are the analytic volume, and the bytes that
leave each host are :func:`ralp_pipe.engine.volume.push_pull_link_bytes`'. Modelled (`priced`) cases move a token
inside each host instead of the bucket, count the bucket's bytes, and their leaders wait the priced time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import pytest
import torch
import torch.distributed as dist

from ralp_pipe.config import strategy_kind
from ralp_pipe.contract.topology import Topology, on_hosts, placed, topology
from ralp_pipe.engine import volume
from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.dilation import WORKER, Pacer, Targets
from ralp_pipe.engine.strategies import Optim, StepSetup, build
from ralp_pipe.engine.strategies.base import Piece, assemble, loss_fn
from support.spawn import spawn_function
from test_dtf_engine import BATCH, SIZE, _batch, _units  # its small VGG-shaped stack of unequal variables

OPTIM = Optim(lr=0.05, momentum=0.9, weight_decay=1e-3)
WORKERS, GPUS_PER_NODE, WORLD = 4, 2, 6
PRICED_S = 0.5  # a priced case's interconnect time for the host's sum of the whole model, each direction


@dataclass(frozen=True)
class Case:
    strategy: str
    overlap: bool = True
    variable_update: str = "distributed_replicated"
    priced: bool = False  # modelled: the transfers inside a host are priced and waited for, not copied

    @property
    def key(self) -> str:
        mode = "-priced" if self.priced else ""
        return f"{self.strategy}-{'overlap' if self.overlap else 'sequential'}-{self.variable_update}{mode}"

    @property
    def summed(self) -> bool:
        return self.strategy == "ps" or self.variable_update == "distributed_replicated"

    def topology(self) -> Topology:
        """4 workers on hosts of 2; `ps` with 2 PS ranks on hosts of their own, `dtf` a task on each worker host."""
        placement = "colocated" if strategy_kind(self.strategy).whole_variables else "dedicated"
        return on_hosts(topology(self.strategy, WORKERS, 2, placement), GPUS_PER_NODE)


CASES = [
    Case("ps"),
    Case("ps", overlap=False),
    Case("dtf"),
    Case("dtf", overlap=False),
    Case("dtf", variable_update="parameter_server"),
    Case("ps", priced=True),
    Case("dtf", priced=True),
]
COMPUTED = [case for case in CASES if not case.priced]


def _model_bytes() -> int:
    return sum(4 * p.numel() for u in _units() for p in u.module.parameters())


def _pacer(comm: Comm) -> Pacer:
    """A modelled rank's pacer: units take no time, a host's sum of the model's gradients takes PRICED_S."""
    units = len(_units())
    targets = Targets(1.0, "modelled", "test", {WORKER: [0.0] * units}, {WORKER: [0.0] * units}, 0.0, 0.0, 0.0, 0.0)
    return Pacer(replace(targets, in_host_s_per_byte=PRICED_S / _model_bytes()), lambda: comm.wait_s)


def _setup(case: Case, rank: int) -> StepSetup:
    comm = Comm(rank, WORLD, "gloo")
    return StepSetup(
        case.topology(),
        comm,
        _units(),
        None,
        OPTIM,
        torch.device("cpu"),
        BATCH,
        SIZE,
        overlap=case.overlap,
        bucket_mb=0.002,  # several buckets per server, so the relays run beside later pushes
        variable_update=case.variable_update,
        pacer=_pacer(comm) if case.priced else None,
    )


Sent = tuple[list[Piece], dict[str, int], dict[int, int], float]


def _rank(rank: int, world: int) -> dict[str, Sent]:
    out = {}
    for case in CASES:
        setup = _setup(case, rank)
        assert setup.topology.world_size == world
        engine = build(setup)
        images, labels = _batch(WORKERS)
        part = slice(rank * BATCH, (rank + 1) * BATCH)
        began = time.perf_counter()
        for _ in range(2):  # the second step's pushes wait on the first's relays
            engine.step((images[part], labels[part]) if rank in setup.topology.workers else None)
        engine.finish()
        took = time.perf_counter() - began
        traffic = setup.comm.take()
        setup.comm.barrier()
        out[case.key] = (engine.state(), dict(traffic.bytes_by_category), dict(traffic.bytes_by_peer), took)
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Sent]]:
    """Per rank and case: the pieces it holds after two steps, the bytes it sent in them (by category and peer) and
    how long the two steps took it."""
    return spawn_function(_rank, WORLD)


def test_hosts_group_their_workers_and_dtf_keeps_a_task_per_worker_host() -> None:
    ps, dtf = Case("ps").topology(), Case("dtf").topology()
    assert ps.hosts == [0, 0, 1, 1, 2, 3] and volume.host_groups(ps) == [[0, 1], [2, 3]]
    assert dtf.ps == [4, 5] and dtf.hosts == [0, 0, 1, 1, 0, 1]  # 2 tasks, not one per GPU
    assert volume.host_groups(topology("ps", 3)) == [[0], [1], [2]]  # one GPU per host: everyone pushes
    assert placed(topology("dtf", WORKERS), dtf.hosts) == dtf  # what a rank rebuilds from the driver's hosts
    with pytest.raises(ValueError, match="3 hosts"):
        placed(topology("dtf", WORKERS), [0, 0, 1])


def test_only_the_leaders_pushes_and_pulls_cross_the_links() -> None:
    topo = Case("ps").topology()
    links = volume.push_pull_link_bytes(topo, {4: 300, 5: 100})
    # each host's leader pushes and pulls 400 bytes; each PS host takes 2 pushes of its shard and sends 2 pulls
    assert links == {
        0: {"tx": 400, "rx": 400},
        1: {"tx": 400, "rx": 400},
        2: {"tx": 600, "rx": 600},
        3: {"tx": 200, "rx": 200},
    }
    every = volume.push_pull_link_bytes(topo, {4: 300, 5: 100}, summed=False)
    assert every[0] == {"tx": 800, "rx": 800} and every[2] == {"tx": 1200, "rx": 1200}
    colocated = volume.push_pull_link_bytes(Case("dtf").topology(), {4: 300, 5: 100})
    assert colocated == {0: {"tx": 400, "rx": 400}, 1: {"tx": 400, "rx": 400}}  # the other host's task only


def _loads(case: Case) -> dict[int, int]:
    setup = _setup(case, 0)  # a Comm is only counters until it sends
    sizes = [p.numel() for _, p in setup.layout()]
    buckets = strategy_kind(case.strategy).step_class.server_buckets(setup, sizes, 4)
    loads = dict.fromkeys(setup.topology.ps, 0)
    for bucket in buckets:
        loads[bucket.server] += 4 * len(bucket)
    return loads


@pytest.mark.slow  # spawns 6 gloo ranks and trains every case for two steps (~20 s)
@pytest.mark.parametrize("case", COMPUTED, ids=lambda c: c.key)
def test_summing_inside_hosts_makes_single_process_sgds_update(case: Case, ranks: list) -> None:
    got = assemble([p for r in ranks for p in r[case.key][0]])
    net = torch.nn.Sequential(*(u.module for u in _units()))
    opt = OPTIM.sgd(list(net.parameters()))
    for _ in range(2):
        opt.zero_grad()
        loss_fn(net(_batch(WORKERS)[0]), _batch(WORKERS)[1]).backward()
        opt.step()
    for name, param in net.named_parameters():
        torch.testing.assert_close(got[name], param.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # uses the spawned `ranks` fixture
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.key)
def test_the_bytes_sent_and_those_leaving_each_host_are_the_analytic_ones(case: Case, ranks: list) -> None:
    topo = case.topology()
    want = volume.step_bytes(case.strategy, _units(), None, topo, BATCH, SIZE)
    got = {name: sum(r[case.key][1].get(name, 0) for r in ranks) for name in volume.CATEGORIES}
    assert got == {name: 2 * want[name] for name in volume.CATEGORIES}  # two steps
    links = volume.push_pull_link_bytes(topo, _loads(case), case.summed)
    for host, link in links.items():
        out = sum(
            sent
            for rank in topo.ranks_on(host)
            for peer, sent in ranks[rank][case.key][2].items()
            if topo.hosts[peer] != host
        )
        assert out == 2 * link["tx"], (host, out, link)
    crossing = sum(link["tx"] for link in links.values())
    if case.summed:  # a local's push and its pull from its leader stay inside the host
        assert crossing < want["total"]


@pytest.mark.slow  # uses the spawned `ranks` fixture
@pytest.mark.parametrize("case", [c for c in CASES if c.priced], ids=lambda c: c.key)
def test_a_modelled_hosts_sums_are_priced_and_waited_for_not_copied(case: Case, ranks: list) -> None:
    """Each local's push and pull is a one-element token counted as its bucket (so the bytes above still match the
    analytic volume), and each step's leader waits the interconnect's time for the host's sum before its pushes."""
    topo = case.topology()
    leader, local = volume.host_groups(topo)[0]
    bucket_bytes = ranks[local][case.key][2][leader]
    assert bucket_bytes == 2 * _model_bytes()  # two steps of the whole model, counted though a token crossed
    assert ranks[leader][case.key][3] >= 2 * PRICED_S  # the sums before the pushes, in the step
    assert ranks[local][case.key][3] >= 2 * PRICED_S  # its pulls come through the leader's priced relays
