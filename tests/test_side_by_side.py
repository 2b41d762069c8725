"""Training runs side by side: what a job declares (ralp_pipe.workflow.resources) and the link check beside a budget."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ralp_pipe.config import load
from ralp_pipe.errors import ConfigError
from ralp_pipe.runtime import linkcheck
from ralp_pipe.workflow import resources
from ralp_pipe.workflow.resources import (
    LINK_BUDGET,
    budget_mbps,
    cpu_units,
    demand_of,
    link_units,
    threads,
    train_demand,
)
from workflow_helpers import snakemake

MODELLED = ["experiment=dilated", "cluster=emulated", "dilation.mode=modelled", "dilation.factor=auto"]


def _check(factor: float, budget: str | None = LINK_BUDGET) -> dict[str, object]:
    return {"factor": factor, "budget": budget}


def test_a_modelled_run_certified_beside_the_budget_declares_its_ranks_cores_and_its_links_load() -> None:
    cfg = load([*MODELLED, "strategy=ps", "cluster.gpus=2", "network=1gbit"])  # 3 ranks on 3 hosts
    demand = train_demand(cfg, _check(1.0))
    assert not demand.alone
    assert demand.link_mbps == 3 * 1000  # hosts x 1 Gbit/s / 1
    assert demand.cores == pytest.approx(3 * (resources.RANK_CORES + resources.RANK_CORES_PER_GBIT * 1.0))
    slower = train_demand(cfg, _check(4.0))  # the same run at D = 4: a quarter of the link load, fewer cores
    assert slower.link_mbps == 750 and slower.cores is not None and slower.cores < demand.cores
    assert threads(cfg, 2) == 1 and cpu_units(demand, 2) == round(demand.cores * 1000) and link_units(demand) == 3000


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides,check,why",
    [
        (["dilation.mode=real", "dilation.factor=16"], None, "computes"),  # a real-mode run computes on every core
        (["dilation.factor=null"], None, "computes"),  # undilated: its throughput is this machine's
        (["dilation.factor=8"], None, "fixed"),  # nothing measured its links beside others
        ([], _check(1.0, budget=None), "no link check certified"),  # a check made for runs alone
        ([], _check(1.0, budget="12gbit"), "no link check certified"),  # one made for another budget
        (["cluster=local", "network=loopback"], None, "not emulated"),
        (["cluster.gpus=8"], _check(1.0), "whole budget"),  # 9 hosts at 1 Gbit/s: 9 > 6 Gbit/s
        (["strategy=allreduce", "cluster.gpus=1"], None, "one host"),  # the single-device reference
    ],
)
def test_runs_that_compute_are_uncertified_or_fill_the_budget_run_alone(
    overrides: list[str], check: dict[str, object] | None, why: str
) -> None:
    cfg = load([*MODELLED, "strategy=ps", "cluster.gpus=2", "network=1gbit", *overrides])
    demand = train_demand(cfg, check)
    assert demand.alone and why in demand.reason
    assert cpu_units(demand, 2) == 2000 and cpu_units(demand, 16) == 16000  # every core
    by_its_check = why in ("no link check certified", "whole budget")  # one thread, every core as its resource
    assert threads(cfg, 2) == (1 if by_its_check else 2)
    assert link_units(demand) == budget_mbps()  # the whole budget: no run's links beside it


def test_the_cores_are_thousandths_of_a_core_up_to_every_core() -> None:
    light = resources.Demand(0.2, 100, "")
    heavy = resources.Demand(5.5, 100, "")
    assert cpu_units(light, 2) == 200 and cpu_units(heavy, 2) == 2000 and cpu_units(heavy, 16) == 5500


def test_the_workflow_reads_the_runs_link_check_record(tmp_path: Path) -> None:
    cfg = load([*MODELLED, "strategy=allreduce", "cluster.gpus=2", "network=1gbit"])
    record = tmp_path / "ring-h2.json"
    record.write_text(json.dumps(_check(2.0)))
    assert demand_of(cfg, [str(record)]).link_mbps == 1000  # 2 hosts at 1 Gbit/s / 2
    assert demand_of(cfg, []).alone  # no check: its D uncertified
    for damaged in ("{", "[]"):
        record.write_text(damaged)
        with pytest.raises(ConfigError, match=r"ring-h2.json cannot be read.*check-links"):
            demand_of(cfg, [str(record)])
    with pytest.raises(FileNotFoundError):  # not written yet: Snakemake evaluates the job's demand again later
        demand_of(cfg, [str(tmp_path / "star-h3.json")])


def test_a_budget_must_be_a_limited_rate() -> None:
    assert budget_mbps("6gbit") == 6000
    with pytest.raises(ConfigError, match="limited rate"):
        budget_mbps("unlimited")


@pytest.mark.parametrize(
    "budget,hosts,rate,factor,beside",
    [
        ("6gbit", 3, "1gbit", 1.0, 3e9),  # the rest of the budget
        ("6gbit", 3, "10gbit", 8.0, 6e9 - 3 * 1.25e9),
        ("6gbit", 3, "1gbit", 0.5, 0.0),  # own links take it all: measured alone
        ("6gbit", 9, "1gbit", 1.0, 0.0),
        (None, 3, "1gbit", 1.0, 0.0),  # no budget: alone, as before
        ("6gbit", 3, "unlimited", 1.0, 0.0),
    ],
)
def test_the_check_measures_each_factor_beside_the_rest_of_the_budget(
    budget: str | None, hosts: int, rate: str, factor: float, beside: float
) -> None:
    assert linkcheck.beside_bits_per_s(budget, hosts, rate, factor) == pytest.approx(beside)


def test_a_check_with_a_budget_records_it_and_what_ran_beside(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[float] = []

    class Beside:
        def __init__(self, bits: float, burst: str) -> None:
            loads.append(bits)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    def measured(
        hosts: int, rate: str, burst: str, factor: float, seconds: float, every_link: bool
    ) -> linkcheck.LinkMeasurement:
        passes = 0.99 if factor >= 2 else 0.5  # D = 1 falls short beside the budget's rest, D = 2 keeps up
        return linkcheck.LinkMeasurement(factor, rate, passes, passes, 1, 1, 0.5, 0.1, 0, passes, passes, 1, 1,
                                         (passes,) * hosts, (passes,) * hosts, 0.5, 0.1, 0)  # fmt: skip

    monkeypatch.setattr(linkcheck, "beside_load", Beside)
    monkeypatch.setattr(linkcheck, "measure_link", measured)
    choice = linkcheck.accurate_factor(3, "1gbit", budget="6gbit")
    assert choice.factor == 2.0 and choice.budget == "6gbit" and choice.to_dict()["budget"] == "6gbit"
    assert loads == [3e9, 4.5e9]  # D = 1 beside 3 Gbit/s, D = 2 beside 4.5 Gbit/s
    assert [m.beside_bits_per_s for m in choice.measurements] == [3e9, 4.5e9]


@pytest.mark.netns
def test_links_measured_beside_other_traffic_still_deliver_a_low_rate() -> None:
    # 2 hosts at 100 Mbit/s beside 400 Mbit/s of other links: both far below what the machine's kernel shapes.
    choice = linkcheck.accurate_factor(2, "100mbit", candidates=[1.0], budget="600mbit")
    assert choice.factor == 1.0 and choice.budget == "600mbit"
    assert all(m.beside_bits_per_s == pytest.approx(4e8) for m in choice.measurements)


@pytest.mark.slow  # a snakemake dry-run subprocess
@pytest.mark.parametrize("factor", ["auto", "8"])
def test_the_workflow_declares_each_training_jobs_threads_and_resources(tmp_path: Path, factor: str) -> None:
    """With D from link checks (made beside the budget), multi-host modelled runs take one thread and declare their
    cores and link load once their check exists; the single-device reference, and every run at a fixed D, goes alone."""
    overrides = ["cluster=emulated", "experiment.networks=[1gbit]", "dilation.mode=modelled", f"dilation.factor={factor}",
                 "experiment.reference=true"]  # fmt: skip
    result = snakemake(tmp_path, "--dry-run", "--printshellcmds", "--cores", "2",
                       config={"experiment": "smoke", "overrides": overrides}, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = [
        block for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", result.stdout) if block.startswith("rule train:")
    ]
    assert len(jobs) == 5  # ps, allreduce, ralp_h and ralp_n at N = 2, the reference at N = 1
    for job in jobs:
        alone = factor != "auto" or "gpus=1," in job
        threads = re.search(r"^\s*threads: (\d+)$", job, re.M)
        assert (threads is not None and threads[1] == "2") == alone, job
        expected = (
            "cpu_millicores=2000, emulated_link_mbps=6000"
            if alone
            else "cpu_millicores=<TBD>, emulated_link_mbps=<TBD>"
        )
        assert expected in job, job
    checks = [line for line in result.stdout.splitlines() if line.startswith("Shell command: ralp-pipe check-links")]
    # a ring of 2 (allreduce), stars of 3 (ps: 2 workers and the PS) and 2 (RALP: a worker and the PS device)
    assert len(checks) == (3 if factor == "auto" else 0) and all(f"--budget {LINK_BUDGET}" in c for c in checks)
