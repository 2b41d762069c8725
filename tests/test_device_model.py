"""The GPU device model: FLOP and byte counts, pricing, modelled profiles, memory refusal and calibration."""

from __future__ import annotations

import dataclasses
import subprocess
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from torch import nn

from ralp_pipe.config import CONFIG_DIR, ConfigError, DeviceConfig, load
from ralp_pipe.config.compose import with_arch
from ralp_pipe.contract.records import Profile
from ralp_pipe.engine import devicemodel
from ralp_pipe.engine.models import Unit
from ralp_pipe.planning import calibration
from ralp_pipe.planning.planner import build_plan
from ralp_pipe.planning.profiling import profile_batches

SMALL = ["model=resnet18", "train.image_size=32", "train.batch_size=2"]


def meta_unit(*layers: nn.Module) -> Unit:
    """A unit of `layers`, moved to the meta device (shapes only)."""
    return Unit("u", nn.Sequential(*layers).to("meta"))


def test_conv_flops_match_the_hand_count() -> None:
    b, cin, cout, hw = 2, 3, 8, 16
    unit = meta_unit(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU())
    direct = 2 * b * cout * hw * hw * cin * 9  # a multiply and an add per weight per output element
    first = devicemodel.trace_unit(unit, (b, cin, hw, hw), input_grad=False)
    inner = devicemodel.trace_unit(unit, (b, cin, hw, hw), input_grad=True)
    assert first.fwd.total_flops == direct
    assert first.bwd.total_flops == direct  # the weight gradient only: the first unit's input needs none
    assert inner.bwd.total_flops == 2 * direct  # and the input gradient
    assert devicemodel.KINDS[int(first.fwd.kind[first.fwd.flops > 0][0])] == "conv3x3"


def test_linear_flops_match_the_hand_count() -> None:
    b, n_in, n_out = 4, 64, 10
    trace = devicemodel.trace_unit(meta_unit(nn.Linear(n_in, n_out)), (b, n_in), input_grad=True)
    assert trace.fwd.total_flops == 2 * b * n_in * n_out
    assert trace.bwd.total_flops == 2 * 2 * b * n_in * n_out
    # forward reads input, weight and bias and writes the output
    assert trace.fwd.total_bytes == 4 * (b * n_in + n_in * n_out + n_out + b * n_out)


def test_doubling_bandwidth_halves_a_memory_bound_unit() -> None:
    trace = devicemodel.trace_unit(meta_unit(nn.ReLU(), nn.MaxPool2d(2)), (32, 64, 56, 56), input_grad=True)
    assert trace.fwd.total_flops == 0
    device = dataclasses.replace(load().device, launch_overhead_us=0.0)
    faster = dataclasses.replace(device, memory_gbps=2 * device.memory_gbps)
    for kernels in (trace.fwd, trace.bwd):
        assert kernels.seconds(faster) == pytest.approx(kernels.seconds(device) / 2)
    more_flops = dataclasses.replace(device, peak_fp32_tflops=10 * device.peak_fp32_tflops)
    assert trace.fwd.seconds(more_flops) == trace.fwd.seconds(device)


def test_a_compute_bound_unit_follows_the_peak_and_the_overhead_adds_per_kernel() -> None:
    trace = devicemodel.trace_unit(meta_unit(nn.Conv2d(256, 256, 3, padding=1)), (64, 256, 28, 28), True)
    device = dataclasses.replace(load().device, launch_overhead_us=0.0)
    double = dataclasses.replace(device, peak_fp32_tflops=2 * device.peak_fp32_tflops)
    assert trace.bwd.seconds(double) == pytest.approx(trace.bwd.seconds(device) / 2)
    slow_launch = dataclasses.replace(device, launch_overhead_us=7.0)
    assert trace.bwd.seconds(slow_launch) - trace.bwd.seconds(device) == pytest.approx(len(trace.bwd) * 7e-6)


@pytest.mark.slow
def test_device_overrides_change_the_modelled_profile() -> None:
    batches = profile_batches(2, [2])
    base = devicemodel.modelled_profile(load([*SMALL, "device=v100"]), batches, 2)
    faster = devicemodel.modelled_profile(load([*SMALL, "device=v100", "device.memory_gbps=1800"]), batches, 2)
    assert faster["target"]["memory_gbps"] == 1800
    assert sum(u["by_batch"]["2"]["fwd_s"] for u in faster["units"]) < sum(
        u["by_batch"]["2"]["fwd_s"] for u in base["units"]
    )


