"""Every number of summary.md against the raw records, recomputed here without the aggregate code.

The records (tests/workflow_records.py) give every model, network and N its own throughput, volume
and prediction error, over two networks: a speedup joined across models, datasets, networks or N,
or a median that is really a mean or a max, puts a wrong number into some cell.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ralp_pipe.results.aggregate import Tables, build_tables, load_records
from workflow_records import write_results

ORDER = ("ps", "allreduce", "ralp_h", "ralp_n")
NETWORKS = ("100mbit", "1gbit")
MODELS = ("vgg11", "resnet18")
GPUS = (2, 4)
TABLES = {
    "### Throughput (images/sec) and speedup over ps": "throughput",
    "### Transfer volume (GB/step, all categories)": "volume",
    "### Predicted throughput (images/sec) and its error against the measurement": "predicted",
}


@dataclass(frozen=True)
class Raw:
    """The raw records below one results folder, keyed by (network, model, dataset, N, strategy)."""

    records: dict[tuple[str, str, str, int, str], dict[str, Any]]
    plans: dict[tuple[str, str, str, int], dict[str, Any]]

    def group(self, network: str, model: str, dataset: str, gpus: int) -> dict[str, dict[str, Any]]:
        """The records of one (network, model, dataset, N), by strategy."""
        return {k[4]: r for k, r in self.records.items() if k[:4] == (network, model, dataset, gpus)}

    def error(self, key: tuple[str, str, str, int, str]) -> float:
        """(predicted - measured) / measured images/sec of one run, from its plan file."""
        measured = self.records[key]["images_per_sec"]
        plan = self.plans[(key[0], key[1], key[2], key[3])]
        return (plan["strategies"][key[4]]["predicted_images_per_sec"] - measured) / measured


def read_raw(root: Path) -> Raw:
    """Every metrics.json and plan file below `root`, read straight from disk."""
    records = {}
    for path in sorted((root / "runs").rglob("metrics.json")):
        r = json.loads(path.read_text())
        records[(r["network"], r["model"], r["dataset"], r["gpus"], r["strategy"])] = r
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
        if match := re.fullmatch(r"## Network (\S+) \((\S+)\)", line):
            network, kind = match.group(1), None
            assert match.group(2) == network, line  # the records' rate is their network's name
            tables[network] = {}
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


def expected_rows(raw: Raw, network: str) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """Per (model, dataset, classes, N) of `network`: throughput, speedup, GB/step, prediction and error."""
    rows = {}
    for model, dataset, gpus in sorted({(k[1], k[2], k[3]) for k in raw.records if k[0] == network}):
        runs = raw.group(network, model, dataset, gpus)
        classes = {r["num_classes"] for r in runs.values()}
        assert len(classes) == 1
        ps = runs["ps"]["images_per_sec"]
        rows[(model, dataset, str(classes.pop()), str(gpus))] = {
            "images_per_sec": [runs[s]["images_per_sec"] for s in ORDER],
            "speedup": [runs[s]["images_per_sec"] / ps for s in ORDER[1:]],
            "gb_total": [runs[s]["gb_per_step"]["total"] for s in ORDER],
            "predicted": [
                raw.plans[(network, model, dataset, gpus)]["strategies"][s]["predicted_images_per_sec"] for s in ORDER
            ],
            "error_pct": [100 * raw.error((network, model, dataset, gpus, s)) for s in ORDER],
        }
    return rows


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Raw, Tables]:
    """Records of 2 models x 2 networks x 2 N x 4 strategies, and the tables aggregated from them."""
    root = tmp_path_factory.mktemp("results")
    runs = write_results(root, models=MODELS, gpus=GPUS, networks=NETWORKS)
    return read_raw(root), build_tables(load_records(runs, root / "plans"))


def test_the_records_can_tell_joins_and_medians_apart(results: tuple[Raw, Tables]) -> None:
    """The fixture is discriminating: speedups differ across groups; median, mean and max errors differ."""
    raw, _ = results
    for strategy in ORDER[1:]:
        speedups = [
            raw.records[(n, m, "synthetic1k", g, strategy)]["images_per_sec"]
            / raw.records[(n, m, "synthetic1k", g, "ps")]["images_per_sec"]
            for n in NETWORKS
            for m in MODELS
            for g in GPUS
        ]
        assert len({round(s, 6) for s in speedups}) == len(speedups), strategy
    for network in NETWORKS:
        errors = [abs(raw.error(k)) for k in raw.records if k[0] == network]
        median, mean, top = statistics.median(errors), statistics.mean(errors), max(errors)
        assert min(abs(median - mean), abs(median - top), abs(mean - top)) > 0.01, (median, mean, top)


def test_every_table_cell_of_the_summary_matches_the_raw_records(results: tuple[Raw, Tables]) -> None:
    """Throughput, speedup, GB/step, prediction and error of every row, and no row more or less."""
    raw, summary = results[0], results[1].summary
    tables, _, _ = parse_summary(summary)
    assert sorted(tables) == sorted(NETWORKS)
    for network in NETWORKS:
        expected = expected_rows(raw, network)
        assert set(tables[network]) == set(TABLES.values())
        for kind, (header, *rows) in tables[network].items():
            assert header[:4] == ["model", "dataset", "classes", "N"] and header[4:8] == list(ORDER), header
            assert [tuple(r[:4]) for r in rows] == list(expected), (network, kind)
            for row in rows:
                want = expected[tuple(row[:4])]
                if kind == "throughput":
                    assert header[8:] == [f"{s} speedup" for s in ORDER[1:]]
                    for cell, value in zip(row[4:], want["images_per_sec"] + want["speedup"], strict=True):
                        assert_shown(cell, value)
                elif kind == "volume":
                    for cell, value in zip(row[4:], want["gb_total"], strict=True):
                        assert_shown(cell, value)
                else:
                    for cell, predicted, error in zip(row[4:], want["predicted"], want["error_pct"], strict=True):
                        shown = re.fullmatch(r"(\S+) \((\S+)\)", cell)
                        assert shown, cell
                        assert_shown(shown.group(1), predicted)
                        assert_shown(shown.group(2), error)


def test_each_network_states_the_median_error_of_its_own_runs(results: tuple[Raw, Tables]) -> None:
    """The accuracy line: the median |error| of that network's runs with a plan, and how many there are."""
    raw, summary = results[0], results[1].summary
    _, accuracy, _ = parse_summary(summary)
    assert sorted(accuracy) == sorted(NETWORKS)
    for network in NETWORKS:
        errors = [abs(raw.error(k)) for k in raw.records if k[0] == network]
        line = re.fullmatch(
            r"Median absolute error of predicted images/sec: (\S+)% over (\d+) runs with a plan\.", accuracy[network]
        )
        assert line, accuracy[network]
        assert_shown(line.group(1), 100 * statistics.median(errors))
        assert int(line.group(2)) == len(errors) == 16


