"""Concurrent workloads as a dimension: groups of k jobs, rounds (repeats), the slowdown table and slowdown by k."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import pytest

from ralp_pipe.config import ConfigError
from ralp_pipe.contract.layout import MAX_CONCURRENT_JOBS
from ralp_pipe.results.intervals import pool, pooled_interval, ratio_interval
from ralp_pipe.results.plots import concurrent_slowdown
from ralp_pipe.results.tables import ITSELF, MIXED, Tables, concurrent_spread, concurrent_table, slowdown_by_k
from ralp_pipe.runtime import concurrent_jobs

PS, RALP = "strategy=ps model=resnet18 cluster.gpus=2", "strategy=ralp_n model=resnet18 cluster.gpus=2"


class NoCluster:
    """Stands in for EmulatedCluster: builds nothing."""

    def __init__(self, *args: Any) -> None:
        pass

    def __enter__(self) -> NoCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


@pytest.mark.slow
def test_each_round_runs_every_distinct_job_alone_once_then_all_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[Path]] = []
    figures = {"alone": {0: 10.0, 2: 20.0}, "together": {0: 5.0, 1: 4.0, 2: 16.0}}

    def run_jobs(cluster: Any, jobs: Sequence[tuple[Path, list[str], list[int]]], timeout_s: float) -> None:
        calls.append([out.relative_to(tmp_path) for out, _, _ in jobs])

    def record(out: Path) -> Any:
        job, repeat, side = int(out.parent.parent.name[3:]), int(out.parent.name[1:]), out.name
        return SimpleNamespace(images_per_sec=figures[side][job] + repeat, dilation={"factor": 8.0})

    monkeypatch.setattr(concurrent_jobs, "EmulatedCluster", NoCluster)
    monkeypatch.setattr(concurrent_jobs, "_run_jobs", run_jobs)
    monkeypatch.setattr(concurrent_jobs, "_record", record)
    jobs = [PS.split(), PS.split(), RALP.split()]
    common = ["network=10gbit", "dilation.factor=8", "dilation.mode=modelled", "experiment.repeats=2"]
    summary = concurrent_jobs.run_concurrent(jobs, common, tmp_path)
    rounds = [
        [[Path(f"job{i}/r{r}/alone")] for i in (0, 2)] + [[Path(f"job{i}/r{r}/together") for i in range(3)]]
        for r in range(2)
    ]
    assert calls == [call for r in rounds for call in r]  # job 1 is job 0's copy: it shares its alone runs
    assert summary["repeats"] == 2
    assert [j["strategy"] for j in summary["jobs"]] == ["ps", "ps", "ralp_n"]
    assert [j["alone_of"] for j in summary["jobs"]] == [0, 0, 2]
    assert [j["alone_runs"] for j in summary["jobs"]] == [[10.0, 11.0], [10.0, 11.0], [20.0, 21.0]]
    assert [j["together_runs"] for j in summary["jobs"]] == [[5.0, 6.0], [4.0, 5.0], [16.0, 17.0]]
    assert summary["jobs"][1]["slowdown"] == pytest.approx(10.5 / 4.5)
    assert {j["dilation_factor"] for j in summary["jobs"]} == {8.0}
    assert (tmp_path / "concurrent.json").is_file()


def test_a_job_of_several_workloads_of_one_call_runs_alone_once_a_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workloads w0 = (ps, RALP-N) and w1 = (ps, ps): each round runs ps and RALP-N alone once (in w0, the first
    workload that has them), then w0's jobs together, then w1's; w1's jobs name w0's ps as their alone runs, and the
    pooled spread counts those runs once."""
    calls: list[list[Path]] = []

    def run_jobs(cluster: Any, jobs: Sequence[tuple[Path, list[str], list[int]]], timeout_s: float) -> None:
        calls.append([out.relative_to(tmp_path) for out, _, _ in jobs])

    def record(out: Path) -> Any:
        workload, job, repeat = out.parents[2].name, int(out.parent.parent.name[3:]), int(out.parent.name[1:])
        figure = {"alone": 10.0 + 10 * job, "together": 5.0 + job + (2 if workload == "w1" else 0)}[out.name]
        return SimpleNamespace(images_per_sec=figure + repeat / 10, dilation={"factor": 8.0})

    monkeypatch.setattr(concurrent_jobs, "EmulatedCluster", NoCluster)
    monkeypatch.setattr(concurrent_jobs, "_run_jobs", run_jobs)
    monkeypatch.setattr(concurrent_jobs, "_record", record)
    common = ["network=10gbit", "dilation.factor=8", "dilation.mode=modelled", "experiment.repeats=2"]
    outs = [tmp_path / "w0", tmp_path / "w1"]
    summaries = concurrent_jobs.run_workloads([[PS.split(), RALP.split()], [PS.split(), PS.split()]], common, outs)
    for r in range(2):
        alone = [[Path(f"w0/job{i}/r{r}/alone")] for i in (0, 1)]
        together = [[Path(f"{w}/job{i}/r{r}/together") for i in (0, 1)] for w in ("w0", "w1")]
        assert calls[4 * r : 4 * r + 4] == alone + together
    assert len(calls) == 8
    w0, w1 = summaries
    assert [(j["alone_of"], j.get("alone_in")) for j in w0["jobs"]] == [(0, None), (1, None)]
    assert [(j["alone_of"], j.get("alone_in")) for j in w1["jobs"]] == [(0, "w0"), (0, "w0")]
    assert [j["alone_runs"] for j in w1["jobs"]] == [[10.0, 10.1]] * 2
    assert all((out / "concurrent.json").is_file() for out in outs)
    spread = concurrent_spread([("w0", w0), ("w1", w1)])
    groups = [[10.0, 10.1], [20.0, 20.1], [5.0, 5.1], [6.0, 6.1], [7.0, 7.1], [8.0, 8.1]]  # ps alone counted once
    expected = pool(groups)
    assert (spread.df, spread.relative_std) == (expected.df, pytest.approx(expected.relative_std))


