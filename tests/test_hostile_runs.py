"""`ralp-pipe train` in hostile places: a file as --out, full and read-only disks, too many ranks for the host,
Ctrl-C and SIGTERM mid-run, staging folders of killed drivers, failed reruns over an older run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ralp_pipe import cli
from ralp_pipe.config import load
from ralp_pipe.contract.topology import of_strategy
from ralp_pipe.engine import train
from ralp_pipe.errors import ConfigError, RunFailure
from ralp_pipe.runtime import hardware
from support.disks import fill, tmpfs
from support.procs import processes_using
from support.small_run import SMALL, small


def _default_sigint() -> None:
    """In the child before exec: take SIGINT's default (a background shell leaves it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _train(out: Path, *overrides: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run `ralp-pipe train --out OUT` on the small model in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *small(*overrides)],
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )  # type: ignore[call-overload]


def _one_line(stderr: str, kind: str) -> str:
    """The single stderr line of a refused or stopped run, checked to be the CLI's and traceback-free."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"ralp-pipe train: {kind}: "), stderr
    return lines[0]


def _wait_for_ranks(proc: subprocess.Popen[str], runs: Path, name: str = "run") -> None:
    """Wait until the driver started writing rank logs into its staging folder in `runs`."""
    deadline = time.monotonic() + 120
    while not list(runs.glob(f".{name}.ranks-*/rank*.log")):
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.01)


def _start_train(out: Path, *overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *small(*overrides)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


# --- 1: an unusable --out is refused before any rank starts ----------------------------------------------------------


@pytest.mark.slow  # a `ralp-pipe train` subprocess (it imports torch before it refuses)
@pytest.mark.parametrize("where", ["file", "below a file"])
def test_out_that_is_or_lies_below_a_file_is_refused_before_the_ranks_start(tmp_path: Path, where: str) -> None:
    (tmp_path / "taken").write_text("not a folder\n")
    out = tmp_path / "taken" if where == "file" else tmp_path / "taken" / "runs" / "run"
    began = time.monotonic()
    proc = _train(out, "train.measure_steps=3")
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr, "configuration error")
    assert f"--out {out}" in line and "choose another --out" in line, line
    assert (
        "is a file, not a folder" if where == "file" else f"{tmp_path / 'taken'}/runs: Not a directory (ENOTDIR)"
    ) in line, line
    assert time.monotonic() - began < 30, "the refusal came after a measurement"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"], "a staging folder was made"


@pytest.mark.slow  # a `ralp-pipe train` subprocess (it imports torch before it refuses)
@pytest.mark.parametrize("loader", ["dali", "torchvision"])
def test_a_shard_loader_without_prepared_shards_is_refused_before_the_ranks_start(tmp_path: Path, loader: str) -> None:
    results = tmp_path / "results"
    proc = _train(tmp_path / "run", f"train.loader={loader}", f"paths.results={results}")
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr, "configuration error")
    assert f"no manifest.json in {results}/data/synthetic1k" in line and "ralp-pipe prepare-shards" in line, line
    assert "rank" not in line, "ranks were started to find the shards missing"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a staging folder was made"


@pytest.mark.slow  # `ralp-pipe train` subprocesses (each imports torch)
def test_a_second_driver_of_the_same_out_is_refused_at_once_naming_the_folder_and_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "run"
    lock = tmp_path / "runs" / ".run.lock"
    with train.out_locked(out):  # this process is the first driver
        began = time.monotonic()
        proc = _train(out, "train.measure_steps=3")
        assert lock.read_text() == f"{os.getpid()}\n"
    assert proc.returncode == 2, proc.stderr
    assert _one_line(proc.stderr, "configuration error") == (
        f"ralp-pipe train: configuration error: --out {out}: another `ralp-pipe train` (PID {os.getpid()}) is writing "
        f"this folder right now (it holds {lock}); wait for it to end; choose another --out or fix that path"
    )
    assert time.monotonic() - began < 60, "the refusal came after a measurement"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [], "the lock file or a staging folder was left"


@pytest.mark.slow  # two `ralp-pipe train` subprocesses, one with 3 ranks
def test_two_drivers_of_one_out_at_once_one_runs_and_the_other_is_refused(tmp_path: Path) -> None:
    """Both used to exit 0 naming the same folder, one measurement silently lost."""
    runs = tmp_path / "runs"
    first = _start_train(runs / "run", "train.measure_steps=200")
    try:
        _wait_for_ranks(first, runs)
        second = _train(runs / "run", "train.measure_steps=2")
        assert first.poll() is None, "the first run ended before the second was refused"
        first.send_signal(signal.SIGINT)
        _, stderr = first.communicate(timeout=60)
    finally:
        first.kill()
    assert second.returncode == 2, second.stderr
    line = _one_line(second.stderr, "configuration error")
    assert f"--out {runs / 'run'}: another `ralp-pipe train` (PID {first.pid}) is writing this folder" in line, line
    assert first.returncode == 128 + signal.SIGINT, stderr  # the lock goes with the first driver, however it ends
    assert list(runs.iterdir()) == [], "the lock file, a staging folder or a record was left"


@pytest.mark.slow  # `ralp-pipe train` subprocesses (each imports torch)
def test_shards_given_with_the_option_are_the_ones_checked(tmp_path: Path) -> None:
    """--shards names the folder the ranks read; the configured results folder is not looked at."""
    given = tmp_path / "shards"
    given.mkdir()
    proc = _train(tmp_path / "run", "train.loader=dali", "--shards", str(given))
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr, "configuration error")
    assert f"no manifest.json in {given}: " in line, line
    manifest = {"dataset": "synthetic22k", "classes_found": 3, "shards": [{"name": "s0.tar", "index": "s0.idx"}]}
    (given / "manifest.json").write_text(json.dumps(manifest))  # another dataset's, with labels that would fit
    proc = _train(tmp_path / "run", "train.loader=dali", "--shards", str(given))
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr, "configuration error")
    assert (
        f"shards {given} were prepared for dataset 'synthetic22k' but this run has dataset.name='synthetic1k'" in line
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"], "a staging folder was made"


# --- 2: full and read-only disks: one line naming the path and errno, nothing half-written -----------------------------


@pytest.mark.slow  # a `ralp-pipe train` subprocess (it imports torch before it refuses)
def test_out_on_a_disk_without_room_for_the_records_is_refused_naming_it(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "20m") as disk:
        fill(disk)
        proc = _train(disk / "runs" / "run", "train.measure_steps=3")
        assert proc.returncode == 2, proc.stderr
        line = _one_line(proc.stderr, "configuration error")
        need = f"{train.MIN_FREE_BYTES / 1e6:.0f} MB"
        assert (
            f"{disk}/runs: No space left on device (ENOSPC): 0.0 MB free, the run's records and logs need {need}"
            in line
        ), line
        assert sorted(p.name for p in (disk / "runs").iterdir()) == [], "a staging folder was left"


@pytest.mark.slow  # a `ralp-pipe train` subprocess (it imports torch before it refuses)
@pytest.mark.parametrize("out_is_the_mount", [False, True])
def test_read_only_out_is_refused_naming_the_path_and_erofs(tmp_path: Path, out_is_the_mount: bool) -> None:
    with tmpfs(tmp_path / "disk", "20m", read_only=True) as disk:
        out = disk if out_is_the_mount else disk / "runs" / "run"
        proc = _train(out, "train.measure_steps=3")
        assert proc.returncode == 2, proc.stderr
        line = _one_line(proc.stderr, "configuration error")
        failing = disk if out_is_the_mount else disk / "runs"
        assert f"--out {out}: cannot write there: {failing}" in line and "Read-only file system (EROFS)" in line, line
        assert list(disk.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk"], "a staging folder was left"


@pytest.mark.slow  # a `ralp-pipe train` subprocess with 3 ranks
def test_disk_filling_under_the_rank_logs_during_the_run_is_named_not_an_empty_log(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "20m") as disk:
        runs = disk / "runs"
        proc = _start_train(runs / "run", "train.measure_steps=50")
        try:
            _wait_for_ranks(proc, runs)
            fill(disk)
            _, stderr = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 4, stderr
        headline = stderr.splitlines()[0]
        assert headline.startswith(f"ralp-pipe train: run failed: {runs}/.run.ranks-"), headline
        assert "No space left on device (ENOSPC): the disk holding the rank logs filled up" in headline, headline
        assert "Traceback" not in stderr.split(headline)[0]
        assert list(runs.iterdir()) == [], "the failed run left its staging folder or output"


@pytest.mark.slow  # a `ralp-pipe train` subprocess with 3 ranks
def test_disk_full_when_the_driver_writes_the_records_is_one_line_and_leaves_no_half_record(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with tmpfs(runs / "run", "20m") as out:  # --out is a disk of its own, the staging folder lies next to it
        proc = _start_train(out, "train.measure_steps=50")
        try:
            _wait_for_ranks(proc, runs)
            fill(out)
            _, stderr = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 4, stderr
        line = _one_line(stderr, "run failed")
        assert f"cannot write the run's records to {out}: {out}/steps.parquet: " in line, line
        assert "No space left on device (ENOSPC); the measurement is lost" in line, line
        assert sorted(p.name for p in out.iterdir()) == ["filler"], "a record or temporary file was left"
    assert [p.name for p in runs.iterdir()] == ["run"], "the staging folder was left"


# --- 3: more ranks than the host can run ---------------------------------------------------------------------------


def _no_launch(command: list[str], world_size: int, *_: object) -> None:
    raise AssertionError(f"the driver launched {world_size} ranks")


@pytest.mark.slow
def test_a_thousand_local_ranks_are_refused_with_the_hosts_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(train, "launch_local", _no_launch)  # should the check fail, no thousand processes start
    cfg = load(["cluster=local", "model=resnet18", "cluster.gpus=1000", "train.loader=synthetic"])
    with pytest.raises(ConfigError) as refused:
        train.run(cfg, tmp_path / "run")
    message = str(refused.value)
    cores = hardware.usable_cores()
    assert message.startswith(
        f"cluster.gpus=1000 makes ps start 1001 ranks on this host (cluster.kind=local), "
        f"which has {cores} CPU cores and "
    ), message
    assert f"max(8, 4 x {cores} cores) = {max(8, 4 * cores)}" in message, message
    assert "use fewer cluster.gpus, or cluster=slurm" in message, message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ranks_whose_models_exceed_the_hosts_memory_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hardware, "usable_cores", lambda: 64)
    monkeypatch.setattr(hardware, "usable_memory", lambda: (8_000_000_000, "the limit of memory cgroup /x"))
    monkeypatch.setattr(train, "launch_local", _no_launch)
    cfg = load(
        ["cluster=local", "model=vgg16", "strategy=allreduce", "cluster.gpus=4", "train.loader=synthetic"]
    )  # 553 MB of parameters; 44.5 MB of unit outputs an image at 192 px
    with pytest.raises(ConfigError) as refused:
        train.run(cfg, tmp_path / "run")
    assert (
        "8.0 GB of memory (the limit of memory cgroup /x): its ranks need 9.4 GB (4 x 2.34 GB a rank: 0.5 GB + "
        "3 x 0.55 GB of vgg16 parameters + 0.18 GB of activations (train.batch_size=4 at train.image_size=192)): "
        "use fewer cluster.gpus or a smaller train.batch_size"
    ) in str(refused.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_slurm_ranks_are_not_bounded_by_this_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "usable_cores", lambda: 1)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cfg = load(["cluster=slurm", "model=resnet18", "cluster.gpus=1000", "train.loader=synthetic"])
    with pytest.raises(RunFailure, match="outside a SLURM allocation"):  # got past the host check, to srun
        train.run(cfg, tmp_path / "run")


# --- 4: Ctrl-C and SIGTERM -----------------------------------------------------------------------------------------


@pytest.mark.slow  # a `ralp-pipe train` subprocess with 3 ranks
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_train_exits_128_plus_signal_with_one_line_and_leaves_nothing(tmp_path: Path, signum: int) -> None:
    runs = tmp_path / "runs"
    out = runs / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *SMALL, "train.measure_steps=50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(runs.glob(".run.ranks-*/rank*.log")):  # the driver is starting its ranks right now
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.01)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, stderr
    assert _one_line(stderr, "stopped") == f"ralp-pipe train: stopped: interrupted by {signal.Signals(signum).name}"
    assert processes_using(str(tmp_path)) == [], "ranks outlived the interrupted run"
    assert list(runs.iterdir()) == [], "the interrupted run left its staging folder or output"


SWALLOWING_STAGE = """
import signal, time

