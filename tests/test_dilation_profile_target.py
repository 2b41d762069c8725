"""A profile file as the dilation target: its times (interpolated to the run's batches) padded to, checked against
the run before anything runs, and named in the run's record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import Ran
from ralp_pipe.config import ConfigError, load
from ralp_pipe.contract.records import at_batch
from ralp_pipe.contract.topology import of_strategy
from ralp_pipe.engine import dilation, models
from ralp_pipe.engine.dilation import PS_DEVICE_BATCH, WORKER
from support.profiles import analytic_profile
from support.small_run import small
from support.train import train_metrics

CLASSES, IMAGE = 10, 32
BASE = ["model=resnet18", f"dataset.num_classes={CLASSES}", f"train.image_size={IMAGE}", "train.batch_size=2"]
LARGER = 1.5  # the profile's times at its larger batch: this much more than proportional, so that interpolating differs


def _profile(batches: tuple[int, ...] = (2, 8), model: str = "resnet18", **changes: Any) -> dict[str, Any]:
    """A resnet18 profile document timed at `batches`, its largest batch's times not proportional to the smaller's."""
    doc = analytic_profile(model, CLASSES, IMAGE, batches, 1e10, None, 1e10)
    for row in doc["units"]:
        times = row["by_batch"][str(batches[-1])]
        row["by_batch"][str(batches[-1])] = {key: LARGER * value for key, value in times.items()}
    return {**doc, **changes}


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _load(target: Path, *overrides: str) -> Any:
    return load([*BASE, f"dilation.target={target}", *overrides])


@pytest.mark.slow
def test_targets_are_the_profiled_times_times_the_factor_and_interpolated_between_batches(tmp_path: Path) -> None:
    doc = _profile()
    target = _write(tmp_path / "measured.json", doc)
    cfg = _load(target, "strategy=ralp_n", "cluster.gpus=3", "dilation.factor=4")  # 2 workers: the PS device at 4
    targets = dilation.targets(cfg, of_strategy(cfg.strategy, cfg.cluster.gpus))
    assert targets is not None and targets.factor == 4.0
    small_batch = [row["by_batch"]["2"] for row in doc["units"]]
    large_batch = [row["by_batch"]["8"] for row in doc["units"]]
    assert targets.fwd_s[WORKER] == pytest.approx([4 * t["fwd_s"] for t in small_batch])
    assert targets.bwd_s[WORKER] == pytest.approx([4 * t["bwd_s"] for t in small_batch])
    # batch 4 lies a third of the way from 2 to 8
    between = [4 * (s["bwd_s"] + (b["bwd_s"] - s["bwd_s"]) / 3) for s, b in zip(small_batch, large_batch)]
    assert targets.bwd_s[PS_DEVICE_BATCH] == pytest.approx(between)
    assert targets.bwd_s[PS_DEVICE_BATCH] != pytest.approx([2 * s for s in targets.bwd_s[WORKER]])  # not proportional
    assert targets.update_s_per_byte == pytest.approx(4 * doc["update"]["update_s_per_byte"])
    assert targets.aggregate_s_per_byte == pytest.approx(4 * doc["update"]["aggregate_s_per_byte"])
    assert targets.update_s_fixed == 0.0 and targets.aggregate_s_fixed == 0.0
    assert targets.device == "analytic (profile measured.json)"
    assert len(targets.fwd_s[WORKER]) == len(models.model_units("resnet18", CLASSES, 0.5, "meta"))


@pytest.mark.slow
def test_beyond_the_profiled_batches_the_times_scale_with_the_batch(tmp_path: Path) -> None:
    doc = _profile(batches=(4, 8))
    cfg = _load(_write(tmp_path / "p.json", doc), "strategy=ralp_n", "cluster.gpus=9", "dilation.factor=1")
    targets = dilation.targets(cfg, of_strategy(cfg.strategy, cfg.cluster.gpus))
    assert targets is not None
    assert targets.fwd_s[WORKER] == pytest.approx([row["by_batch"]["4"]["fwd_s"] / 2 for row in doc["units"]])
    assert targets.fwd_s[PS_DEVICE_BATCH] == pytest.approx([row["by_batch"]["8"]["fwd_s"] * 2 for row in doc["units"]])


def test_the_interpolation_is_linear_between_batches_and_proportional_beyond() -> None:
    batches, values = (2, 8, 32), (1.0, 7.0, 10.0)
    assert [at_batch(batches, values, b) for b in (1, 2, 5, 8, 20, 32, 64)] == pytest.approx(
        [0.5, 1.0, 4.0, 7.0, 8.5, 10.0, 20.0]
    )


@pytest.mark.slow
def test_the_label_is_the_gpu_the_profile_ran_on(tmp_path: Path) -> None:
    hardware = {"gpus": [{"name": "NVIDIA H200", "memory_gb": 150.0}], "cpu_model": "x"}
    target = _write(tmp_path / "profile-cuda.json", _profile(device="cuda", hardware=hardware))
    assert dilation.target_label(_load(target, "dilation.factor=2")) == "NVIDIA H200 (profile profile-cuda.json)"
    on_cpu = _write(tmp_path / "profile-cpu.json", _profile(device="cpu", hardware={**hardware, "gpus": []}))
    assert dilation.target_label(_load(on_cpu, "dilation.factor=2")) == "cpu (profile profile-cpu.json)"
    assert dilation.target_label(load([*BASE, "dilation.factor=2"])) == "v100"


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes,expected",
    [
        ({"model": "vgg11"}, "has model='vgg11' but the configuration asks for 'resnet18'"),
        ({"num_classes": 1000}, "has num_classes=1000 but the configuration asks for 10"),
        ({"image_size": 64}, "has image_size=64 but the configuration asks for 32"),
        ({"units": "drop the last"}, "units but model resnet18 has "),
        ({"update": {"param_bytes": 1}}, "update lacks a number 'update_s_per_byte'"),
        ({"schema_version": 99}, "this ralp-pipe reads up to 1"),
    ],
)
def test_a_profile_not_made_for_the_run_is_refused_naming_the_key_and_the_file(
    tmp_path: Path, changes: dict[str, Any], expected: str
) -> None:
    doc = _profile()
    if changes.get("units"):
        changes = {"units": doc["units"][:-1]}
    target = _write(tmp_path / "other.json", {**doc, **changes})
    cfg = _load(target, "dilation.factor=2")
    with pytest.raises(ConfigError, match=f"^dilation.target={target}: .*") as refused:
        dilation.targets(cfg, of_strategy(cfg.strategy, cfg.cluster.gpus))
    assert expected in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow
def test_not_a_profile_is_refused_before_the_factor_is_chosen(tmp_path: Path) -> None:
    target = tmp_path / "garbage.json"
    target.write_text("{not json")
    for factor in ("2", "auto"):
        cfg = _load(target, f"dilation.factor={factor}")
        with pytest.raises(ConfigError, match=f"dilation.target={target}: cannot read profile {target}"):
            dilation.targets(cfg, of_strategy(cfg.strategy, cfg.cluster.gpus))
    _write(target, {"model": "resnet18"})
    with pytest.raises(ConfigError, match="lacks key 'num_classes'"):
        dilation.targets(_load(target, "dilation.factor=2"), of_strategy(cfg.strategy, cfg.cluster.gpus))
    assert dilation.targets(_load(target), of_strategy(cfg.strategy, cfg.cluster.gpus)) is None  # undilated


@pytest.mark.slow
def test_a_missing_profile_file_and_a_profile_for_the_workflow_are_refused_at_composition(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ConfigError, match=rf"dilation.target='{missing}' names no readable profile file.*v100"):
        _load(missing)
    with pytest.raises(ConfigError, match=r"dilation.target='.*' names no readable profile file"):
        _load(_folder_ending_in_json(tmp_path))
    target = _write(tmp_path / "p.json", _profile())
    with pytest.raises(ConfigError, match=rf"experiment.target=v100 plans .* dilation.target={target} .*=null"):
        _load(target, "dilation.factor=2", "experiment.target=v100")
    with pytest.raises(ConfigError, match=rf"experiment.target={target} is a profile file.*ralp-pipe train"):
        _load(target, "dilation.factor=2", f"experiment.target={target}")
    assert _load(target, "dilation.factor=2").dilation.target_profile == target


def _folder_ending_in_json(tmp_path: Path) -> Path:
    folder = tmp_path / "folder.json"
    folder.mkdir()
    return folder


@pytest.mark.slow
def test_train_refuses_a_profile_of_another_model_in_one_line_with_exit_2(
    tmp_path: Path, ralp_pipe: Callable[..., Ran]
) -> None:
    target = _write(tmp_path / "vgg.json", _profile(model="vgg11"))
    out = tmp_path / "run"
    proc = ralp_pipe("train", "--out", str(out), *small(*BASE, "dilation.factor=2", f"dilation.target={target}"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"dilation.target={target}: profile {target} has model='vgg11'" in lines[0], lines
    assert not out.exists()


@pytest.mark.slow  # train subprocesses
def test_a_modelled_run_of_a_profile_file_names_it_and_waits_its_times(tmp_path: Path) -> None:
    doc = _profile()
    target = _write(tmp_path / "profile-cpu.json", {**doc, "device": "cpu"})
    factor = 4.0
    overrides = small(
        *BASE, "train.measure_steps=2", "dilation.mode=modelled", f"dilation.factor={factor}",
        f"dilation.target={target}",
    )  # fmt: skip
    metrics = train_metrics(tmp_path / "run", overrides)
    record = metrics["dilation"]
    assert record["target_device"] == "cpu (profile profile-cpu.json)" and record["factor"] == factor
    worker = sum(factor * (row["by_batch"]["2"]["fwd_s"] + row["by_batch"]["2"]["bwd_s"]) for row in doc["units"])
    assert metrics["step_time_s"] >= worker
    assert metrics["target_images_per_sec"] == pytest.approx(metrics["images_per_sec"] * factor)
    assert metrics["gb_per_step"] == pytest.approx(metrics["analytic_gb_per_step"], rel=1e-9)