@pytest.mark.parametrize("count", [1, MAX_CONCURRENT_JOBS + 1])
def test_a_workload_of_one_job_or_more_than_the_most_is_refused(count: int, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"has {count} jobs: a concurrent workload runs 2 to {MAX_CONCURRENT_JOBS}"):
        concurrent_jobs.run_concurrent([PS.split()] * count, ["network=10gbit"], tmp_path)
    assert list(tmp_path.iterdir()) == []


def doc(jobs: list[tuple[str, list[float], list[float]]], alone_of: list[int] | None = None) -> dict[str, Any]:
    """A concurrent.json of `jobs`, each (overrides, alone rounds, together rounds), dilated at D = 8."""
    return {
        "network": {"rate": "1250000000bit", "burst": "1mb"},
        "shared_host": 0,
        "repeats": 2,
        "jobs": [
            {
                "job": i,
                "overrides": overrides.split(),
                "strategy": overrides.split()[0].split("=")[1],
                "hosts": [i + 1, 0],
                "alone_of": i if alone_of is None else alone_of[i],
                "alone_runs": alone,
                "together_runs": together,
                "alone_images_per_sec": sum(alone) / len(alone),
                "together_images_per_sec": sum(together) / len(together),
                "slowdown": sum(alone) / sum(together),
                "dilation_factor": 8.0,
            }
            for i, (overrides, alone, together) in enumerate(jobs)
        ],
    }


WORKLOADS = [
    ("w0", doc([(PS, [10.0, 10.4], [5.0, 5.2]), (RALP, [20.0, 19.6], [16.0, 16.4])])),
    ("w1", doc([(PS, [10.2, 10.0], [5.4, 5.0]), (PS, [10.2, 10.0], [5.2, 5.0])], alone_of=[0, 0])),
    ("w2", doc([(PS, [10.1, 10.3], [2.6, 2.4])] * 4, alone_of=[0, 0, 0, 0])),
]


