"""The device model's trace cache: a cached trace prices exactly what a fresh one does, without torch, and
anything that decides a trace (model, image size, SGD settings, the tracing code) misses it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ralp_pipe.config import load
from ralp_pipe.engine import devicemodel
from ralp_pipe.planning.profiling import profile_batches

SMALL = ["model=resnet18", "train.image_size=32", "train.batch_size=2", "device=v100"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty trace cache of its own, and no trace of this process's memory."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(devicemodel.CACHE_ENV, str(folder))
    monkeypatch.setattr(devicemodel, "_TRACES", {})
    return folder


def profile_of(overrides: list[str], gpus: tuple[int, ...] = (2, 8)) -> dict:
    cfg = load(overrides)
    doc = devicemodel.modelled_profile(cfg, profile_batches(cfg.train.batch_size, gpus), max(gpus))
    doc.pop("profile_seconds")
    return doc


@pytest.mark.slow
def test_a_cached_trace_prices_exactly_what_a_fresh_one_does(cache, monkeypatch) -> None:
    fresh = profile_of(SMALL)
    assert len(list(cache.glob("*.npz"))) == 1
    monkeypatch.setattr(devicemodel, "_TRACES", {})  # a new process: the disk's copy only
    monkeypatch.setattr(devicemodel, "_trace", lambda *args: pytest.fail("traced again on a hit"))
    assert json.dumps(profile_of(SMALL)) == json.dumps(fresh)


@pytest.mark.slow
def test_device_and_batch_are_priced_afresh_from_one_trace(cache, monkeypatch) -> None:
    base = profile_of(SMALL)
    monkeypatch.setattr(devicemodel, "_trace", lambda *args: pytest.fail("device or batch traced again"))
    slower = profile_of([*SMALL, "device.memory_gbps=100"])
    larger = profile_of([*SMALL[:2], "train.batch_size=4", SMALL[3]])
    unit = lambda doc, batch: doc["units"][0]["by_batch"][str(batch)]  # noqa: E731
    assert unit(slower, 2)["fwd_s"] > unit(base, 2)["fwd_s"]
    assert unit(larger, 4)["fwd_flops"] == 2 * unit(base, 2)["fwd_flops"]
    assert slower["target"]["memory_gbps"] == 100


@pytest.mark.slow
@pytest.mark.parametrize(
    "change", [["model=resnet34"], ["train.image_size=48"], ["train.momentum=0.0"], ["dataset.num_classes=10"]]
)
def test_what_decides_a_trace_misses_the_cache(cache, monkeypatch, change) -> None:
    profile_of(SMALL)
    monkeypatch.setattr(devicemodel, "_TRACES", {})
    traced = []
    real = devicemodel._trace
    monkeypatch.setattr(devicemodel, "_trace", lambda *args: traced.append(args) or real(*args))
    profile_of([*SMALL, *change])
    assert len(traced) == 1
    assert len(list(cache.glob("*.npz"))) == 2


@pytest.mark.slow
def test_a_change_to_the_tracing_code_misses_the_cache(cache, monkeypatch) -> None:
    profile_of(SMALL)
    monkeypatch.setattr(devicemodel, "_TRACES", {})
    version = devicemodel.code_version()
    monkeypatch.setattr(devicemodel, "code_version", lambda: {**version, "code": "edited"})
    traced = []
    real = devicemodel._trace
    monkeypatch.setattr(devicemodel, "_trace", lambda *args: traced.append(args) or real(*args))
    profile_of(SMALL)
    assert traced


def test_the_code_hash_covers_the_tracing_modules() -> None:
    assert {"engine/devicemodel.py", "engine/models.py", "engine/sgd.py"} <= set(devicemodel.TRACED_BY)
    assert {"model_version", "code", "torch", "torchvision"} <= set(devicemodel.code_version())


@pytest.mark.slow
def test_a_broken_or_foreign_cache_file_is_a_miss(cache, monkeypatch) -> None:
    fresh = profile_of(SMALL)
    (path,) = cache.glob("*.npz")
    for content in (b"", b"not a zip", path.read_bytes()[:100]):
        path.write_bytes(content)
        monkeypatch.setattr(devicemodel, "_TRACES", {})
        assert json.dumps(profile_of(SMALL)) == json.dumps(fresh)
    assert devicemodel._read_trace(path, "another key") is None


@pytest.mark.slow
def test_the_cache_can_be_turned_off_and_an_unwritable_one_is_left_alone(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(devicemodel, "_TRACES", {})
    monkeypatch.setenv(devicemodel.CACHE_ENV, "off")
    assert devicemodel.cache_dir() is None
    profile_of(SMALL)
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(devicemodel.CACHE_ENV, str(blocked / "cache"))  # under a file: cannot be made
    monkeypatch.setattr(devicemodel, "_TRACES", {})
    profile_of(SMALL)
    monkeypatch.delenv(devicemodel.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert devicemodel.cache_dir() == tmp_path / "xdg" / "ralp-pipe"


@pytest.mark.slow
def test_a_cache_hit_imports_neither_torch_nor_torchvision(cache) -> None:
    profile_of(SMALL)
    code = (
        "import sys\n"
        "from ralp_pipe.config import load\n"
        "from ralp_pipe.engine import devicemodel\n"
        f"cfg = load({SMALL!r})\n"
        "devicemodel.modelled_profile(cfg, {'worker': 2, 'ps_ralp_n_n8': 14}, 8)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision')))\n"
    )
    env = {"PATH": "", devicemodel.CACHE_ENV: str(cache)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_trace_key_holds_every_setting_it_depends_on() -> None:
    sgd = load(SMALL).train
    key = devicemodel.trace_key("resnet18", 1000, 32, 0.5, sgd)
    assert dataclasses.asdict(sgd)["lr"] == key["lr"]
    assert {"model", "num_classes", "image_size", "dropout", "lr", "momentum", "weight_decay"} <= set(key)


def test_a_simulation_of_a_cached_trace_imports_neither_torch_nor_torchvision(cache, tmp_path) -> None:
    """The whole `simulate --target` command: profile, unit table, pricing, table and plots."""
    profile_of(SMALL)  # traced and cached
    argv = ["simulate", "--target", "v100", "--gpus", "2", "8", "--link-gbit", "10", "--out", str(tmp_path / "out")]
    argv += [o for o in SMALL if not o.startswith("device=")]
    assert _torch_modules_after(argv, cache, tmp_path) == "[]"
    assert (tmp_path / "out" / "simulation.parquet").exists()


def test_a_plan_of_a_modelled_profile_imports_neither_torch_nor_torchvision(cache, tmp_path) -> None:
    """`plan` on a modelled profile whose trace is cached takes its unit table from the trace."""
    from ralp_pipe import cli

    mine = [*SMALL, "network.rate=10gbit"]
    assert cli.main(["profile", "--target", "v100", "--out", str(tmp_path / "p.json"), *mine[:3], mine[4]]) == 0
    argv = ["plan", "--profile", str(tmp_path / "p.json"), "--out", str(tmp_path / "plan.json"), "--gpus", "4", *mine]
    assert _torch_modules_after(argv, cache, tmp_path) == "[]"
    assert (tmp_path / "plan.json").exists()


def _torch_modules_after(argv: list[str], cache: Path, home: Path) -> str:
    """The torch and torchvision modules a fresh interpreter holds after ``ralp-pipe ARGV`` (which must succeed),
    with traces cached in `cache`."""
    code = (
        "import contextlib, io, sys\n"
        "from ralp_pipe import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert cli.main({argv!r}) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision')))\n"
    )
    env = {"PATH": "", devicemodel.CACHE_ENV: str(cache), "MPLBACKEND": "Agg", "HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
