"""Each run's link check loads the traffic pattern the run makes: a star (servers on one host) only host 0's link, a
run whose links are all busy at once (an all-reduce ring, servers on several hosts) every link as well."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ralp_pipe.config import STRATEGY_KINDS, load
from ralp_pipe.contract.topology import LINK_PATTERNS, RING, STAR, link_pattern, links_of, on_hosts, topology
from ralp_pipe.runtime import linkcheck
from ralp_pipe.runtime.linkcheck import LinkMeasurement

EMULATED = ["cluster=emulated", "network=10gbit", "dilation.mode=modelled", "dilation.factor=auto"]


@pytest.mark.parametrize(
    ("strategy", "gpus", "num_ps", "placement", "pattern"),
    [
        ("ps", 16, 1, "dedicated", STAR),  # paper-dilated's ps: 16 workers and a PS host
        ("ps", 4, 1, "colocated", STAR),  # the one PS beside worker 0: still every worker through host 0's link
        ("ps", 4, 2, "dedicated", RING),  # two hubs, and every worker's link carries its whole gradient
        ("ps", 4, 4, "colocated", RING),  # a PS on every host: every link at once
        ("ralp_h", 16, 1, "dedicated", STAR),
        ("ralp_n", 16, 1, "dedicated", STAR),
        ("allreduce", 16, 1, "dedicated", RING),
        ("dtf", 4, 1, "colocated", RING),  # one PS task per worker host: all to all
        ("dtf", 4, 1, "dedicated", RING),
        ("dtf", 1, 1, "dedicated", STAR),  # one worker, one PS task: a single link
    ],
)
def test_a_run_is_a_star_only_where_its_servers_sit_on_one_host(
    strategy: str, gpus: int, num_ps: int, placement: str, pattern: str
) -> None:
    assert link_pattern(topology(strategy, gpus, num_ps, placement)) == pattern


def test_every_strategy_gets_the_pattern_its_table_entry_and_its_server_hosts_give() -> None:
    for name, kind in STRATEGY_KINDS.items():
        assert kind.link_pattern in LINK_PATTERNS, name
        for gpus in (2, 4, 8):
            topo = topology(name, gpus)
            hubs = {topo.hosts[rank] for rank in topo.ps}
            expected = STAR if kind.link_pattern == STAR and len(hubs) == 1 else RING
            assert link_pattern(topo) == expected, (name, gpus)


def test_hosts_of_several_gpus_keep_a_single_server_hosts_star() -> None:
    assert link_pattern(on_hosts(topology("ps", 8), 4)) == STAR  # two worker hosts and the PS host
    assert link_pattern(on_hosts(topology("ralp_n", 8), 4, ps_device_shares_host=True)) == STAR  # hub: host 0
    assert link_pattern(on_hosts(topology("ps", 8, 2, "colocated"), 4)) == RING  # a PS on each worker host
    assert link_pattern(on_hosts(topology("allreduce", 8), 4)) == RING
    assert link_pattern(on_hosts(topology("ralp_n", 4), 4, ps_device_shares_host=True)) is None  # one host


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "checked"),
    [
        (["strategy=ps", "cluster.gpus=16"], (17, STAR)),
        (["strategy=ralp_h", "cluster.gpus=16"], (9, STAR)),
        (["strategy=ralp_n", "cluster.gpus=8"], (8, STAR)),
        (["strategy=allreduce", "cluster.gpus=16"], (16, RING)),
        (["strategy=ps", "cluster.gpus=4", "strategy.num_ps=2"], (6, RING)),
        (["strategy=dtf", "cluster.gpus=4"], (4, RING)),
    ],
)
def test_the_workflow_checks_each_run_with_its_own_pattern(overrides: list[str], checked: tuple[int, str]) -> None:
    assert links_of(load([*EMULATED, *overrides])) == checked


def _figures(factor: float, every_link: bool) -> LinkMeasurement:
    """Host 0's link accurate from D = 1; the streams' ring only from D = 16, as 17 hosts at 10 Gbit/s measured."""
    ring = 0.99 if factor >= 16 else 0.5
    measured = LinkMeasurement(factor, f"{10 / factor:g}gbit", 0.99, 0.99, 0.95, 0.95, 0.5, 0.4, 0.001,
                               ring, ring, ring, ring, (ring,) * 17, (ring,) * 17, 0.5, 0.8, 0.001)  # fmt: skip
    none: dict[str, Any] = dict.fromkeys(linkcheck._RING_FIELDS)
    return measured if every_link else dataclasses.replace(measured, **none)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "loads_every_link", "chosen"),
    [
        (["strategy=ps", "cluster.gpus=16"], False, 1.0),  # host 0's link decides
        (["strategy=ralp_n", "cluster.gpus=16"], False, 1.0),
        (["strategy=allreduce", "cluster.gpus=16"], True, 16.0),  # its ring's every link at once decides
        (["strategy=dtf", "cluster.gpus=16"], True, 16.0),  # a PS task on every host: every link, both loads
    ],
)
def test_a_star_runs_factor_comes_from_the_star_measurement_alone(
    monkeypatch: pytest.MonkeyPatch, overrides: list[str], loads_every_link: bool, chosen: float
) -> None:
    asked: list[bool] = []

    def measure(hosts: int, rate: str, burst: str, factor: float, seconds: float, every_link: bool) -> LinkMeasurement:
        asked.append(every_link)
        return _figures(factor, every_link)

    monkeypatch.setattr(linkcheck, "measure_link", measure)
    monkeypatch.setattr(linkcheck, "measure_backend", lambda *args: None)  # no backend figure: the streams decide
    monkeypatch.setattr(linkcheck, "search_order", lambda candidates: ([1.0, 2.0, 4.0, 8.0, 16.0, 32.0], []))
    cfg = load([*EMULATED, *overrides])
    choice = linkcheck.run_check(cfg, *links_of(cfg))
    assert choice.factor == chosen and set(asked) == {loads_every_link}
    assert choice.backend == links_of(cfg)[1]
    last = choice.to_dict()["measurements"][-1]
    assert (last["ring_uploads"] is None) == (not loads_every_link)
    assert last["worst"] == pytest.approx(0.99)