def test_the_table_gives_k_companions_and_intervals_from_the_spread_pooled_over_every_job() -> None:
    table = concurrent_table(WORKLOADS)
    assert list(table.k) == [2, 2, 2, 2, 4, 4, 4, 4]
    assert list(table.companions) == [MIXED, MIXED, ITSELF, ITSELF] + [ITSELF] * 4
    assert list(table.strategy) == ["ps", "ralp_n", "ps", "ps", "ps", "ps", "ps", "ps"]
    # alone runs shared by copies count once: w0's two jobs twice, w1's and w2's first alone once, every together
    spread = concurrent_spread(WORKLOADS)
    groups = [[10.0, 10.4], [5.0, 5.2], [20.0, 19.6], [16.0, 16.4], [10.2, 10.0], [5.4, 5.0], [5.2, 5.0]]
    groups += [[10.1, 10.3]] + [[2.6, 2.4]]  # w2: one alone, its four copies' identical together rounds keyed apart
    expected = pool(groups + [[2.6, 2.4]] * 3)
    assert (spread.df, spread.relative_std) == (expected.df, pytest.approx(expected.relative_std))
    row = table.iloc[0]
    alone, together = pooled_interval([80.0, 83.2], spread), pooled_interval([40.0, 41.6], spread)  # x D = 8
    slowdown = ratio_interval(alone, together)
    assert row.alone_images_per_sec == pytest.approx(81.6) and row.together_images_per_sec == pytest.approx(40.8)
    assert (row.together_ci_low, row.together_ci_high) == (pytest.approx(together.low), pytest.approx(together.high))
    assert row.slowdown == pytest.approx(2.0)
    assert (row.slowdown_ci_low, row.slowdown_ci_high) == (pytest.approx(slowdown.low), pytest.approx(slowdown.high))
    assert row.together_emulator_images_per_sec == pytest.approx(5.1) and row.repeats == 2


def test_slowdown_by_k_starts_each_strategy_alone_and_averages_the_jobs_of_a_k() -> None:
    table = concurrent_table(WORKLOADS)
    by_k = slowdown_by_k(table)
    assert [(r.strategy, r.companions, r.k, r.jobs) for r in by_k.itertuples()] == [
        ("ps", ITSELF, 1, 0),
        ("ps", ITSELF, 2, 2),
        ("ps", ITSELF, 4, 4),
        ("ps", MIXED, 1, 0),
        ("ps", MIXED, 2, 1),
        ("ralp_n", MIXED, 1, 0),
        ("ralp_n", MIXED, 2, 1),
    ]
    four = table[table.k == 4]
    row = by_k[(by_k.k == 4)].iloc[0]
    assert row.slowdown == pytest.approx(four.slowdown.mean()) and row.slowdown == pytest.approx(10.2 / 2.5)
    assert row.slowdown_ci_high - row.slowdown == pytest.approx((four.slowdown_ci_high - four.slowdown).mean())
    assert by_k[by_k.k == 1].slowdown.tolist() == [1.0, 1.0, 1.0]
    assert math.isclose(by_k[(by_k.strategy == "ralp_n") & (by_k.k == 2)].slowdown.iloc[0], 19.8 / 16.2)


def test_the_slowdown_plot_draws_with_and_without_workloads(tmp_path: Path) -> None:
    empty = concurrent_table([])
    for name, concurrent in (("some", concurrent_table(WORKLOADS)), ("none", empty)):
        tables = Tables(*([empty] * 3), concurrent, empty, "")  # type: ignore[arg-type]  # only concurrent is read
        concurrent_slowdown(tables, tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[strategy=ps]", "--workload 1 is not JSON"),
        ('{"job": "strategy=ps"}', "must be a JSON list of override strings"),
    ],
)
def test_a_workload_that_is_not_a_json_list_of_strings_is_refused_by_its_number(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        concurrent_jobs.parse_workload(text, 1)
    assert concurrent_jobs.parse_workload("[\"strategy=ps 'train.seed=1'\"]", 0) == [["strategy=ps", "train.seed=1"]]