@pytest.mark.slow
def test_modelled_profile_passes_the_profile_schema_and_plan_takes_it(tmp_path) -> None:
    cfg = load([*SMALL, "cluster=emulated", "network=1gbit", "cluster.gpus=4"])
    doc = devicemodel.modelled_profile(cfg, profile_batches(2, [4]), 4)
    path = tmp_path / "modelled.json"
    Profile.from_dict(doc, path).write(path)
    profile = Profile.read(path)
    assert (profile.kind, profile.device, profile.target["name"]) == ("modelled", "cuda", "v100")
    assert profile.model_version == devicemodel.MODEL_VERSION
    assert set(profile.batches) == {"worker", "ps_ralp_h_n4", "ps_ralp_n_n4"}
    for unit in profile.units:
        assert {"fwd_s", "bwd_s", "peak_memory_bytes"} <= set(unit["by_batch"]["2"])
    plan = build_plan(profile, path, cfg, [4])
    assert plan.strategies["ralp_n"]["split"] >= 1
    assert plan.shared_cpu is None  # every rank has a GPU of its own
    assert (plan.profile_kind, plan.profile_device) == ("modelled", "v100")


@pytest.mark.slow
def test_a_batch_that_does_not_fit_is_refused_in_one_line(tmp_path) -> None:
    out = tmp_path / "p.json"
    run = subprocess.run(
        ["ralp-pipe", "profile", "--target", "p100", "--out", str(out), "model=vgg16", "train.batch_size=512"]
        + ["train.image_size=224"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "vgg16" in lines[0] and "batch_size=512" in lines[0] and "p100" in lines[0]
    assert "GB short" in lines[0] and not out.exists()


@pytest.mark.slow
def test_target_names_and_values_are_checked() -> None:
    with pytest.raises(ConfigError, match="no device entry"):
        devicemodel.target_overrides("tpu9", [])
    with pytest.raises(ConfigError, match="two devices"):
        devicemodel.target_overrides("v100", ["device=a100"])
    assert devicemodel.target_overrides("v100", ["device.memory_gb=32"]) == ["device=v100", "device.memory_gb=32"]
    assert load(devicemodel.target_overrides("v100", ["device=v100"])).device.name == "v100"  # given once
    h200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=150_000_000_000)
    auto = devicemodel.target_overrides("auto", ["device.memory_gb=100"], lambda: h200)
    assert load(auto).device.memory_gb == 100  # the user's value, not the probed one
    with pytest.raises(ConfigError, match="experiment.target"):
        load(["experiment.target=v101"])
    with pytest.raises(ConfigError, match="device.memory_efficiency"):
        load(["device.memory_efficiency=1.5"])


def test_the_local_gpu_maps_to_its_entry_or_the_nearest_one() -> None:
    h200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=150_000_000_000)
    assert devicemodel.local_gpu_overrides(lambda: h200)[0] == "device=h200"
    k80 = SimpleNamespace(name="Tesla K80", major=3, minor=7, total_memory=12_000_000_000)
    assert devicemodel.local_gpu_overrides(lambda: k80)[0] == "device=k80"
    l4 = SimpleNamespace(name="NVIDIA L4", major=8, minor=9, total_memory=24_000_000_000)
    overrides = devicemodel.local_gpu_overrides(lambda: l4)
    assert overrides == ["device=a100", "device.name=l4", "device.memory_gb=24.00"]
    assert load(overrides).device.memory_gb == 24.0


def test_schema_defaults_are_the_default_entry() -> None:
    shipped = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "device" / "v100.yaml"))
    assert dataclasses.asdict(DeviceConfig()) == shipped


@pytest.mark.slow
def test_a_held_out_prediction_does_not_see_its_own_figure() -> None:
    entries = {name: load([f"device={name}"]).device for name in ("p100", "v100")}
    figures = [f for f in calibration.PUBLISHED if f.device == "p100" and f.model in ("alexnet", "vgg16")]
    before = calibration.leave_one_out(entries, figures)
    doubled = [dataclasses.replace(figures[0], images_per_sec=2 * figures[0].images_per_sec), *figures[1:]]
    after = calibration.leave_one_out(entries, doubled)
    assert after[0].predicted == pytest.approx(before[0].predicted)  # left out of its own fit
    assert after[1].predicted != pytest.approx(before[1].predicted)  # in the others' fits
    assert after[0].error == pytest.approx((before[0].error + 1) / 2 - 1)


