"""summary.md's sections on trust: real vs modelled with its twin, profiles and splits, the intervals' pools."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from ralp_pipe.contract.records import Plan
from ralp_pipe.results.fidelity import intervals_markdown, modes_markdown, profiles_markdown, twin_of
from ralp_pipe.results.intervals import Estimate, ratio_interval
from ralp_pipe.results.tables import order


def _row(strategy: str, variant: str | None, mode: str | None, factor: float, mean: float, **extra: object) -> dict:
    """A runs.parquet row of ResNet-18 N=2 on 10gbit: 2 repeats, pooled relative SD 1% at 40 df."""
    half = 2.021 * 0.01 * mean / math.sqrt(2)
    return {
        "model": "resnet18",
        "dataset": "synthetic1k",
        "gpus": 2,
        "network": "10gbit",
        "strategy": strategy,
        "variant": variant,
        "dilation_mode": mode,
        "dilation_factor": factor,
        "loader": "dali" if mode == "real" else "synthetic",
        "repeats": 2,
        "images_per_sec": mean,
        "images_per_sec_std": 0.01 * mean,
        "images_per_sec_own_std": 0.005 * mean,
        "images_per_sec_df": 40.0,
        "images_per_sec_ci_low": mean - half,
        "images_per_sec_ci_high": mean + half,
        "interval_pool": "dilated" if mode else "undilated",
        "overruns": 0,
        "stalls": 1,
        **extra,
    }


@pytest.fixture
def runs() -> pd.DataFrame:
    rows = [
        _row("ralp_n", None, "modelled", 8.0, 600.0),
        _row("ralp_n-d16", "d16", "modelled", 16.0, 590.0),
        _row("ralp_n-real", "real", "real", 16.0, 595.0),
        _row("ps", None, "modelled", 8.0, 400.0, images_per_sec_own_std=12.0),
    ]
    frame = pd.DataFrame(rows)
    return frame.astype({"variant": "string", "dilation_mode": "string", "loader": "string"})


def test_the_real_configuration_is_compared_with_its_modelled_twin_at_the_same_d(runs: pd.DataFrame) -> None:
    real = next(r for r in runs.itertuples() if r.strategy == "ralp_n-real")
    twin = twin_of(real, runs)
    assert twin is not None and twin.strategy == "ralp_n-d16"  # the same D, not the matrix's D = 8 row
    text = modes_markdown(runs)
    e = {m: Estimate(m, 0.01 * m, 2, 2.021 * 0.01 * m / math.sqrt(2), 40.0) for m in (595.0, 590.0)}
    change = ratio_interval(e[595.0], e[590.0])
    expected = f"real - modelled = {100 * (change.mean - 1):.1f} ± {100 * change.half_width:.1f}%"
    assert "## Real vs modelled" in text and expected in text and "at D = 16 and 16" in text
    assert "| resnet18 | 2 | 10gbit | ralp_n | ralp_n-real | real | 16 | dali | 2 |" in text


def test_without_a_real_configuration_there_is_no_section_and_without_a_twin_it_says_so(runs: pd.DataFrame) -> None:
    assert modes_markdown(runs[runs["dilation_mode"] != "real"]) == ""
    alone = runs[runs["strategy"].isin(["ralp_n-real", "ps"])]
    assert "no modelled twin in this experiment" in modes_markdown(alone)


def test_profiles_and_splits_show_both_plans_of_one_configuration() -> None:
    def plan(kind: str, device: str, split: int, unit: str, predicted: float) -> Plan:
        entry = {"split": split, "split_after_unit": unit, "predicted_images_per_sec": predicted}
        return Plan(profile_kind=kind, profile_device=device, strategies={"ralp_n": entry, "ps": {"split": None}})

    key = ("synthetic1k", "alexnet", 2, "10gbit")
    text = profiles_markdown(
        {key: plan("measured", "cpu", 6, "features.12", 9.5)},
        {key: plan("modelled", "v100", 8, "classifier.1", 1234.0)},
    )
    lines = text.splitlines()
    modelled = "| alexnet | synthetic1k | 2 | 10gbit | modelled (v100) | ralp_n | classifier.1 (8) | 1234.0 |"
    measured = "| alexnet | synthetic1k | 2 | 10gbit | measured (cpu) | ralp_n | features.12 (6) | 9.5 |"
    assert lines.index(modelled) < lines.index(measured)
    assert "| alexnet | synthetic1k | 2 | 10gbit | measured (cpu) | ps | - | - |" in lines
    assert profiles_markdown({}, {key: plan("modelled", "v100", 8, "x", 1.0)}) == ""


def test_the_intervals_section_names_each_pool_its_widest_half_width_and_the_overruns(runs: pd.DataFrame) -> None:
    text = intervals_markdown(runs)
    assert "| dilated | 4 | 40 | 1.00% | 3.00% (resnet18 N=2 10gbit ps) |" in text
    assert f"{100 * 2.021 * 0.01 / math.sqrt(2):.2f}%" in text
    assert "Overruns: 0 over the 8 dilated runs (stalls: 4)." in text


def test_variant_rows_follow_their_strategy_in_one_order_whatever_order_the_records_came_in() -> None:
    names = ["ralp_n-real", "ps", "ralp_n", "ralp_n-d16", "ps-sequential", "allreduce"]
    expected = ["ps", "ps-sequential", "allreduce", "ralp_n", "ralp_n-d16", "ralp_n-real"]
    for shuffled in (names, names[::-1]):
        frame = pd.DataFrame({"model": "resnet18", "strategy": shuffled})
        assert list(order(frame, ["model", "strategy"])["strategy"]) == expected
