"""One line on stderr, never a traceback, for the foreseeable mistakes of a user of the `ralp-pipe` command:
Ctrl-C to the whole process group, full and read-only result folders, bad overrides and data."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from conftest import Ran
from ralp_pipe import cli
from ralp_pipe.config import CONFIG_DIR
from ralp_pipe.engine import train
from ralp_pipe.runtime import hardware
from support.disks import fill, tmpfs
from support.procs import cmdline, group
from support.small_run import SMALL
from workflow_records import write_results

RALP_PIPE = Path(sys.executable).with_name("ralp-pipe")


def one_line(stderr: str, stage: str, kind: str) -> str:
    """The single stderr line of a refused or stopped command, checked to be the CLI's and traceback-free."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"ralp-pipe {stage}: {kind}: "), stderr
    return lines[0]


def command(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the `ralp-pipe` command with `argv` in a subprocess (the `ralp_pipe` fixture runs it either way)."""
    return subprocess.run([str(RALP_PIPE), *argv], capture_output=True, text=True, timeout=timeout)


def left_running(pgid: int, wait_s: float = 10.0) -> list[str]:
    """The command lines of processes of group `pgid` still running after up to `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while group(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [cmdline(pid) for pid in group(pgid)]


# --- Ctrl-C in a terminal: SIGINT to the whole process group ----------------------------------------------------------


def _torch_loading(pgid: int) -> bool:
    """Whether a process of group `pgid` (the command, which imports torch before its ranks' server forks) has
    begun to load torch."""
    for pid in group(pgid):
        try:
            if "libtorch" in Path(f"/proc/{pid}/maps").read_text():
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow  # a `ralp-pipe train` subprocess, stopped while it imports torch
def test_ctrl_c_to_the_process_group_during_train_start_up_prints_one_line(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [str(RALP_PIPE), "train", "--out", str(tmp_path / "run"), *SMALL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 60
        while not _torch_loading(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, "the command never loaded torch"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert one_line(stderr, "train", "stopped") == "ralp-pipe train: stopped: interrupted by SIGINT"
    assert left_running(proc.pid) == [], "processes of the interrupted command's group were left running"


# --- overrides: one line naming the key and what is allowed -----------------------------------------------------------


def _options(group: str) -> str:
    """The options of a config group, as a refused override lists them (sorted, comma-separated)."""
    return ", ".join(sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml")))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["train.batch_size=abc"], "train.batch_size='abc' is not allowed: it must be an integer"),
        (["model="], f"model='' is not allowed; choose one of: {_options('model')}"),
        (["strategy=bogus"], f"strategy='bogus' is not allowed; choose one of: {_options('strategy')}"),
        (
            ["+unknown.key=1"],
            "there is no config key 'unknown.key'; the keys of the configuration are: dataset, model, strategy, ",
        ),
        (
            ["paths.results=${oc.env:RALP_PIPE_TEST_UNSET}/r"],
            "paths.results='${oc.env:RALP_PIPE_TEST_UNSET}/r' cannot be resolved: ",
        ),
        (
            ["train.batch_size=2", "train.batch_size=3"],
            "train.batch_size is given twice (train.batch_size=2, then train.batch_size=3): give it once",
        ),
    ],
)
def test_a_bad_override_is_one_line_naming_the_key_and_what_is_allowed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ralp_pipe: Callable[..., Ran],
    overrides: list[str],
    expected: str,
) -> None:
    monkeypatch.delenv("RALP_PIPE_TEST_UNSET", raising=False)
    monkeypatch.chdir(tmp_path)  # the default results folder would be made here
    shards = ["dataset.num_classes=2", "dataset.synthetic.images_per_class=1", "dataset.shards.workers=1"]
    proc = ralp_pipe("prepare-shards", "--no-progress", *shards, *overrides, timeout=120)
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc.stderr, "prepare-shards", "configuration error")
    assert expected in line, line
    assert list(tmp_path.iterdir()) == [], "something was written"


@pytest.mark.slow  # generates a few thousand JPEGs, then packs them in a pool
def test_ctrl_c_while_prepare_shards_packs_in_its_pool_prints_one_line_and_nothing_after(tmp_path: Path) -> None:
    argv = [
        str(RALP_PIPE),
        "prepare-shards",
        "--no-progress",
        "dataset.synthetic.images_per_class=8",
        "dataset.shards.images_per_shard=64",
        "dataset.shards.workers=2",
        f"paths.results={tmp_path}",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any((tmp_path / "data" / "synthetic1k" / "parts").glob("shard-*.json")):  # the pool is packing
            assert proc.poll() is None and time.monotonic() < deadline, "no shard was ever finished"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)  # to the end of stderr: every process holding it has exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert stderr == "ralp-pipe prepare-shards: stopped: interrupted by SIGINT\n", stderr
    assert left_running(proc.pid) == [], "processes of the interrupted command's group were left running"


@pytest.mark.slow
def test_a_batch_whose_activations_cannot_fit_in_memory_is_refused_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(hardware, "usable_cores", lambda: 64)
    monkeypatch.setattr(hardware, "usable_memory", lambda: (8_000_000_000, "this machine's"))
    monkeypatch.delitem(cli.LOCAL_RANKS, "train")  # no rank server: the refusal must come before ranks are needed

    def no_launch(command: list[str], world_size: int, *_: object) -> None:
        raise AssertionError(f"the driver launched {world_size} ranks with train.batch_size=1000000")

    monkeypatch.setattr(train, "launch_local", no_launch)
    out = tmp_path / "run"
    small = [o for o in SMALL if not o.startswith("train.batch_size=")]
    status = cli.main(["train", "--out", str(out), *small, "cluster.device=cpu", "train.batch_size=1000000"])
    err = capsys.readouterr().err
    assert status == 2, err
    line = one_line(err, "train", "configuration error")
    assert line.startswith(
        "ralp-pipe train: configuration error: train.batch_size=1000000 does not fit in this host's 8.0 GB of memory "
        "(this machine's): a rank taking 0.5 GB + 2 x 0.05 GB of resnet18 parameters + "
    ), line
    assert "GB of activations (train.batch_size=1000000 at train.image_size=32)" in line, line
    assert line.endswith("use a smaller train.batch_size or train.image_size"), line
    assert list(tmp_path.iterdir()) == []


# --- full and read-only result folders: refused up front, or one line with nothing half-written ----------------------

SHARDS = [  # JPEGs of 9.5 kB, 4 a class: the source of 30 classes fits in 2 MB, source and shards do not
    "dataset.synthetic.images_per_class=4",
    "dataset.synthetic.height=128",
    "dataset.synthetic.width=128",
    "dataset.shards.images_per_shard=30",
]


def _stage(stage: str, inputs: Path, out: Path) -> list[str]:
    """The arguments of `stage` reading what :func:`write_results` wrote to `inputs`, writing below `out`."""
    if stage == "prepare-shards":
        return ["prepare-shards", "--no-progress", *SHARDS, f"paths.results={out}"]
    if stage == "aggregate":
        return ["aggregate", "--runs", str(inputs / "runs"), "--plans", str(inputs / "plans"), "--out", str(out)]
    small = ["model=resnet18", "train.image_size=32", "train.batch_size=2"]
    if stage == "profile":
        return ["profile", "--target", "v100", "--out", str(out / "profile.json"), *small]
    if stage == "plan":
        return ["plan", "--profile", str(inputs / "profile.json"), "--out", str(out / "plan.json"), *small]
    if stage == "simulate":
        return ["simulate", "--target", "v100", "--out", str(out), *small]
    if stage == "concurrent":
        return ["concurrent", "--out", str(out), "--job", "strategy=ps", "--job", "strategy=allreduce", *small]
    return ["bundle", "--root", str(inputs), "--include", str(inputs / "runs"), "--out", str(out / "b.tar.gz")]


def _files(folder: Path) -> list[str]:
    """The files below `folder` (relative paths, sorted)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage", ["prepare-shards", "aggregate", "bundle", "profile", "plan", "simulate", "concurrent"]
)
def test_a_read_only_result_folder_is_refused_before_any_work(
    tmp_path: Path, stage: str, ralp_pipe: Callable[..., Ran]
) -> None:
    write_results(tmp_path / "in", models=("vgg11",), gpus=(2,))
    with tmpfs(tmp_path / "disk", "2m", read_only=True) as disk:
        proc = ralp_pipe(*_stage(stage, tmp_path / "in", disk / "out"))
        assert proc.returncode == 2, proc.stderr
        line = one_line(proc.stderr, stage, "configuration error")
        option = "paths.results" if stage == "prepare-shards" else "--out"
        assert f": {option}" in line and f"cannot write there: {disk}/out: Read-only file system (EROFS)" in line, line
        assert list(disk.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["aggregate", "bundle"])
def test_a_full_disk_under_the_output_is_one_line_and_leaves_nothing_half_written(
    tmp_path: Path, stage: str, ralp_pipe: Callable[..., Ran]
) -> None:
    write_results(tmp_path / "in", models=("vgg11",), gpus=(2,))
    with tmpfs(tmp_path / "disk", "2m") as disk:
        fill(disk)
        proc = ralp_pipe(*_stage(stage, tmp_path / "in", disk / "out"))
        assert proc.returncode == 3, proc.stderr
        line = one_line(proc.stderr, stage, "data error")
        assert "No space left on device (ENOSPC); " in line and "free space there (or choose another --out)" in line, (
            line
        )
        assert _files(disk) == ["filler"], "a temporary or partial file was left"


@pytest.mark.slow  # generates and packs 120 JPEGs
@pytest.mark.parametrize(
    ("classes", "workers"),
    [(30, 1), (30, 2), (100, 2)],
    ids=["packing", "packing-in-a-pool", "generating-the-source"],  # 100 classes of source take 4.8 MB
)
def test_prepare_shards_filling_its_disk_is_one_line_and_leaves_nothing_half_written(
    tmp_path: Path, classes: int, workers: int
) -> None:
    with tmpfs(tmp_path / "disk", "2m") as disk:
        argv = _stage("prepare-shards", tmp_path, disk)
        proc = command(*argv, f"dataset.num_classes={classes}", f"dataset.shards.workers={workers}")
        assert proc.returncode == 3, proc.stderr
        line = one_line(proc.stderr, "prepare-shards", "data error")
        assert line.startswith(
            f"ralp-pipe prepare-shards: data error: cannot write the shards of synthetic1k: {disk}/data/synthetic1k"
        ), line
        assert "No space left on device (ENOSPC); nothing half-written was left (finished shards are kept)" in line, (
            line
        )
        out = disk / "data" / "synthetic1k"
        left = _files(out)
        assert "manifest.json" not in left and not [f for f in left if f.endswith(".tmp")], left
        records = {f.removeprefix("parts/").removesuffix(".json") for f in left if f.startswith("parts/")}
        packed = {f.removesuffix(".tar") for f in left if f.endswith(".tar")}
        assert packed == records, "a shard without its record, or a record without its shard"  # finished ones stay
        assert not (out / ".source.building").exists(), "the half-generated source was left"


FILLING_STAGE = """
import errno, os


def add_arguments(parser):
    parser.add_argument("--out")


def main(args):
    raise OSError(errno.{code}, os.strerror(errno.{code}), *([args.out] if args.out else []))
"""


@pytest.mark.parametrize(("code", "named"), [("ENOSPC", True), ("EROFS", True), ("EDQUOT", False)])
def test_any_stage_meeting_a_full_or_read_only_disk_ends_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: str, named: bool
) -> None:
    module = f"filling_stage_{code.lower()}"
    (tmp_path / f"{module}.py").write_text(FILLING_STAGE.replace("{code}", code))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.STAGES, "plan", (module, "test stage"))
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *(["--out", str(out)] if named else [])]) == 3
    line = one_line(capsys.readouterr().err, "plan", "data error")
    reason = f"{os.strerror(getattr(errno, code))} ({code})"
    assert line == (
        f"ralp-pipe plan: data error: cannot write the output of plan: {f'{out}: ' if named else ''}{reason}; "
        f"free space there (or write elsewhere) and rerun"
    ), line


def test_any_other_os_error_of_a_stage_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a foreseeable failure of the disk: a bug, shown with its traceback."""
    (tmp_path / "denied_stage.py").write_text(FILLING_STAGE.replace("{code}", "EACCES"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.STAGES, "plan", ("denied_stage", "test stage"))
    with pytest.raises(PermissionError):
        cli.main(["plan"])


def test_a_stop_that_code_caught_and_dropped_still_stops_the_stage() -> None:
    """A bare ``except:`` in some package's import code can drop the handler's exception: the CLI raises it
    again before the stage runs. The next command starts with none pending."""
    with cli._interrupts_raised():
        try:
            signal.raise_signal(signal.SIGINT)
        except BaseException:
            pass  # what a careless import does
        with pytest.raises(cli._Signalled) as stopped:
            cli._raise_if_swallowed()
        assert stopped.value.signum == signal.SIGINT
    with cli._interrupts_raised():
        cli._raise_if_swallowed()
