"""The variable-by-variable timeline that prices a pipelined `dtf` step: shared links, ordered connections, and
a step's period with the servers' share of it."""

from __future__ import annotations

import dataclasses

import pytest

from ralp_pipe.planning.costmodel import ComputeCosts, Link, Pipelining, Pricing, UnitCost, WholeVariables, predict
from ralp_pipe.planning.timeline import DtfStep, Process, _Signal, _Timeline, dtf_period


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
