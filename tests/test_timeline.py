"""The variable-by-variable timeline that prices a pipelined `dtf` step: shared links, ordered connections, and
a step's period with the servers' share of it."""

from __future__ import annotations

import dataclasses
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pytest

from ralp_pipe.engine import models
from ralp_pipe.engine.volume import variable_owners
from ralp_pipe.planning.costmodel import (
    ComputeCosts,
    Link,
    Pipelining,
    Pricing,
    UnitCost,
    WholeVariables,
    compute_costs,
    predict,
)
from ralp_pipe.planning.timeline import DtfStep, Process, _Signal, _Timeline, dtf_period
from support.profiles import analytic_profile


def _landing_times(timeline: _Timeline, transfers: dict[str, _Signal]) -> dict[str, float]:
    landed: dict[str, float] = {}

    def watch(name: str, signal: _Signal) -> Process:
        yield signal
        landed[name] = timeline.now

    for name, signal in transfers.items():
        timeline.start(watch(name, signal))
    timeline.run()
    return landed


def test_links_are_shared_max_min_fairly() -> None:
    """Link 1 carries b, c and d (a third each); a, alone with b on link 0, takes what b leaves of it (2/3)."""
    timeline = _Timeline([1.0, 1.0])
    sent = {
        "a": timeline.send((0, 9), (0,), 1.0),
        "b": timeline.send((1, 9), (0, 1), 1.0),
        "c": timeline.send((2, 9), (1,), 1.0),
        "d": timeline.send((3, 9), (1,), 1.0),
    }
    assert _landing_times(timeline, sent) == pytest.approx({"a": 1.5, "b": 3.0, "c": 3.0, "d": 3.0})


def test_a_connection_sends_in_order_and_each_transfer_lands_a_latency_after_its_last_byte() -> None:
    timeline = _Timeline([2.0])
    sent = {
        "first": timeline.send((0, 1), (0,), 2.0, latency_s=0.25),  # alone on the link: 1 s
        "second": timeline.send((0, 1), (0,), 2.0, latency_s=0.25),  # behind it on the same connection: 1 s more
        "inside": timeline.send((0, 1), (), 5.0),  # crossing no link: at once
    }
    assert _landing_times(timeline, sent) == pytest.approx({"first": 1.25, "second": 2.25, "inside": 0.0})


def _one_worker(server_s_per_byte: float, sum_s_per_byte: float = 0.0) -> DtfStep:
    return DtfStep(
        fwd_s=[1.0],
        bwd_s=[2.0],
        begin_s=0.5,
        sizes=[100],
        units=[0],
        owners=[0],
        group_hosts=[0],
        group_pushers=[1],
        task_hosts=[0],
        sum_s_per_byte=[sum_s_per_byte],
        server_s_per_byte=server_s_per_byte,
        link_bytes_per_s=1.0,
    )


def test_the_period_counts_what_the_server_adds_beyond_the_next_steps_start() -> None:
    """One worker and its task on one host: the variable is back 1 s after backward, while the next step's
    0.5 s of zeroing runs, so the server adds 0.5 s to the 3.5 s of the worker's own work."""
    assert dtf_period(_one_worker(0.01)) == pytest.approx((4.0, 0.5))
    assert dtf_period(_one_worker(0.0)) == pytest.approx((3.5, 0.0))


def test_the_step_end_barrier_holds_every_task_until_all_are_updated() -> None:
    """Worked by hand (no compute, 1 MB/s links): one worker pushes a 900 B variable to the task on host 2 and a
    100 B one to the task on host 1, sharing its uplink (the 100 B lands at 200 us, the 900 B at 1000 us). Without a
    barrier the small one comes back at once and the large one, alone on the worker's downlink, lands at 1900 us. With
    TensorFlow's barrier, global, both tasks reply at 1000 us and share that downlink: 2000 us."""
    step = DtfStep(
        fwd_s=[0.0, 0.0],
        bwd_s=[0.0, 0.0],
        begin_s=0.0,
        sizes=[100, 900],
        units=[0, 1],
        owners=[0, 1],
        group_hosts=[0],
        group_pushers=[1],
        task_hosts=[1, 2],
        sum_s_per_byte=[0.0],
        server_s_per_byte=0.0,
        link_bytes_per_s=1e6,
    )
    assert dtf_period(step) == pytest.approx((1900e-6, 0.0))
    assert dtf_period(dataclasses.replace(step, barrier=True)) == pytest.approx((2000e-6, 0.0))


