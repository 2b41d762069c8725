"""`dtf` trains for real: every variable whole on the PS task the cost model prices it on, the bytes per step the
analytic volume gives, and the update `ps` makes (the same gradients averaged, the same SGD).

One set of 4 spawned gloo ranks (2 workers + 2 PS tasks, or `ps` with 2 PS ranks) runs every case in turn.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from ralp_pipe.config import strategy_kind
from ralp_pipe.contract.topology import PS, topology
from ralp_pipe.engine import models, volume
from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.strategies import Optim, StepSetup, build
from ralp_pipe.engine.strategies.base import Piece, assemble, loss_fn
from ralp_pipe.engine.strategies.dtf import variable_buckets
from ralp_pipe.planning.costmodel import ComputeCosts, Link, Pipelining, Pricing, UnitCost, WholeVariables, predict
from support.spawn import spawn_function

OPTIM = Optim(lr=0.05, momentum=0.9, weight_decay=1e-3)
CLASSES, BATCH, SIZE, WORKERS = 5, 2, 16, 2


@dataclass(frozen=True)
class Case:
    strategy: str
    overlap: bool = True
    placement: str = "round_robin"
    num_ps: int = 2  # `ps` only: dtf has one PS task per worker host
    barrier: bool = False  # strategy.step_barrier: pulls only once every push of the step is applied

    @property
    def key(self) -> str:
        barrier = "-barrier" if self.barrier else ""
        return f"{self.strategy}-{'overlap' if self.overlap else 'sequential'}-{self.placement}{barrier}"


CASES = [
    Case("dtf"),
    Case("dtf", overlap=False),
    Case("dtf", placement="greedy"),
    Case("dtf", barrier=True),
    Case("ps"),
]


def _units() -> list[models.Unit]:
    """A small VGG-shaped stack (no BatchNorm) whose variables differ in size, so greedy and round-robin differ."""
    torch.manual_seed(0)
    nn = torch.nn
    return [
        models.Unit("conv0", nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())),
        models.Unit("pool0", nn.MaxPool2d(2)),
        models.Unit("conv1", nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())),
        models.Unit("flatten", nn.Flatten(1)),
        models.Unit("fc0", nn.Sequential(nn.Linear(16 * 8 * 8, 32), nn.ReLU())),
        models.Unit("fc1", nn.Linear(32, CLASSES)),
    ]


def _batch(workers: int = WORKERS) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `workers` workers of BATCH images each, the same on every rank."""
    gen = torch.Generator().manual_seed(3)
    n = workers * BATCH
    return torch.randn(n, 3, SIZE, SIZE, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen)


def _rank(rank: int, world: int) -> dict[str, tuple[list[Piece], dict[str, int]]]:
    out = {}
    for case in CASES:
        topo = topology(case.strategy, WORKERS, case.num_ps, "colocated")
        assert topo.world_size == world
        setup = StepSetup(
            topo,
            Comm(rank, world, "gloo"),
            _units(),
            None,
            OPTIM,
            torch.device("cpu"),
            BATCH,
            SIZE,
            overlap=case.overlap,
            variable_placement=case.placement,
            step_barrier=case.barrier,
        )
        engine = build(setup)
        images, labels = _batch()
        part = slice(rank * BATCH, (rank + 1) * BATCH)
        engine.step((images[part], labels[part]) if rank in topo.workers else None)
        engine.finish()
        traffic = setup.comm.take()
        setup.comm.barrier()
        out[case.key] = (engine.state(), dict(traffic.bytes_by_category))
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, tuple[list[Piece], dict[str, int]]]]:
    """Per rank and case: the pieces it holds after one step and the bytes it sent in that step."""
    return spawn_function(_rank, 2 * WORKERS)


def _names_and_sizes() -> tuple[list[str], list[int]]:
    named = list(torch.nn.Sequential(*(u.module for u in _units())).named_parameters())
    return [n for n, _ in named], [p.numel() for _, p in named]


