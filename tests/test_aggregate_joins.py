"""Every number of summary.md against the raw records, recomputed here without the aggregate code.

The records (tests/workflow_records.py) give every model, network and N its own throughput, volume
and prediction error, over two networks, three repeats per configuration and a sequential `ps`
ablation: a speedup joined across models, datasets, networks or N, a mean that is really one repeat,
or a median that is really a mean or a max, puts a wrong number into some cell.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ralp_pipe.config.units import rate_bits_per_s
from ralp_pipe.results.aggregate import build_tables, load_records
from ralp_pipe.results.intervals import t_quantile
from ralp_pipe.results.tables import Tables
from workflow_records import write_results

ORDER = ("ps", "ps-sequential", "allreduce", "ralp_h", "ralp_n")
NETWORKS = ("100mbit", "1gbit")
MODELS = ("vgg11", "resnet18")
GPUS = (2, 4)
REPEATS = 3
TABLES = {
    "### Throughput (images/sec) and speedups": "throughput",
    "### Transfer volume (GB/step) and predicted throughput (images/sec, error against the measurement)": "volume",
}
Key = tuple[str, str, str, int, str]  # network, model, dataset, N, strategy row


@dataclass(frozen=True)
class Raw:
    """The raw records below one results folder: lists of repeats keyed by (network, model, dataset, N, row)."""

    records: dict[Key, list[dict[str, Any]]]
    plans: dict[tuple[str, str, str, int], dict[str, Any]]

    def mean(self, key: Key) -> float:
        """Mean images/sec over the repeats of one configuration."""
        return statistics.mean(r["images_per_sec"] for r in self.records[key])

    def pooled(self, key: Key) -> tuple[float, int]:
        """The relative SD pooled over every configuration of `key`'s pool (dilated or not) and its degrees of
        freedom: squared deviations of ln images/sec from each configuration's mean of logs, over the sum of
        repeats - 1."""
        dilated = bool(self.records[key][0].get("dilation"))
        squares, df = 0.0, 0
        for records in self.records.values():
            if bool(records[0].get("dilation")) == dilated:
                logs = [math.log(r["images_per_sec"]) for r in records]
                squares += sum((y - statistics.mean(logs)) ** 2 for y in logs)
                df += len(logs) - 1
        return math.sqrt(squares / df), df

    def half(self, key: Key) -> float:
        """Half-width of the 95% t-interval of the mean (3 repeats) from the pooled relative SD (:meth:`pooled`)."""
        relative, df = self.pooled(key)
        return t_quantile(0.975, df) * relative * self.mean(key) / math.sqrt(REPEATS)

    def error(self, key: Key) -> float | None:
        """(predicted - measured) / measured of one configuration; None for the sequential ablation."""
        if key[4].endswith("-sequential"):
            return None
        plan = self.plans[key[:4]]
        return (plan["strategies"][key[4]]["predicted_images_per_sec"] - self.mean(key)) / self.mean(key)


def read_raw(root: Path) -> Raw:
    """Every metrics.json and plan file below `root`, read straight from disk (row name = the run's folder)."""
    records: dict[Key, list[dict[str, Any]]] = {}
    for path in sorted((root / "runs").rglob("metrics.json")):
        r = json.loads(path.read_text())
        records.setdefault((r["network"], r["model"], r["dataset"], r["gpus"], path.parent.parent.name), []).append(r)
    plans = {}
    for path in sorted((root / "plans").rglob("*.json")):
        gpus, network = re.fullmatch(r"n(\d+)-(.+)", path.stem).groups()  # type: ignore[union-attr]
        plans[(network, path.parent.name, path.parent.parent.name, int(gpus))] = json.loads(path.read_text())
    return Raw(records, plans)


def parse_summary(text: str) -> tuple[dict[str, dict[str, list[list[str]]]], dict[str, str], list[str]]:
    """Tables by network and kind (rows of cells, header first), the accuracy line of each network, other lines."""
    tables: dict[str, dict[str, list[list[str]]]] = {}
    accuracy: dict[str, str] = {}
    other: list[str] = []
    network = kind = None
    for line in text.splitlines():
        if match := re.fullmatch(r"## Network (\S+) \((.+)\)", line):
            network, kind = match.group(1), None
            # the records' rate is their network's name, shaped on their emulated cluster
            assert match.group(2) == f"{rate_bits_per_s(network) / 1e9:.3g} Gbit/s configured tc rate", line
            tables[network] = {}
        elif line.startswith("## "):  # a section other than a network's ends the network's tables
            network = kind = None
            other.append(line)
        elif line in TABLES:
            kind = TABLES[line]
        elif line.startswith("|") and network and kind:
            if not line.startswith("|---"):
                tables[network].setdefault(kind, []).append([cell.strip() for cell in line.strip("|").split("|")])
        elif line.startswith("Median absolute error") and network:
            accuracy[network] = line
        elif line:
            other.append(line)
    return tables, accuracy, other


def assert_shown(cell: str, expected: float) -> None:
    """`cell` shows `expected` rounded to the cell's own number of decimals."""
    number = re.fullmatch(r"(-?\d+(?:\.(\d+))?)[x%]?", cell)
    assert number, f"{cell!r} is not a number"
    decimals = len(number.group(2) or "")
    assert abs(float(number.group(1)) - expected) <= 0.5 * 10**-decimals + 1e-9, f"{cell!r} shows {expected}"


def assert_interval(cell: str, mean: float, half: float | None) -> None:
    """`cell` is `mean ± half` (just `mean` when `half` is None), each rounded as shown."""
    parts = cell.removesuffix("x").split(" ± ")
    assert len(parts) == (1 if half is None else 2), cell
    assert_shown(parts[0], mean)
    if half is not None:
        assert_shown(parts[1], half)


def ratio_half(raw: Raw, top: Key, bottom: Key) -> float:
    """Delta-method 95% half-width of mean(top) / mean(bottom): both sides' relative SD is their pool's, so the
    relative variance of the ratio is 2 s² / 3 and its degrees of freedom the pool's (one estimate behind both)."""
    relative, df = raw.pooled(top)
    return t_quantile(0.975, df) * raw.mean(top) / raw.mean(bottom) * math.sqrt(2 * relative**2 / REPEATS)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Raw, Tables]:
    """Records of 2 models x 2 networks x 2 N x 5 strategy rows x 3 repeats, and the tables aggregated from them."""
    root = tmp_path_factory.mktemp("results")
    runs = write_results(root, models=MODELS, gpus=GPUS, networks=NETWORKS, repeats=REPEATS, sequential=("ps",))
    return read_raw(root), build_tables(load_records(runs, [root / "plans"]))