class Swallower:
    def __del__(self):  # an exception raised here is only printed ("Exception ignored in ..."), like in a fork hook
        signal.raise_signal(signal.{signal})
        for _ in range(1000):
            pass

def add_arguments(parser):
    pass

def main(args):
    Swallower()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return 0
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_signal_raised_where_python_swallows_exceptions_still_stops_the_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signame: str
) -> None:
    module = f"swallowing_stage_{signame.lower()}"
    (tmp_path / f"{module}.py").write_text(SWALLOWING_STAGE.replace("{signal}", signame))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.STAGES, "train", (module, "test stage"))
    began = time.monotonic()
    status = cli.main(["train"])
    assert status == 128 + signal.Signals[signame], "the signal was lost in __del__ and the stage ran to its end"
    assert time.monotonic() - began < 5
    err = capsys.readouterr().err
    assert err == f"ralp-pipe train: stopped: interrupted by {signame}\n", err


@pytest.mark.slow  # a `ralp-pipe train` subprocess
def test_signal_while_the_driver_imports_torch_gives_one_line_too(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(tmp_path / "run"), *SMALL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text():  # the stage's modules are being imported
        assert proc.poll() is None and time.monotonic() < deadline, "torch was never loaded"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert _one_line(stderr, "stopped") == "ralp-pipe train: stopped: interrupted by SIGTERM"


# --- 5: staging folders of killed drivers ----------------------------------------------------------------------------


@pytest.mark.slow  # two `ralp-pipe train` subprocesses with 3 ranks each
def test_staging_folder_of_a_killed_driver_is_removed_by_the_next_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    killed = _start_train(runs / "run", "train.measure_steps=50")
    try:
        _wait_for_ranks(killed, runs)
        killed.kill()  # SIGKILL: no cleanup; its ranks die with it (parent-death signal)
        killed.wait(timeout=30)
    finally:
        killed.kill()
    [left] = runs.glob(".run.ranks-*")
    assert json.loads((left / train.DRIVER_FILE).read_text())["pid"] == killed.pid
    proc = _train(runs / "run", "train.measure_steps=2")
    assert proc.returncode == 0, proc.stderr
    assert f"removed {left}, left by a driver that was killed" in proc.stdout, proc.stdout
    assert sorted(p.name for p in runs.iterdir()) == ["run"]


def test_only_stale_staging_folders_of_that_out_are_removed(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    me = {"host": os.uname().nodename, "pid": os.getpid(), "start": train._process_start(os.getpid())}
    owners = {
        ".run.ranks-dead": {**me, "pid": int(gone.stdout)},  # its driver is gone
        ".run.ranks-reused": {**me, "start": "1"},  # its PID now belongs to another process (started at another time)
        ".run.ranks-alive": me,  # a driver running right now
        ".run.ranks-elsewhere": {**me, "host": "another-host", "pid": int(gone.stdout)},  # cannot tell: kept
        ".other.ranks-dead": {**me, "pid": int(gone.stdout)},  # another --out's
    }
    for name, owner in owners.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / train.DRIVER_FILE).write_text(json.dumps(owner))
    (tmp_path / ".run.ranks-unclaimed-new").mkdir()  # a driver that has only just made it
    old = tmp_path / ".run.ranks-unclaimed-old"
    old.mkdir()
    os.utime(old, (time.time() - 2 * train.UNCLAIMED_STALE_S,) * 2)
    (tmp_path / ".run.ranks-file").write_text("not a staging folder\n")
    train.remove_stale_staging(tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".other.ranks-dead",
        ".run.ranks-alive",
        ".run.ranks-elsewhere",
        ".run.ranks-file",
        ".run.ranks-unclaimed-new",
    ]


# --- 6: a failed rerun leaves no older record looking current ----------------------------------------------------------


@pytest.mark.slow  # two `ralp-pipe train` subprocesses with 3 ranks each
def test_failed_rerun_sets_the_older_records_aside_and_a_successful_one_replaces_them(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"old": true}\n')
    (out / "steps.parquet").write_bytes(b"old steps")
    failing = {**os.environ, "RALP_PIPE_FAIL_RANK": "1", "RALP_PIPE_FAIL_STEP": "1"}
    proc = _train(out, "train.measure_steps=2", env=failing)
    assert proc.returncode == 4, proc.stderr
    assert f"moved the previous run's metrics.json and steps.parquet to {out / '.previous'}/ as *.old" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [".previous"], "the failed rerun left a record looking current"
    assert (out / ".previous" / "metrics.json.old").read_text() == '{"old": true}\n'
    assert (out / ".previous" / "steps.parquet.old").read_bytes() == b"old steps"
    proc = _train(out, "train.measure_steps=2")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "steps.parquet"]
    assert "old" not in json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("credit", "fits"), [(4, True), (0, False)])