@pytest.mark.slow  # spawns 4 gloo ranks (~15 s)
@pytest.mark.parametrize("case", [c for c in CASES if c.strategy == "dtf"], ids=lambda c: c.key)
def test_each_ps_task_holds_whole_the_variables_the_cost_model_prices_on_it(case: Case, ranks: list) -> None:
    names, sizes = _names_and_sizes()
    topo = topology("dtf", WORKERS, ps_placement="colocated")
    assert topo.ps == [2, 3] and topo.hosts == [0, 1, 0, 1]  # a PS task beside each worker
    greedy = case.placement == "greedy"
    owners = volume.variable_owners(sizes, len(topo.ps), greedy)
    loads = WholeVariables(tuple(4 * s for s in sizes), greedy=greedy).loads(len(topo.ps))
    for task, rank in enumerate(topo.ps):
        pieces = ranks[rank][case.key][0]
        held = {p.name for p in pieces}
        assert held == {n for n, o in zip(names, owners) if o == task}
        assert all(p.offset == 0 and p.values.numel() == torch.Size(p.shape).numel() for p in pieces)  # whole
        assert 4 * sum(p.values.numel() for p in pieces) == loads[task]  # what the cost model prices on the task
    for worker in topo.workers:
        assert ranks[worker][case.key][0] == []


def test_round_robin_and_greedy_place_the_test_model_differently() -> None:
    _, sizes = _names_and_sizes()
    assert volume.variable_owners(sizes, 2) != volume.variable_owners(sizes, 2, greedy=True)  # the cases differ
    assert [b.server for b in variable_buckets(sizes, [2, 3], False)] == [
        [2, 3][o] for o in reversed(volume.variable_owners(sizes, 2))
    ]  # one bucket per variable, in the order backward produces them


@pytest.mark.slow  # uses the spawned `ranks` fixture
@pytest.mark.parametrize("case", [c for c in CASES if c.strategy == "dtf"], ids=lambda c: c.key)
def test_dtf_bytes_per_step_equal_the_analytic_volume(case: Case, ranks: list) -> None:
    topo = topology("dtf", WORKERS)
    want = volume.step_bytes("dtf", _units(), None, topo, BATCH, SIZE)
    got = {name: sum(r[case.key][1].get(name, 0) for r in ranks) for name in volume.CATEGORIES}
    assert want["total"] > 0
    assert got == {name: want[name] for name in volume.CATEGORIES}


@pytest.mark.slow  # uses the spawned `ranks` fixture
@pytest.mark.parametrize("case", [c for c in CASES if c.strategy == "dtf"], ids=lambda c: c.key)
def test_dtf_makes_the_update_ps_and_single_process_sgd_make(case: Case, ranks: list) -> None:
    got = assemble([p for r in ranks for p in r[case.key][0]])
    ps = assemble([p for r in ranks for p in r[Case("ps").key][0]])
    net = torch.nn.Sequential(*(u.module for u in _units()))
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt = OPTIM.sgd(list(net.parameters()))
    loss_fn(net(_batch()[0]), _batch()[1]).backward()
    opt.step()
    assert got.keys() == ps.keys() == start.keys()
    for name, param in net.named_parameters():
        assert not torch.equal(got[name], start[name]), f"{name} did not train"
        torch.testing.assert_close(got[name], ps[name], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[name], param.detach(), rtol=1e-5, atol=1e-6)


def test_dtf_is_a_trainable_baseline_with_a_ps_task_per_worker_host() -> None:
    kind = strategy_kind("dtf")
    assert kind.baseline and kind.whole_variables and kind.trainable
    kind.check_trainable()
    assert strategy_kind("ps").baseline and not strategy_kind("ralp_n").baseline
    topo = topology("dtf", 4, num_ps=1, ps_placement="colocated")  # strategy.num_ps does not apply
    assert topo.roles.count(PS) == 4 and topo.num_hosts == 4
    assert topology("dtf", 4, ps_placement="dedicated").num_hosts == 8


