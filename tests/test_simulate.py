"""The simulator over N and link speed, and the prediction-error join of measured runs."""

from __future__ import annotations

import json
import math
import time

import pandas as pd
import pytest
import yaml
from PIL import Image

from ralp_pipe import cli
from ralp_pipe.config import STRATEGIES, ConfigError, StrategyConfig
from ralp_pipe.contract.topology import topology
from ralp_pipe.engine import models
from ralp_pipe.engine.volume import step_bytes
from ralp_pipe.planning.costmodel import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, compute_costs
from ralp_pipe.planning.planner import whole_variables
from ralp_pipe.planning.simulate import MAX_GPUS, Grid, Servers, simulate
from support.prediction import plan_predictions, prediction_error
from support.profiles import analytic_profile


@pytest.fixture(scope="module")
def vgg11() -> tuple[dict, list[models.Unit]]:
    profile = analytic_profile("vgg11", 1000, 32, [4, 8, 4096], 5e12, None, 5e11)
    return profile, models.model_units("vgg11", 1000, 0.5, "meta")  # sizes only: nothing initialised


@pytest.mark.slow  # simulates every strategy over N up to 1024 with exact VGG-11 bytes (4-8 s)
def test_simulation_covers_every_strategy_n_and_link_with_exact_bytes(vgg11) -> None:
    profile, units = vgg11
    dtf = whole_variables(units, StrategyConfig(name="dtf"))
    frame = simulate(profile, units, 4, Grid(gpus=[2, 16, 1024], link_gbit=[1, 100]), variables=dtf)
    assert len(frame) == len(STRATEGIES) * 3 * 2
    assert set(frame.strategy) == set(STRATEGIES) and set(frame.gpus) == {2, 16, 1024}
    for row in frame[frame.gpus == 1024].itertuples():
        split = None if row.split != row.split or row.strategy in ("ps", "allreduce") else int(row.split)
        expected = step_bytes(row.strategy, units, split, topology(row.strategy, 1024), 4, 32)
        assert row.gb_per_step == expected["total"] / 1e9
    ralp = frame[frame.strategy == "ralp_n"].set_index(["gpus", "link_gbit"]).speedup_over_ps
    assert (ralp.xs(1, level="link_gbit") > ralp.xs(100, level="link_gbit")).all()  # RALP matters most on slow links
    byteps_rows = frame[frame.strategy == "byteps"]
    assert (byteps_rows.num_ps == byteps_rows.gpus).all() and (byteps_rows.ps_placement == "colocated").all()
    byteps = byteps_rows.set_index(["gpus", "link_gbit"]).images_per_sec
    # one PS per worker host: each link carries 2(N-1)/N models a step whatever N, so it scales
    assert byteps[(1024, 1)] > 0.5 * 64 * byteps[(16, 1)]
    ps_rows = frame[frame.strategy == "ps"]  # the config's one dedicated PS
    assert (ps_rows.num_ps == 1).all() and (ps_rows.ps_placement == "dedicated").all()
    single_ps = ps_rows[ps_rows.link_gbit == 1].set_index("gpus").images_per_sec
    assert single_ps[1024] < 2 * single_ps[16]  # one PS link caps the baseline however many GPUs join
    for row in frame.itertuples():  # every row's speedup over every baseline priced beside it
        rates = frame[(frame.gpus == row.gpus) & (frame.link_gbit == row.link_gbit)].set_index("strategy")
        for baseline in ("ps", "byteps", "dtf", "allreduce"):
            assert getattr(row, f"speedup_over_{baseline}") == pytest.approx(
                row.images_per_sec / rates.images_per_sec[baseline]
            )
    every = simulate(profile, units, 4, Grid(gpus=[16], link_gbit=[1]), Servers(per_host=True), variables=dtf)
    assert every.set_index("strategy").images_per_sec["ps"] == every.set_index("strategy").images_per_sec["byteps"]