def test_the_run_count_is_that_of_the_records(results: tuple[Raw, Tables]) -> None:
    """The opening line counts every run of every network."""
    raw, summary = results[0], results[1].summary
    _, _, other = parse_summary(summary)
    counts = [line for line in other if re.match(r"\d+ runs;", line)]
    assert counts == [next(line for line in other if line.startswith(f"{len(raw.records)} runs;"))]
    assert len(raw.records) == len(NETWORKS) * len(MODELS) * len(GPUS) * len(ORDER)


def test_speedup_and_error_of_every_row_of_the_parquet_tables_match_the_raw_records(
    results: tuple[Raw, Tables],
) -> None:
    """runs.parquet's speedup and error and speedups.parquet's ps baseline are those of the row's own group."""
    raw, tables = results
    assert len(tables.runs) == len(tables.speedups) == len(raw.records)
    for run, speed in zip(tables.runs.itertuples(), tables.speedups.itertuples(), strict=True):
        key = (run.network, run.model, run.dataset, run.gpus, run.strategy)
        ps = raw.records[(*key[:4], "ps")]["images_per_sec"]
        assert run.images_per_sec == raw.records[key]["images_per_sec"]
        assert run.speedup_vs_ps == pytest.approx(raw.records[key]["images_per_sec"] / ps)
        assert run.prediction_error == pytest.approx(raw.error(key))
        assert (speed.network, speed.model, speed.dataset, speed.gpus, speed.strategy) == key
        assert speed.ps_images_per_sec == pytest.approx(ps) and speed.speedup == pytest.approx(run.speedup_vs_ps)