@pytest.mark.slow
def test_the_records_can_tell_joins_and_medians_apart(results: tuple[Raw, Tables]) -> None:
    """The fixture is discriminating: speedups differ across groups; median, mean and max errors differ."""
    raw, _ = results
    for strategy in ORDER[1:]:
        speedups = [
            raw.mean((n, m, "synthetic1k", g, strategy)) / raw.mean((n, m, "synthetic1k", g, "ps"))
            for n in NETWORKS
            for m in MODELS
            for g in GPUS
        ]
        distinct = len({round(s, 6) for s in speedups})
        assert distinct == len(speedups) or strategy == "ps-sequential", strategy  # the ablation is 0.5x everywhere
    for network in NETWORKS:
        errors = [abs(e) for k in raw.records if k[0] == network and (e := raw.error(k)) is not None]
        median, mean, top = statistics.median(errors), statistics.mean(errors), max(errors)
        assert min(abs(median - mean), abs(median - top), abs(mean - top)) > 0.01, (median, mean, top)


@pytest.mark.slow
def test_every_table_cell_of_the_summary_matches_the_raw_records(results: tuple[Raw, Tables]) -> None:
    """Per configuration: settings, mean ± interval, per device, speedups ± intervals, GB/step, prediction."""
    raw, summary = results[0], results[1].summary
    tables, _, _ = parse_summary(summary)
    assert sorted(tables) == sorted(NETWORKS)
    for network in NETWORKS:
        assert set(tables[network]) == set(TABLES.values())
        expected = sorted(
            (k for k in raw.records if k[0] == network), key=lambda k: (k[1], k[2], k[3], ORDER.index(k[4]))
        )
        for kind, (header, *rows) in tables[network].items():
            assert header[:7] == ["model", "dataset", "classes", "N", "strategy", "devices", "global batch"], header
            assert [(network, r[0], r[1], int(r[3]), r[4]) for r in rows] == expected, (network, kind)
            for row in rows:
                key = (network, row[0], row[1], int(row[3]), row[4])
                first = raw.records[key][0]
                devices = first["world_size"]
                assert row[2] == str(first["num_classes"]) and row[5] == str(devices)
                assert row[6] == str(first["global_batch"]) == str(first["workers"] * first["batch_size"])
                if kind == "throughput":
                    assert header[7:] == [
                        "split",
                        "repeats",
                        "images/sec",
                        "per device",
                        "step p50 / p95 (s)",
                        "vs ps",
                        "vs allreduce",
                    ]
                    assert row[7] == ("-" if first["split"] is None else f"layer4.0 ({first['split']})")
                    assert row[8] == str(REPEATS)
                    assert_interval(row[9], raw.mean(key), raw.half(key))
                    assert_interval(row[10], raw.mean(key) / devices, raw.half(key) / devices)
                    for cell, base in zip(row[12:], ("ps", "allreduce"), strict=True):
                        bottom = (*key[:4], base)
                        same = key == bottom
                        assert_interval(
                            cell, raw.mean(key) / raw.mean(bottom), None if same else ratio_half(raw, key, bottom)
                        )
                else:
                    assert_shown(row[7], first["gb_per_step"]["total"])
                    error = raw.error(key)
                    if error is None:
                        assert row[9] == "-"
                        continue
                    shown = re.fullmatch(r"(\S+) \((\S+)\)", row[9])
                    assert shown, row[9]
                    assert_shown(shown.group(1), raw.plans[key[:4]]["strategies"][key[4]]["predicted_images_per_sec"])
                    assert_shown(shown.group(2), 100 * error)


