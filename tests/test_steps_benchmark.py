"""benchmarks/steps.py's arithmetic on a synthetic steps table: windows of one long run and the recipe it chooses."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from ralp_pipe.results.intervals import mean_interval


def load_steps() -> ModuleType:
    """benchmarks/steps.py as a module (the benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "steps.py"
    spec = importlib.util.spec_from_file_location("steps_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


steps = load_steps()
REF = steps.Recipe(5, 100)


def table(times: list[float]) -> pd.DataFrame:
    """steps.parquet rows of a PS (slow, ignored) and two workers whose step times straddle `times`."""
    rows = []
    for step, t in enumerate(times):
        rows.append({"rank": 0, "role": "ps", "step": step, "step_time_s": 10 * t})
        rows += [{"rank": r, "role": "worker", "step": step, "step_time_s": t + d} for r, d in ((1, -0.01), (2, 0.01))]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # any row order


def test_step_times_are_the_workers_mean_in_step_order() -> None:
    times = [1.0 + 0.1 * (i % 3) for i in range(12)]
    assert steps.step_times(table(times)) == pytest.approx(times)
    with pytest.raises(ValueError, match="no worker rows"):
        steps.step_times(pd.DataFrame({"role": ["ps"], "step": [0], "step_time_s": [1.0]}))


def test_a_window_is_images_per_step_times_d_times_k_over_its_summed_time() -> None:
    times = [2.0, 1.0, 1.0, 3.0]
    assert steps.figure(times, 1, 2, 128, 8.0) == pytest.approx(128 * 8 * 2 / 2.0)
    with pytest.raises(ValueError, match="outside the 4 steps"):
        steps.figure(times, 3, 2, 128, 8.0)


def test_slow_warm_ups_are_what_a_later_start_leaves_out() -> None:
    # two slow first steps, then a steady 1 s step: k steps after 1 warm-up are slow, after 2 they are exact
    times = [3.0, 1.5] + [1.0] * 103
    rows = pd.DataFrame(steps.recipe_rows(times, 100, 1.0, REF, ks=(2, 10), warmups=(1, 2)))
    assert list(rows.recipe) == ["1+2", "1+10", "2+2", "2+10"]
    assert rows.reference.tolist() == pytest.approx([100.0] * 4) and rows.reference_half.tolist() == [0.0] * 4
    assert rows.prefix.tolist() == pytest.approx([200 / 2.5, 1000 / 10.5, 100.0, 100.0])
    assert rows.prefix_dev.iloc[0] == pytest.approx(-0.2)
    # windows after 1 warm-up: steps 1-2, 3-4, ... up to step 104: the first carries the slow step
    assert rows.windows.iloc[0] == 52 and rows.windows.iloc[1] == 10
    first = 200 / 2.5 / 100 - 1
    assert rows.window_rms.iloc[0] == pytest.approx(math.sqrt(first**2 / 52))
    assert steps.choose(rows.assign(run="a"), 0.01) == steps.Recipe(2, 2)


def test_the_choice_is_the_smallest_k_then_w_within_tolerance_in_every_run() -> None:
    steady = [1.0] * 105
    # alternating 0.9 / 1.1 s steps: 2-step windows are exact, 3-step ones off by up to 3.3%, 10-step ones exact
    wobbly = [0.9 if i % 2 else 1.1 for i in range(105)]
    rows = [
        {"run": run, **row}
        for run, times in (("steady", steady), ("wobbly", wobbly))
        for row in steps.recipe_rows(times, 32, 8.0, REF, ks=(3, 10), warmups=(1, 2))
    ]
    frame = pd.DataFrame(rows)
    assert steps.choose(frame, 0.01) == steps.Recipe(1, 10)
    assert steps.choose(frame, 0.05) == steps.Recipe(1, 3)
    assert steps.choose(frame[frame.k == 3], 0.01) is None
    # the reference's interval: 10 batch means of 10 steps, each the same here
    figure, half = steps.reference(wobbly, 5, 100, 32, 8.0)
    batches = [steps.figure(wobbly, 5 + 10 * b, 10, 32, 8.0) for b in range(10)]
    assert figure == pytest.approx(32 * 8 * 100 / sum(wobbly[5:105]))
    assert half == pytest.approx(mean_interval(batches).half_width)


def test_the_record_holds_each_recipes_worst_deviation_as_the_docs_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wobbly = [0.9 if i % 2 else 1.1 for i in range(105)]
    rows = pd.DataFrame(
        [
            {"run": run, **row}
            for run, times in (("steady", [1.0] * 105), ("wobbly", wobbly))
            for row in steps.recipe_rows(times, 32, 8.0, REF, ks=(2, 3), warmups=(1,))
        ]
    )
    worst = steps.worst_deviations(rows)
    assert list(worst) == ["1+2", "1+3"]  # recipe order: k, then w
    assert worst["1+2"] == pytest.approx(0.0, abs=1e-9) and 0.02 < worst["1+3"] < 0.04

    monkeypatch.setattr(sys, "argv", ["benchmarks/steps.py", "--record", "x.json"])
    path = tmp_path / "steps.json"
    steps.write_record(path, {"worst_deviation_pct": {k: round(100 * v, 2) for k, v in worst.items()}})
    docs = importlib.util.spec_from_file_location(
        "records", Path(__file__).resolve().parents[1] / "docs" / "records.py"
    )
    assert docs is not None and docs.loader is not None
    records = importlib.util.module_from_spec(docs)
    docs.loader.exec_module(records)
    monkeypatch.setattr(records, "RECORDS", tmp_path)
    assert records.value("steps", "worst_deviation_pct.1+3") == round(100 * worst["1+3"], 2)
    assert records.value_of("steps", "command") == "python benchmarks/steps.py --record x.json"