@pytest.mark.slow
def test_a_gpu_defined_by_overrides_takes_its_architectures_fields() -> None:
    k40 = load(["device.name=k40", "device.arch=kepler", "device.peak_fp32_tflops=4.29", "device.memory_gbps=288"])
    k80 = load(["device=k80"]).device
    assert k40.device.arch == "kepler" and k40.device.memory_gbps == 288
    assert calibration.fields_of(k40.device) == calibration.fields_of(k80)
    assert calibration.fields_of(k80) != calibration.fields_of(load(["device=p100"]).device)
    own = load(["device=k80", "device.memory_efficiency=0.5"]).device  # a field set by the user stays
    assert own.memory_efficiency == 0.5 and own.conv_efficiency == k80.conv_efficiency
    with pytest.raises(ConfigError, match="device.arch='maxwell' is not allowed; choose one of: kepler"):
        load(["device.arch=maxwell"])
    unresolved = DeviceConfig()  # not composed: its fields are null until its arch supplies them
    with pytest.raises(ConfigError, match="compose it"):
        devicemodel.compute_rates(unresolved)
    assert devicemodel.compute_rates(with_arch(unresolved)) == devicemodel.compute_rates(load().device)


@pytest.mark.slow
def test_shipped_architectures_are_what_the_calibration_fits() -> None:
    entries = {name: load([f"device={name}"]).device for name in devicemodel.device_entries()}
    fitted = calibration.calibrate(entries)
    for figure in calibration.PUBLISHED:
        device = entries[figure.device]
        shipped = calibration.predict(figure, device)
        in_fit = calibration.predict(figure, calibration.with_fields(device, fitted[device.arch]))
        assert shipped == pytest.approx(in_fit, rel=5e-3), figure.label
    checks = calibration.leave_one_out(entries)
    assert len(checks) == len(calibration.PUBLISHED)
    groups = calibration.by_arch(checks)
    assert set(groups) == {"pascal", "kepler", "volta", "ampere"}
    assert calibration.median_abs_error(checks) <= 0.20  # 16.8% when written
    assert calibration.median_abs_error(groups["kepler"]) <= 0.25  # 20.3% when written


@pytest.mark.slow
def test_inception_v3_at_299_px_is_priced_with_its_published_multiply_adds() -> None:
    units, traces = devicemodel.trace_model("inception_v3", 1000, 299, 2)
    assert [u.name for u in units][-2:] == ["flatten", "fc"]
    multiply_adds = sum(t.fwd.total_flops for t in traces) / 2 / 2
    assert multiply_adds == pytest.approx(5.71e9, rel=0.01)  # torchvision's 5.71 GFLOPS (multiply-adds) at 299 px
    first, *rest = traces  # the input needs no gradient: the first unit's backward computes the weights' only
    assert first.bwd.total_flops == pytest.approx(first.fwd.total_flops)
    assert all(t.bwd.total_flops == pytest.approx(2 * t.fwd.total_flops) for t in rest if t.fwd.total_flops)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "image_size"), [("vgg11", 64), ("resnet18", 64), ("inception_v3", 75)])
def test_traces_at_any_batch_are_the_direct_traces(model: str, image_size: int) -> None:
    """Two traces (batch 1 and 2) give every batch's kernels and memory exactly, as tracing that batch does."""
    units, traced = devicemodel.trace_batches(model, 10, image_size, [3, 32])
    assert len(units) == len(traced[32])
    for batch in (3, 32):
        _, direct = devicemodel.trace_model(model, 10, image_size, batch)
        for derived, exact in zip(traced[batch], direct):
            for name in ("fwd", "bwd"):
                ours, theirs = getattr(derived, name), getattr(exact, name)
                assert (ours.kind == theirs.kind).all()
                assert (ours.flops == theirs.flops).all() and (ours.bytes == theirs.bytes).all()
            assert derived.output_shape == exact.output_shape
            assert (derived.saved_bytes, derived.peak_memory_bytes) == (exact.saved_bytes, exact.peak_memory_bytes)