def test_a_servers_cost_per_variable_adds_to_its_cost_per_byte() -> None:
    """The same step with the variable's RPCs costing the task 0.25 s besides its 1 s of bytes: back 1.25 s after
    backward, 0.75 s beyond the next step's zeroing; with the bytes free, 0.25 s hides behind the zeroing."""
    assert dtf_period(dataclasses.replace(_one_worker(0.01), server_s_per_variable=0.25)) == pytest.approx((4.25, 0.75))
    assert dtf_period(dataclasses.replace(_one_worker(0.0), server_s_per_variable=0.25)) == pytest.approx((3.5, 0.0))


def test_a_hosts_sum_and_relay_each_take_the_interconnects_time() -> None:
    """A leader waits its host's sum before the push (it delays the next step's start, which waits for every
    push issued) and the relay's as long again before its other GPUs may use the variable."""
    period, server = dtf_period(_one_worker(0.0, sum_s_per_byte=0.01))
    assert (period, server) == pytest.approx((3.5 + 1.0 + 1.0 - 0.5, 0.0))


def test_a_transfer_standing_for_several_flows_takes_as_many_shares() -> None:
    """Three GPUs' identical pushes as one transfer of weight 3 beside one flow: 3/4 and 1/4 of the link, until
    the three have landed and the one takes all of it."""
    timeline = _Timeline([1.0])
    sent = {"three": timeline.send((0, 9), (0,), 3.0, weight=3), "one": timeline.send((1, 9), (0,), 2.0)}
    assert _landing_times(timeline, sent) == pytest.approx({"three": 4.0, "one": 5.0})


def test_a_dedicated_task_takes_every_hosts_copy_through_its_own_link() -> None:
    """Two workers, one 100 B variable on task 0, links of 1 B/s, nothing else costing: colocated, only worker
    1's copy crosses a link each way (200 s a step); on a host of its own both copies share the task's link each
    way (400 s)."""
    costs = ComputeCosts((UnitCost("u0", 100, (1,), (0.0,), (0.0,)),), 0.0, 0.0)
    variables = WholeVariables((100,), units=(0,))
    pricing = Pricing(costs, 1, Link(1.0), num_ps=2, colocated=True, pipelining=Pipelining(1), variables=variables)
    assert predict("dtf", 2, 2, {"total": 0}, pricing).step_time_s == pytest.approx(200.0)
    dedicated = dataclasses.replace(pricing, colocated=False)
    assert predict("dtf", 2, 2, {"total": 0}, dedicated).step_time_s == pytest.approx(400.0)


# The timeline's results pinned: a grid of dtf steps priced by the timeline as it was first written (the revision in
# the fixture), each reproduced to float noise whatever the implementation's speed-ups.
REFERENCE = Path(__file__).parent / "data" / "dtf_timeline_reference.json"
GBIT = 1e9 / 8


@lru_cache(maxsize=None)
def _model(name: str) -> tuple[ComputeCosts, tuple[int, ...], tuple[int, ...]]:
    """A model's analytic costs at 224 px and its whole variables' sizes and units (creation order)."""
    profile = analytic_profile(name, 1000, 224, [32], 1.5e13, None, 9e11)
    units = models.model_units(name, 1000, 0.5, "meta")
    variables = [(i, p.numel() * p.element_size()) for i, u in enumerate(units) for p in u.module.parameters()]
    return compute_costs(profile), tuple(s for _, s in variables), tuple(u for u, _ in variables)