def test_a_parameter_server_holds_only_the_gradients_its_credit_lets_fly(
    monkeypatch: pytest.MonkeyPatch, credit: int, fits: bool
) -> None:
    """VGG-11 on 21841 classes, `ps` at N=16, modelled: 17 ranks in 16 GB (2 cores: 9 modelled ranks a core). A
    modelled worker holds one bucket (4 MB), through which it pushes and pulls, no gradient and no parameters. With
    a credit of 4 buckets the PS holds 16 workers' gradients of 4 buckets (0.26 GB); with no cap, of all (14 GB)."""
    monkeypatch.setattr(hardware, "usable_cores", lambda: 2)
    monkeypatch.setattr(hardware, "usable_memory", lambda: (16_000_000_000, "this machine's"))
    cfg = load(
        ["cluster=emulated", "model=vgg11", "dataset=synthetic22k", "strategy=ps", "cluster.gpus=16"]
        + ["train.batch_size=32", "train.image_size=224", "dilation.factor=8", "dilation.mode=modelled"]
        + [f"strategy.credit={credit}", "strategy.bucket_mb=4"]
    )
    topo, units = of_strategy(cfg.strategy, cfg.cluster.gpus), train.meta_units(cfg)
    needs = train.rank_memory(cfg, topo, units, activations=0)
    assert [round(b / 1e6) for b, _ in needs[:16]] == [504] * 16  # 0.5 GB and one bucket of 4 MiB
    assert round(needs[16][0] / 1e9, 2) == (1.63 if fits else 15.34), needs[16]
    if fits:
        train.check_host(cfg, topo, units, on_cpu=True)
    else:
        with pytest.raises(ConfigError, match=r"its ranks need 23\.4 GB .* 13\.97 GB of the workers' gradients"):
            train.check_host(cfg, topo, units, on_cpu=True)