@pytest.mark.slow  # the simulate CLI renders PNG curves (5-7 s)
def test_simulate_cli_writes_parquet_and_png_curves(tmp_path, vgg11, capsys) -> None:
    profile, _ = vgg11
    (tmp_path / "p.json").write_text(json.dumps(profile))
    out = tmp_path / "sim"
    argv = [
        "simulate",
        "--profile",
        str(tmp_path / "p.json"),
        "--out",
        str(out),
        "model=vgg11",
        "train.image_size=32",
        "train.batch_size=4",
        "--gpus",
        "2",
        "8",
        "--link-gbit",
        "1",
        "10",
    ]
    assert cli.main(argv) == 0
    frame = pd.read_parquet(out / "simulation.parquet")
    assert len(frame) == len(STRATEGIES) * 2 * 2
    for name in ("images_per_sec.png", "speedup_over_ps.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.width > 400
    printed = capsys.readouterr().out.splitlines()
    # per link speed and end of the N range: every strategy's images/sec, then the best; each line once
    every = [line for line in printed if "Gbit/s N=" in line]
    assert len(every) == len(set(every)) == 2 * 2 and all(f" {s} " in every[0] for s in STRATEGIES)
    assert sum(line.lstrip().startswith("best ") for line in printed) == 2 * 2
    assert sorted(p.name for p in out.iterdir()) == ["images_per_sec.png", "simulation.parquet", "speedup_over_ps.png"]


def test_prediction_error_joins_runs_with_their_prediction() -> None:
    measured = pd.DataFrame(
        [
            {
                "model": "vgg11",
                "dataset": "d",
                "strategy": "ps",
                "gpus": 2,
                "network": "loopback",
                "images_per_sec": 10.0,
            },
            {
                "model": "vgg11",
                "dataset": "d",
                "strategy": "ralp_n",
                "gpus": 2,
                "network": "loopback",
                "images_per_sec": 20.0,
            },
            {
                "model": "vgg11",
                "dataset": "d",
                "strategy": "ralp_n",
                "gpus": 4,
                "network": "loopback",
                "images_per_sec": 40.0,
            },
        ]
    )
    predicted = pd.DataFrame(
        [
            {"model": "vgg11", "dataset": "d", "strategy": s, "gpus": n, "network": "loopback", "images_per_sec": v}
            for s, n, v in [("ps", 2, 12.0), ("ralp_n", 2, 15.0), ("ralp_n", 4, 42.0), ("ps", 4, 1.0)]
        ]
    )
    joined, median = prediction_error(measured, predicted)
    assert list(joined.relative_error.round(6)) == [0.2, -0.25, 0.05]
    assert median == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no prediction for measured runs"):
        prediction_error(measured, predicted[predicted.gpus == 2])


def test_plan_predictions_lists_every_strategy_and_gpu_count(tmp_path) -> None:
    plan = {
        "model": "m",
        "dataset": "d",
        "network": "loopback",
        "by_gpus": {
            "2": {
                s: {
                    "split": 3 if s.startswith("ralp") else None,
                    "predicted_images_per_sec": 1.0,
                    "predicted_gb_per_step": {"total": 0.5},
                }
                for s in STRATEGIES
            }
        },
    }
    frame = plan_predictions(plan)
    assert sorted(frame.strategy) == sorted(STRATEGIES) and set(frame.gpus) == {2}


def test_a_link_probe_latency_is_paid_per_ring_message(vgg11) -> None:
    """allreduce at N: 2(N-1) latency-bound ring steps per DDP bucket, so 0.01 s a message adds 2 x 15 x 0.01 s
    at N=16 for each bucket.

    DDP all-reduces its buckets (1 MiB, then 25 MiB) one ring each, so every bucket pays the ring's latency-bound
    steps (once for all gradients before DDP's buckets were priced); on this GPU-class profile backward is too
    short to hide any of them."""
    profile, units = vgg11
    rows = [
        simulate(profile, units, 4, Grid(gpus=[16], link_gbit=[10], latency_s=latency)).set_index("strategy")
        for latency in (None, 0.01)
    ]
    param_bytes = compute_costs(profile).param_bytes
    buckets = 1 + math.ceil((param_bytes - DDP_FIRST_BUCKET_BYTES) / DDP_BUCKET_BYTES)
    assert rows[1].step_time_s["allreduce"] - rows[0].step_time_s["allreduce"] == pytest.approx(buckets * 0.3)


@pytest.mark.slow
def test_simulate_by_hand_prices_the_papers_recipe_and_says_so(tmp_path, capsys) -> None:
    """Batch 32 at 224 px unless told otherwise, stated in the summary and in every row of the table."""
    out = tmp_path / "sim"
    argv = ["simulate", "--target", "v100", "--gpus", "8", "--link-gbit", "10", "--out", str(out), "model=vgg11"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "batch 32 per GPU at 224 px" in printed and "device v100 (modelled profile" in printed
    frame = pd.read_parquet(out / "simulation.parquet")
    assert (frame.batch_size == 32).all() and (frame.image_size == 224).all()
    assert {"device", "device_source", "gpus_per_node", "hosts", "interconnect", "pipelined"} <= set(frame.columns)


@pytest.mark.slow
def test_simulate_answers_a_million_gpus_quickly_and_refuses_beyond_its_range(tmp_path, capsys) -> None:
    started = time.process_time()
    argv = ["simulate", "--target", "v100", "--gpus", "1000000", "--link-gbit", "10", "--out", str(tmp_path / "a")]
    assert cli.main([*argv, "model=resnet50"]) == 0
    assert time.process_time() - started < 30
    assert "dtf left out at N=1000000" in capsys.readouterr().out
    too_many = ["simulate", "--target", "v100", "--gpus", str(MAX_GPUS + 1), "--out", str(tmp_path / "b")]
    assert cli.main(too_many) == ConfigError.exit_code
    assert capsys.readouterr().err.strip().endswith(f"beyond the {MAX_GPUS} GPUs simulate prices: give fewer")
    assert not (tmp_path / "b" / "simulation.parquet").exists()


@pytest.mark.slow
def test_cfg_prints_the_composed_configuration_and_runs_nothing(tmp_path, capsys) -> None:
    assert (
        cli.main(
            ["simulate", "--cfg", "--target", "a100", "model=vgg16", "cluster.gpus_per_node=4", "interconnect=nvlink3"]
        )
        == 0
    )
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["batch_size"] == 32 and printed["train"]["image_size"] == 224
    assert printed["device"]["name"] == "a100" and printed["cluster"]["gpus_per_node"] == 4
    assert cli.main(["plan", "--cfg", "model=alexnet"]) == 0  # any stage: its --profile and --out then optional
    assert yaml.safe_load(capsys.readouterr().out)["model"]["name"] == "alexnet"