def test_pipelined_dtf_pulls_a_variable_only_after_all_of_it_was_pushed() -> None:
    """Worked by hand on the timeline (no compute, no server work, 1 MB/s links): worker 1 pushes the 300 and
    then the 600 B variable to task 0 on host 0, its link shared for a while with task 1's 100 B reply to worker 0
    (1000 B in all); only then can the 600 B variable come back, over host 0's link, which it shares with worker
    0's 100 B push of the next step (worker 0 had everything back earlier): (1000 + 700) / rate, each step."""
    costs = ComputeCosts(tuple(UnitCost(f"u{i}", 0, (1,), (0.0,), (0.0,)) for i in range(2)), 0.0, 0.0)
    variables = WholeVariables((600, 100, 300), units=(0, 0, 1))  # round-robin over 2 tasks: 900 and 100 bytes
    pricing = Pricing(costs, 1, Link(1e6), num_ps=2, colocated=True, pipelining=Pipelining(10), variables=variables)
    each_way = 900 + 100  # a host pushes to the other host's task and serves the other worker from its own
    assert predict("dtf", 2, 2, {"total": 0}, pricing).comm_s == pytest.approx((each_way + 600 + 100) / 1e6)
    slower = dataclasses.replace(
        pricing, variables=dataclasses.replace(variables, transport_cap=1e6)
    )  # cap = rate: half of it
    assert predict("dtf", 2, 2, {"total": 0}, slower).comm_s == pytest.approx((each_way + 600 + 100) / 0.5e6)


def test_a_step_end_barrier_holds_every_pull_until_the_task_has_updated_everything() -> None:
    """Worked by hand (no compute, no server work, 1 MB/s links, one PS task on host 0): worker 1 pushes the
    300 B then the 600 B variable (900 us). Per variable, the 300 B reply crosses back while the 600 B push
    still goes the other way, so only the 600 B reply follows the pushes: 1500 us. With TensorFlow's step-end
    barrier both replies wait for the last push: 900 + 900 us."""
    costs = ComputeCosts(tuple(UnitCost(f"u{i}", 0, (1,), (0.0,), (0.0,)) for i in range(2)), 0.0, 0.0)
    variables = WholeVariables((600, 300), units=(0, 1))
    pricing = Pricing(costs, 1, Link(1e6), num_ps=1, colocated=True, pipelining=Pipelining(10), variables=variables)
    assert predict("dtf", 2, 2, {"total": 0}, pricing).comm_s == pytest.approx(1500e-6)
    barrier = dataclasses.replace(pricing, variables=dataclasses.replace(variables, step_barrier=True))
    assert predict("dtf", 2, 2, {"total": 0}, barrier).comm_s == pytest.approx(1800e-6)


def test_a_ps_task_on_its_cpu_applies_every_pushed_gradient_and_pays_per_tensor() -> None:
    """Sequential `dtf`, 2 workers, one PS task holding the 600 and 300 B variables: from the profile, the task
    adds the two gradient sets (2 x 1 ns/B) and steps once (1 ns/B) over 900 B: 2.7 us. On its CPU as TensorFlow's
    runs it, each of the 2 pushed gradients is applied on its own (2 x 4 ns/B x 900 B = 7.2 us), and each variable
    costs 2 RPCs per pusher (2 x 2 x 2 variables x 1 us = 8 us)."""
    costs = ComputeCosts(tuple(UnitCost(f"u{i}", 0, (1,), (0.0,), (0.0,)) for i in range(2)), 1e-9, 1e-9)
    variables = WholeVariables((600, 300), units=(0, 1))
    pricing = Pricing(costs, 1, Link(1e6), num_ps=1, colocated=True, variables=variables)
    assert predict("dtf", 2, 2, {"total": 0}, pricing).server_s == pytest.approx(2.7e-6)
    on_cpu = dataclasses.replace(pricing, variables=dataclasses.replace(variables, apply_s_per_byte=4e-9, rpc_s=1e-6))
    assert predict("dtf", 2, 2, {"total": 0}, on_cpu).server_s == pytest.approx(7.2e-6 + 8e-6)
