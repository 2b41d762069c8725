"""`ralp-pipe train` end to end: files, keys, measured = analytic bytes; split resolution on meta units."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from ralp_pipe.config import ConfigError, load
from ralp_pipe.contract.records import Plan
from ralp_pipe.contract.topology import topology
from ralp_pipe.engine import models
from ralp_pipe.engine.train import resolve_split, split_and_bytes, steps_table, with_plan
from ralp_pipe.engine.volume import step_bytes
from ralp_pipe.errors import DataError
from ralp_pipe.runtime import hardware
from support.train import run_train, train_command, train_metrics

pytestmark = pytest.mark.slow  # train subprocesses and model builds of several seconds each

KEYS = {
    "model",
    "dataset",
    "num_classes",
    "strategy",
    "gpus",
    "workers",
    "num_ps",
    "split",
    "network",
    "rate",
    "batch_size",
    "global_batch",
    "image_size",
    "warmup_steps",
    "measure_steps",
    "images_per_sec",
    "images_per_step",
    "step_time_s",
    "gb_per_step",
    "analytic_gb_per_step",
    "wire_gb_per_step",
    "hardware",
    "versions",
    "git_revision",
    "config_hash",
    "config",
}
CATEGORIES = {"total", "gradients", "parameters", "activations", "activation_gradients"}


def test_train_writes_metrics_and_steps_with_measured_equal_to_analytic_volume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    overrides = [
        "cluster=local",
        "model=resnet18",
        "strategy=ralp_h",
        "cluster.gpus=4",
        "train.batch_size=2",
        "train.image_size=32",
        "train.warmup_steps=1",
        "train.measure_steps=2",
        "dataset.num_classes=10",
        "train.loader=synthetic",
    ]
    proc = run_train(out, overrides)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert KEYS <= metrics.keys()
    assert CATEGORIES <= metrics["gb_per_step"].keys() and CATEGORIES <= metrics["analytic_gb_per_step"].keys()
    assert (metrics["workers"], metrics["global_batch"], metrics["images_per_step"]) == (2, 4, 4)
    assert metrics["split"] == models.default_split(models.placement_units(models.build("resnet18", 10)))
    assert metrics["gb_per_step"] == pytest.approx(metrics["analytic_gb_per_step"], rel=1e-12)
    assert metrics["gb_per_step"]["activations"] > 0 and metrics["wire_gb_per_step"] is None
    assert (metrics["rate"], metrics["link_gbit"], metrics["link_source"]) == ("unlimited", None, None)  # no probe
    assert metrics["images_per_sec"] == pytest.approx(4 * 2 / (metrics["step_time_s"] * 2))
    assert metrics["config"]["strategy"]["name"] == "ralp_h" and len(metrics["config_hash"]) == 12
    # every rank's own high-water mark: at least the interpreter with torch and the model it built
    assert len(metrics["peak_rss_mb"]) == 3 and all(100 < mb < 4096 for mb in metrics["peak_rss_mb"])
    # when each phase ended, the driver's and rank 0's, in the order they happen (no emulated hosts: no hosts_up)
    phases = ["started", "imported", "configured", "rank_started", "joined", "set_up", "window_start", "window_end"]
    phases += ["gathered", "ranks_done", "recorded"]
    timeline = metrics["timeline"]
    assert sorted(timeline, key=timeline.__getitem__) == phases
    assert timeline["window_end"] - timeline["window_start"] == pytest.approx(metrics["window_s"], abs=0.05)
    steps = pd.read_parquet(out / "steps.parquet")
    assert len(steps) == 3 * 3  # 3 ranks x (1 warm-up + 2 measured) steps
    assert set(steps["role"]) == {"worker", "ps_device"} and set(steps["phase"]) == {"warmup", "measure"}
    # a step's parts: compute, transfer wait and loader wait add up to it; the PS device reads no batches
    parts = steps["compute_s"] + steps["comm_wait_s"] + steps["data_wait_s"]
    assert (parts - steps["step_time_s"]).abs().max() < 1e-9
    workers = steps["role"] == "worker"
    assert (steps.loc[workers, "data_wait_s"] > 0).all() and (steps.loc[~workers, "data_wait_s"] == 0).all()
    assert f"rank 0 logs its progress to {tmp_path}/.run.ranks-" in proc.stdout
    measured = steps[steps["phase"] == "measure"]
    assert measured["bytes_activations"].sum() / 2 / 1e9 == pytest.approx(metrics["gb_per_step"]["activations"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "staging files left next to the run"


def test_split_comes_from_the_option_then_the_plan_then_the_default(tmp_path: Path) -> None:
    units = models.placement_units(models.build("vgg11", 10))
    base = ["model=vgg11", "strategy=ralp_n", "dataset.num_classes=10"]
    assert resolve_split(load(base), units) == models.default_split(units)
    assert resolve_split(load([*base, "strategy.split=3"]), units) == 3
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"strategies": {"ralp_n": {"split": 5}}}))
    assert resolve_split(load([*base, f"strategy.plan={plan}"]), units) == 5
    assert resolve_split(load(["model=vgg11", "strategy=ps", "dataset.num_classes=10"]), units) is None


@pytest.mark.parametrize(
    ("content", "error", "message"),
    [
        (None, DataError, "cannot read plan"),
        ("{}", DataError, "lacks key 'strategies'"),
        ('{"strategies": {"ralp_n": {"predicted_images_per_sec": 1.0}}}', DataError, "strategies.ralp_n.split"),
        ('{"strategies": {"ralp_h": {"split": 5}}}', ConfigError, "strategies \\['ralp_h'\\] at N=4"),
        ('{"schema_version": 2, "strategies": {"ralp_n": {"split": 5}}}', DataError, "schema_version 2"),
        ('{"strategies": {"ralp_n": {"split": 99}}}', ConfigError, "out of range"),
    ],
)
def test_bad_plan_is_a_data_error_and_bad_split_a_config_error_naming_the_file(
    tmp_path: Path, content: str | None, error: type[Exception], message: str
) -> None:
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content)
    units = models.placement_units(models.build("vgg11", 10))
    with pytest.raises(error, match=message) as err:
        resolve_split(load(["model=vgg11", "strategy=ralp_n", f"strategy.plan={plan}"]), units)
    assert str(plan) in str(err.value)


@pytest.mark.parametrize("strategy", ["ps", "allreduce", "ralp_h", "ralp_n"])
def test_driver_resolves_split_and_bytes_on_the_meta_device_as_on_real_parameters(strategy: str) -> None:
    cfg = load(["model=resnet18", f"strategy={strategy}", "dataset.num_classes=10", "cluster.gpus=4"])
    topo = topology(strategy, 4)
    split, analytic = split_and_bytes(cfg, topo)
    units = models.placement_units(models.build("resnet18", 10))
    assert split == resolve_split(cfg, units)
    assert analytic == step_bytes(strategy, units, split, topo, cfg.train.batch_size, cfg.train.image_size)


def test_single_device_run_has_no_communication_and_rank_0_logs_its_progress(tmp_path: Path) -> None:
    """allreduce at N=1 (the scaling plots' reference) moves no bytes and waits on none; progress is in rank 0's log."""
    out = tmp_path / "run"
    overrides = ["cluster=local", "model=resnet18", "strategy=allreduce", "cluster.gpus=1", "train.batch_size=2"]
    overrides += ["train.image_size=32", "train.warmup_steps=1", "train.measure_steps=3", "dataset.num_classes=10"]
    overrides += ["train.loader=synthetic"]  # no shards needed: the run is about communication and progress
    env = {**os.environ, "RALP_PIPE_FAIL_RANK": "0", "RALP_PIPE_FAIL_STEP": "3"}  # keeps the log: a failed run
    failed = run_train(out, overrides, env=env)
    assert failed.returncode == 4, failed.stderr
    log = failed.stdout.split("rank 0 logs its progress to ", 1)[1].split(" ", 1)[0]
    assert f"Last lines of {log}:" in failed.stderr  # the log the driver named is rank 0's
    assert "step 1/4 (warmup): " in failed.stderr  # the first step always gets a line
    metrics = train_metrics(out, [*overrides, "train.cpu_share=2"])
    assert (metrics["workers"], metrics["world_size"], metrics["gb_per_step"]["total"]) == (1, 1, 0.0)
    # the rank's own torch threads (not the driver's): this host's CPUs split over train.cpu_share ranks
    assert metrics["hardware"]["torch_threads"] == hardware.threads_per_rank(2)
    assert metrics["hardware"]["malloc_keeps_freed"]  # as the profile times compute
    steps = pd.read_parquet(out / "steps.parquet")
    assert (steps["comm_wait_s"] == 0).all()  # no DDP, no reduction: nothing to wait for


VGG_PLAN = {"model": "vgg11", "dataset": "synthetic1k", "num_classes": 10, "image_size": 224, "batch_size": 32}
VGG_RUN = ["model=vgg11", "dataset=synthetic1k", "dataset.num_classes=10", "train.image_size=224"]


def _plan(path: Path, by_gpus: dict[str, dict[str, dict]], **fields: object) -> Path:
    """A plan record at `path` made for VGG_PLAN (with `fields` changed) at the GPU counts of `by_gpus`."""
    first = next(iter(by_gpus))
    Plan(**{**VGG_PLAN, **fields}, gpus=int(first), strategies=by_gpus[first], by_gpus=by_gpus).write(path)
    return path


@pytest.mark.parametrize(
    ("override", "held", "wanted"),
    [
        ("model=alexnet", "model='vgg11'", "model.name='alexnet'"),
        ("dataset=synthetic22k", "dataset='synthetic1k'", "dataset.name='synthetic22k'"),
        ("dataset.num_classes=20", "num_classes=10", "dataset.num_classes=20"),
        ("train.image_size=192", "image_size=224", "train.image_size=192"),
        ("train.batch_size=4", "batch_size=32", "train.batch_size=4"),
        ("cluster.gpus=8", "by_gpus for N=2, 4", "cluster.gpus=8"),
        ("strategy=ralp_h", "strategies ['ralp_n'] at N=4", "strategy.name='ralp_h'"),
    ],
)
def test_a_plan_made_for_another_run_is_refused_naming_the_file_the_key_and_both_values(
    tmp_path: Path, override: str, held: str, wanted: str
) -> None:
    plan = _plan(tmp_path / "plan.json", {"2": {"ralp_n": {"split": 3}}, "4": {"ralp_n": {"split": 5}}})
    cfg = load(["strategy=ralp_n", "cluster.gpus=4", *VGG_RUN, "train.batch_size=32", override])
    units = models.placement_units(models.build(cfg.model.name, cfg.dataset.num_classes))
    with pytest.raises(ConfigError) as err:
        resolve_split(with_plan(cfg, plan), units)
    assert f"plan {plan} has {held} but this run has {wanted}: " in str(err.value)


def test_a_plan_for_several_n_serves_each_of_them_and_is_checked_for_every_strategy(tmp_path: Path) -> None:
    plan = _plan(tmp_path / "plan.json", {"2": {"ralp_n": {"split": 3}, "ps": {}}, "4": {"ralp_n": {"split": 5}}})
    units = models.placement_units(models.build("vgg11", 10))
    base = ["strategy=ralp_n", *VGG_RUN, "train.batch_size=32", f"strategy.plan={plan}"]
    assert [resolve_split(load([*base, f"cluster.gpus={n}"]), units) for n in (2, 4)] == [3, 5]
    assert resolve_split(load([*base, "cluster.gpus=2", "strategy=ps"]), units) is None
    with pytest.raises(ConfigError, match=r"has strategies \['ralp_n'\] at N=4 but this run has strategy.name='ps'"):
        resolve_split(load([*base, "cluster.gpus=4", "strategy=ps"]), units)
    Plan(**VGG_PLAN, gpus=4, strategies={"ps": {}}).write(plan)  # one N, no by_gpus: its gpus is checked
    assert resolve_split(load([*base, "cluster.gpus=4", "strategy=ps"]), units) is None
    with pytest.raises(ConfigError, match="has gpus=4 but this run has cluster.gpus=2"):
        resolve_split(load([*base, "cluster.gpus=2", "strategy=ps"]), units)


def test_plan_option_sets_strategy_plan_and_a_second_different_plan_is_refused(tmp_path: Path) -> None:
    cfg = load(["strategy=ralp_n"])
    assert with_plan(cfg, None) is cfg
    assert with_plan(cfg, tmp_path / "a.json").strategy.plan == str(tmp_path / "a.json")
    same = load(["strategy=ralp_n", f"strategy.plan={tmp_path / 'a.json'}"])
    assert with_plan(same, tmp_path / "a.json").strategy.plan == str(tmp_path / "a.json")
    with pytest.raises(ConfigError, match=f"--plan {tmp_path / 'b.json'} and strategy.plan={tmp_path / 'a.json'}"):
        with_plan(same, tmp_path / "b.json")


def test_train_refuses_another_models_plan_in_one_line_before_any_rank_starts(tmp_path: Path) -> None:
    """A plan made for VGG-11 given to an AlexNet run (it ran, exit 0, with VGG-11's split)."""
    plan = _plan(tmp_path / "plan.json", {"4": {"ralp_n": {"split": 5}}})
    run = [o for o in VGG_RUN if not o.startswith(("model=", "train.loader="))]  # each key given once
    overrides = ["cluster=local", "strategy=ralp_n", "cluster.gpus=4", *run, "train.batch_size=32"]
    overrides += ["model=alexnet", "train.loader=synthetic"]
    command = train_command(tmp_path / "run", overrides)
    proc = subprocess.run([*command, "--plan", str(plan)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"ralp-pipe train: configuration error: plan {plan} has model='vgg11' but this run has model.name='alexnet': "
        f"give the run the plan made for it (`ralp-pipe plan` with the run's overrides)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"], "the refused run left files"


@pytest.mark.parametrize(
    "rows",
    [
        [
            {"rank": r, "role": "ps" if r else "worker", "step": s, "step_time_s": 0.1 * s, "late_s": 0.0}
            for r in (0, 1)
            for s in (0, 1)
        ],
        [{"a": 1, "b": None, "c": True, "d": "2026-12-07T00:00:00"}, {"a": 2.5, "b": None, "c": False, "d": 'x\n"é'}],
        [{"a": 1}, {"a": 2, "b": 3}],  # the first row's keys, as from_pylist takes them
        [{"a": 1, "b": 2}, {"a": 3}],  # a missing value is null
        [{"a": float("nan")}, {"a": 1.0}],  # not JSON: from_pylist itself
        [{"a": 2**63}],  # beyond int64: from_pylist's error
        [{"a": [1, 2]}],
        [{"a": True}, {"a": 1}],
        [{"a": 5e-324, "b": 1.7976931348623157e308, "c": 0.1 + 0.2, "d": -(2**63)}],
    ],
)
def test_the_steps_table_is_the_one_pyarrow_makes_of_the_rows(rows: list[dict[str, object]]) -> None:
    import pyarrow as pa

    try:
        expected = pa.Table.from_pylist(rows)
    except Exception as exc:  # noqa: BLE001 (whatever it raises, steps_table raises too)
        with pytest.raises(type(exc)):
            steps_table(rows)
        return
    table = steps_table(rows)
    assert table.schema == expected.schema
    assert repr(table.to_pylist()) == repr(expected.to_pylist())  # by repr: a NaN equals no NaN