@pytest.mark.slow
def test_each_network_states_the_median_error_of_its_own_configurations(results: tuple[Raw, Tables]) -> None:
    """The accuracy line: the median |error| of that network's configurations with a prediction, and their count."""
    raw, summary = results[0], results[1].summary
    _, accuracy, _ = parse_summary(summary)
    assert sorted(accuracy) == sorted(NETWORKS)
    for network in NETWORKS:
        errors = [abs(e) for k in raw.records if k[0] == network and (e := raw.error(k)) is not None]
        line = re.fullmatch(
            r"Median absolute error of predicted images/sec: (\S+)% over (\d+) configurations with a prediction\.",
            accuracy[network],
        )
        assert line, accuracy[network]
        assert_shown(line.group(1), 100 * statistics.median(errors))
        assert int(line.group(2)) == len(errors) == 16


@pytest.mark.slow
def test_the_counts_are_those_of_the_records(results: tuple[Raw, Tables]) -> None:
    """The opening line counts every configuration and every run of every network."""
    raw, summary = results[0], results[1].summary
    _, _, other = parse_summary(summary)
    runs = sum(len(v) for v in raw.records.values())
    assert len(raw.records) == len(NETWORKS) * len(MODELS) * len(GPUS) * len(ORDER) and runs == REPEATS * len(
        raw.records
    )
    assert [line for line in other if re.match(r"\d+ configurations", line)] == [
        next(
            line
            for line in other
            if line.startswith(f"{len(raw.records)} configurations, {runs} runs (3 repeats each).")
        )
    ]


@pytest.mark.slow
def test_speedup_and_error_of_every_row_of_the_parquet_tables_match_the_raw_records(
    results: tuple[Raw, Tables],
) -> None:
    """runs.parquet's means, intervals, speedups and errors and speedups.parquet's baselines are the row's own group's."""
    raw, tables = results
    assert len(tables.runs) == len(tables.speedups) == len(raw.records)
    assert len(tables.repeats) == REPEATS * len(raw.records)
    for run, speed in zip(tables.runs.itertuples(), tables.speedups.itertuples(), strict=True):
        key = (run.network, run.model, run.dataset, run.gpus, run.strategy)
        ps, allreduce = (*key[:4], "ps"), (*key[:4], "allreduce")
        assert run.images_per_sec == pytest.approx(raw.mean(key))
        assert (run.images_per_sec_ci_high - run.images_per_sec_ci_low) / 2 == pytest.approx(raw.half(key))
        own = statistics.stdev(r["images_per_sec"] for r in raw.records[key])
        assert run.images_per_sec_own_std == pytest.approx(own)
        assert run.images_per_sec_std == pytest.approx(raw.pooled(key)[0] * raw.mean(key))
        assert run.speedup_vs_ps == pytest.approx(raw.mean(key) / raw.mean(ps))
        assert run.speedup_vs_allreduce == pytest.approx(raw.mean(key) / raw.mean(allreduce))
        if key != ps:
            assert (run.speedup_vs_ps_ci_high - run.speedup_vs_ps_ci_low) / 2 == pytest.approx(ratio_half(raw, key, ps))
        assert run.overlap == (key[4] != "ps-sequential")
        error = raw.error(key)
        assert math.isnan(run.prediction_error) if error is None else run.prediction_error == pytest.approx(error)
        assert (speed.network, speed.model, speed.dataset, speed.gpus, speed.strategy) == key
        assert speed.ps_images_per_sec == pytest.approx(raw.mean(ps))
        assert speed.allreduce_images_per_sec == pytest.approx(raw.mean(allreduce))
        assert speed.speedup_vs_ps == pytest.approx(run.speedup_vs_ps) and speed.interval_method == "delta"
