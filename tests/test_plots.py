"""The plots draw what the tables hold: ideal scaling from the N=1 reference, whiskers from the intervals, log GB/step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

from ralp_pipe.contract.layout import PLOT_NAMES
from ralp_pipe.results import plots
from ralp_pipe.results.aggregate import build_tables, load_records
from ralp_pipe.results.tables import Tables
from workflow_records import write_results

REPEATS = 3


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Tables:
    """vgg11 and resnet18, all strategies at N=2 and 4 with the ps ablation, and the N=1 reference; 3 repeats."""
    root = tmp_path_factory.mktemp("plots")
    runs = write_results(root, gpus=(2, 4), repeats=REPEATS, sequential=("ps",))
    runs += write_results(root, strategies=("allreduce",), gpus=(1,), repeats=REPEATS)
    return build_tables(load_records(runs, [root / "plans"]))


def drawn(monkeypatch: pytest.MonkeyPatch, plot: Any, tables: Tables) -> Any:
    """The figure `plot` draws from `tables`, kept instead of saved."""
    figures: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    plot(tables, Path("unused.png"))
    [figure] = figures
    return figure


def panel(figure: Any, title: str) -> Any:
    """The axes of `figure` whose title starts with `title`."""
    [axis] = [a for a in figure.axes if a.get_title().startswith(title)]
    return axis


def whiskers(container: ErrorbarContainer) -> list[float]:
    """Low and high end of each vertical or horizontal whisker of an errorbar container, one after the other."""
    [segments] = [lines.get_segments() for lines in container.lines[2]]
    return [end for a, b in segments for end in sorted((a[0], b[0]) if a[1] == b[1] else (a[1], b[1]))]


def ends(rows: pd.DataFrame, column: str) -> list[float]:
    """The interval ends of `column` in the order :func:`whiskers` gives them."""
    return [end for pair in zip(rows[f"{column}_ci_low"], rows[f"{column}_ci_high"]) for end in pair]


def config(tables: Tables, model: str, strategy: str) -> pd.DataFrame:
    runs = tables.runs
    return runs[(runs["model"] == model) & (runs["strategy"] == strategy)].sort_values("gpus")


@pytest.mark.slow  # renders every plot to PNG (~3 s); test_aggregate's CLI test writes every plot of fewer runs
def test_every_plot_is_written_as_a_png(tables: Tables, tmp_path: Path) -> None:
    paths = plots.write_plots(tables, tmp_path)
    assert [p.name for p in paths] == [f"{name}.png" for name in PLOT_NAMES]
    assert all(p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for p in paths)
    plt.close("all")


@pytest.mark.slow
def test_throughput_has_interval_whiskers_and_the_ideal_line_from_the_single_device_run(
    tables: Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    axis = panel(drawn(monkeypatch, plots.throughput_vs_n, tables), "vgg11 / synthetic1k")
    reference = config(tables, "vgg11", "allreduce").iloc[0]
    assert reference["gpus"] == 1 and reference["repeats"] == REPEATS
    [ideal] = [line for line in axis.lines if line.get_label() == "ideal: N x single device"]
    # N x the reference's mean images/sec, from N=1 to the largest N (4)
    assert list(ideal.get_xdata()) == [1, 4]
    assert list(ideal.get_ydata()) == pytest.approx([reference["images_per_sec"], 4 * reference["images_per_sec"]])
    [ps] = [c for c in axis.containers if isinstance(c, ErrorbarContainer) and c.get_label() == "ps @ 1gbit"]
    rows = config(tables, "vgg11", "ps")
    assert whiskers(ps) == pytest.approx(ends(rows, "images_per_sec"))
    [ablation] = [c for c in axis.containers if c.get_label() == "ps-sequential @ 1gbit"]
    faces = [container.lines[0].get_markerfacecolor() for container in (ps, ablation)]
    assert faces[1] == "white" != faces[0]  # the ablation's points are hollow, so a lone one is told apart
    plt.close("all")


def test_scaling_efficiency_divides_by_n_times_the_reference(tables: Tables, monkeypatch: pytest.MonkeyPatch) -> None:
    axis = panel(drawn(monkeypatch, plots.scaling_efficiency, tables), "resnet18 / synthetic1k")
    reference = config(tables, "resnet18", "allreduce").iloc[0]["images_per_sec"]
    rows = config(tables, "resnet18", "ralp_n")
    [line] = [c for c in axis.containers if isinstance(c, ErrorbarContainer) and c.get_label() == "ralp_n @ 1gbit"]
    points = line.lines[0]
    assert list(points.get_xdata()) == [2, 4]
    assert list(points.get_ydata()) == pytest.approx(list(rows["images_per_sec"] / (rows["gpus"] * reference)))
    plt.close("all")


def test_without_a_reference_run_the_plots_say_so_instead_of_an_ideal_line(
    tables: Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tables.runs[tables.runs["gpus"] > 1].reset_index(drop=True)
    partial = Tables(runs, tables.repeats, tables.speedups, tables.concurrent, tables.breakdown, tables.summary)
    axis = drawn(monkeypatch, plots.throughput_vs_n, partial).axes[0]
    assert not [line for line in axis.lines if line.get_label().startswith("ideal")]
    assert plots.NO_REFERENCE in [text.get_text() for text in axis.texts]
    efficiency = drawn(monkeypatch, plots.scaling_efficiency, partial).axes[0]
    assert any(plots.NO_REFERENCE in text.get_text() for text in efficiency.texts)
    plt.close("all")


def test_speedup_bars_and_whiskers_are_the_tables_over_each_baseline(
    tables: Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    over_ps, over_allreduce = drawn(monkeypatch, plots.speedup, tables).axes
    for axis, baseline in ((over_ps, "ps"), (over_allreduce, "allreduce")):
        column = f"speedup_vs_{baseline}"
        labels = [c.get_label() for c in axis.containers if isinstance(c, BarContainer)]
        assert baseline not in labels and "ralp_n" in labels
        [bars] = [c for c in axis.containers if isinstance(c, BarContainer) and c.get_label() == "ralp_n"]
        rows = tables.runs[(tables.runs["strategy"] == "ralp_n")].sort_values(["model", "dataset", "gpus"])
        assert [bar.get_height() for bar in bars] == pytest.approx(list(rows[column]))
        assert whiskers(bars.errorbar) == pytest.approx(ends(rows, column))
    plt.close("all")


def test_gb_per_step_is_on_a_log_axis_where_every_strategys_bars_are_visible(
    tables: Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    axis = panel(drawn(monkeypatch, plots.gb_per_step, tables), "vgg11 / synthetic1k, N=4")
    assert axis.get_yscale() == "log"
    bottom, _ = axis.get_ylim()
    heights = [bar.get_height() for c in axis.containers for bar in c]
    assert min(heights) >= 3 * bottom  # the smallest bar spans a third of a decade or more
    rows = config(tables, "vgg11", "ralp_n")
    total = rows[rows["gpus"] == 4]["gb_total"].iloc[0]
    assert f"{total:.3g} GB" in [text.get_text() for text in axis.texts]
    plt.close("all")


def test_breakdown_stacks_the_parts_of_each_configurations_step(
    tables: Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    axis = panel(drawn(monkeypatch, plots.breakdown, tables), "vgg11 / synthetic1k, 1gbit")
    stacks = [c for c in axis.containers if isinstance(c, BarContainer) and c.get_label() in plots.PART_LABELS.values()]
    tops = np.sum([[bar.get_height() for bar in c] for c in stacks], axis=0)
    expected = plots.by_configuration(tables.breakdown)
    expected = expected[expected["model"] == "vgg11"].sort_values("gpus", kind="stable")
    assert list(tops) == pytest.approx(list(expected["step_time_s"]))  # compute + comm wait + data wait = step
    plt.close("all")


def test_without_predictions_the_prediction_plot_says_so(tables: Tables, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tables.runs.assign(predicted_images_per_sec=float("nan"))
    unplanned = Tables(runs, tables.repeats, tables.speedups, tables.concurrent, tables.breakdown, tables.summary)
    [axis] = drawn(monkeypatch, plots.predicted_vs_measured, unplanned).axes
    assert [text.get_text() for text in axis.texts] == [
        "no configuration has a planner prediction (no plan for its N and network)"
    ]
    plt.close("all")


def test_predictions_are_plotted_against_the_measured_interval(tables: Tables, monkeypatch: pytest.MonkeyPatch) -> None:
    [axis] = drawn(monkeypatch, plots.predicted_vs_measured, tables).axes
    [ralp] = [c for c in axis.containers if isinstance(c, ErrorbarContainer) and c.get_label() == "ralp_h"]
    rows = tables.runs[tables.runs["strategy"] == "ralp_h"]
    assert list(ralp.lines[0].get_ydata()) == pytest.approx(list(rows["predicted_images_per_sec"]))
    assert whiskers(ralp) == pytest.approx(ends(rows, "images_per_sec"))  # horizontal: the measurement's interval
    low, high = axis.get_xlim()
    planned = tables.runs.dropna(subset=["predicted_images_per_sec"])
    assert low < planned["images_per_sec_ci_low"].min() and planned["images_per_sec_ci_high"].max() < high
    plt.close("all")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("low", "high", "labels"),
    [
        (5.2, 45.6, ["6", "7", "8", "9", "10", "20", "30", "40"]),  # under a decade: every digit
        (0.01, 5.0, ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5"]),  # up to three: 1, 2, 5
        (1e-7, 2.0, ["1e-07", "1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1", "1"]),  # more: powers of ten
    ],
)
def test_a_log_axis_labels_plain_numbers_however_narrow_its_range(low: float, high: float, labels: list[str]) -> None:
    figure, axis = plt.subplots()
    plots._log_scale(axis, "y", low, high)
    figure.canvas.draw()
    shown = [t.get_text() for t in axis.get_yticklabels() if t.get_text() and low <= t.get_position()[1] <= high]
    assert shown == labels
    plt.close("all")


@pytest.mark.slow
def test_the_headline_draws_ralp_speedups_against_the_link_rate_with_the_prediction(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = write_results(tmp_path, models=("vgg11",), gpus=(4,), networks=("100mbit", "1gbit"), repeats=REPEATS)
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
    figure = drawn(monkeypatch, plots.speedup_vs_link, tables)
    rows = tables.runs.set_index(["strategy", "network"])
    for axis, baseline in zip(figure.axes, ("ps", "allreduce")):
        measured = [c for c in axis.containers if isinstance(c, ErrorbarContainer)]
        assert len(measured) == 2  # ralp_h and ralp_n, each over both links
        lines = {line.get_label(): line for line in axis.get_lines() if "predicted" in str(line.get_label())}
        for strategy in ("ralp_h", "ralp_n"):
            line = lines[f"vgg11/synthetic1k N=4 {strategy} predicted"]
            assert list(line.get_xdata()) == pytest.approx([0.1, 1.0])
            want = [
                rows.loc[(strategy, net), "predicted_images_per_sec"]
                / rows.loc[(baseline, net), "predicted_images_per_sec"]
                for net in ("100mbit", "1gbit")
            ]
            assert list(line.get_ydata()) == pytest.approx(want)
        # ratios on a log axis; the link rates themselves are the x ticks
        assert axis.get_yscale() == "log" and axis.get_xscale() == "log"
        assert [tick.get_text() for tick in axis.get_xticklabels()] == ["0.1", "1"]
        # which point is which: RALP-N filled circles, RALP-H open squares, both named in the legend
        points = {c.lines[0].get_marker(): c.lines[0].get_markerfacecolor() for c in measured}
        assert set(points) == {"o", "s"} and points["s"] == "none"
    # one legend, beside the panels: it covers no line or point of either
    left, right = figure.axes
    assert left.get_legend() is None
    legend = right.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == [
        "vgg11/synthetic1k N=4",
        "RALP-N: predicted (line), measured (point)",
        "RALP-H: predicted (line), measured (point)",
    ]
    plots._lay_out(figure)
    figure.canvas.draw()
    box = legend.get_window_extent()
    assert not any(box.overlaps(axis.get_window_extent()) for axis in figure.axes)
    assert box.x1 <= figure.bbox.x1  # and inside the figure
    one = write_results(tmp_path / "one", models=("vgg11",), gpus=(4,), repeats=1)
    single = drawn(monkeypatch, plots.speedup_vs_link, build_tables(load_records(one, [tmp_path / "one" / "plans"])))
    assert "one link rate" in single.axes[0].texts[0].get_text()
    assert single.get_suptitle().startswith("RALP speedup vs link rate")  # titled like the full headline