def _reference_step(
    model: str, hosts: int, g: int, summed: bool, colocated: bool, gbit: float, greedy: bool
) -> DtfStep:
    """A pipelined dtf step as the cost model builds one: `hosts` hosts of `g` GPUs (all full), one PS task per host
    beside its workers or on a host of its own, summed in the host before the push or each GPU pushing."""
    costs, sizes, units = _model(model)
    interconnect = 25e9
    pushers = [1 if summed else g] * hosts
    push_total = sum(pushers)
    server = ((push_total if push_total > 1 else 0) * costs.aggregate_s_per_byte + costs.update_s_per_byte) * 1.1
    return DtfStep(
        fwd_s=[u.fwd(32) for u in costs.units],
        bwd_s=[u.bwd(32) for u in costs.units],
        begin_s=costs.param_bytes * costs.aggregate_s_per_byte,
        sizes=sizes,
        units=units,
        owners=variable_owners(sizes, hosts, greedy),
        group_hosts=range(hosts),
        group_pushers=pushers,
        task_hosts=[p if colocated else hosts + p for p in range(hosts)],
        sum_s_per_byte=[(g - 1) / g / interconnect if summed and g > 1 else 0.0] * hosts,
        server_s_per_byte=server,
        link_bytes_per_s=gbit * GBIT * 0.9,
        latency_s=50e-6 if gbit < 10 else 0.0,
        port_bytes_per_s=interconnect if g > 1 else math.inf,
    )


def _reference_grid() -> dict[str, tuple[str, int, int, bool, bool, float, bool]]:
    """Each reference step's key and :func:`_reference_step`'s arguments: three models, 2..8 hosts of 1, 4 or 8 GPUs,
    summed in the host or not, colocated or dedicated tasks, 1, 10 and 100 Gbit/s, round-robin and greedy."""
    grid = {}
    for model in ("vgg16", "resnet50", "alexnet"):
        for hosts in range(2, 9):
            for g in (1, 4, 8):
                for summed in (True, False):
                    if g == 1 and not summed:
                        continue  # the same step as summed at one GPU per host
                    for colocated in (True, False):
                        for gbit in (1.0, 10.0, 100.0):
                            greedy = (hosts + g) % 3 == 0
                            key = f"{model} hosts={hosts} g={g} summed={summed} colocated={colocated} gbit={gbit:g}"
                            grid[key] = (model, hosts, g, summed, colocated, gbit, greedy)
    return grid


def _check_reference(keep: Callable[[str, int, int, float], bool]) -> int:
    """Assert the steps `keep` picks (by model, hosts, GPUs per host, Gbit/s) price as the fixture says; how many."""
    reference = json.loads(REFERENCE.read_text())["periods"]
    grid = _reference_grid()
    assert grid.keys() == reference.keys()
    checked = 0
    for key, args in grid.items():
        if not keep(args[0], args[1], args[2], args[5]):
            continue
        period, server = dtf_period(_reference_step(*args))
        assert period == pytest.approx(reference[key][0], rel=1e-9, abs=0.0), key
        # the servers' share is the difference of two periods: its float noise is theirs
        assert server == pytest.approx(reference[key][1], rel=1e-9, abs=1e-9 * reference[key][0]), key
        checked += 1
    return checked


def _quick(model: str, hosts: int, g: int, gbit: float) -> bool:
    """A few seconds' part of the grid: two hosts at 10 Gbit/s (ResNet-50 at one GPU per host only), and AlexNet on
    eight hosts of eight GPUs at 1 Gbit/s."""
    two_hosts = hosts == 2 and gbit == 10 and (model != "resnet50" or g == 1)
    return two_hosts or (model, hosts, g, gbit) == ("alexnet", 8, 8, 1)


@pytest.mark.slow
def test_the_timeline_reproduces_its_reference_periods_on_a_quick_part_of_the_grid() -> None:
    """Those steps priced as the fixture's revision priced them, to float noise (1e-9 relative)."""
    assert _check_reference(_quick) == 26


@pytest.mark.slow
def test_the_timeline_reproduces_every_reference_period() -> None:
    """The whole reference grid (630 steps, minutes at the fixture's revision)."""
    assert _check_reference(lambda *_: True) == 630
