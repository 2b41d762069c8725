"""Time-dilated emulation beyond real compute: modelled stand-ins, messages padded to the target's bytes,
the lateness a pacer catches up on, and ``dilation.factor=auto``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from ralp_pipe.config import load
from ralp_pipe.contract.topology import of_strategy
from ralp_pipe.engine import dilation, models
from ralp_pipe.engine.dilation import (
    OVERRUN_TOLERANCE_S,
    WORKER,
    Pacer,
    Targets,
    placeholder_batch,
    run_delay_s,
    stand_ins,
)
from ralp_pipe.engine.strategies.ralp import padded
from support.small_run import small
from support.train import run_train, train_metrics


class Clock:
    """A clock that advances by a microsecond at every reading (so that waiting on it ends) and on demand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-6
        return self.now

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        self.now += seconds


def _targets(seconds: float, units: int = 1) -> Targets:
    return Targets(
        factor=1.0,
        mode="real",
        device="test",
        fwd_s={WORKER: [seconds] * units},
        bwd_s={WORKER: [seconds] * units},
        update_s_per_byte=0.0,
        update_s_fixed=0.0,
        aggregate_s_per_byte=0.0,
        aggregate_s_fixed=0.0,
    )


@pytest.mark.slow
def test_stand_ins_give_the_target_shapes_and_fire_every_parameter_hook_without_computing() -> None:
    units = models.model_units("resnet18", 10, 0.5, "meta")
    real = models.activation_shapes(models.model_units("resnet18", 10, 0.5), 64, batch=3)
    modelled = stand_ins(units, 64, "cpu")
    net = nn.Sequential(*(u.module for u in modelled))
    params = list(net.parameters())
    assert [p.shape for p in params] == [
        p.shape for u in models.model_units("resnet18", 10, 0.5) for p in u.module.parameters()
    ]
    images, labels = placeholder_batch(3)
    assert images.numel() == 0 and labels.shape == (3,)
    outputs = []
    x = images
    for unit in net:
        x = unit(x)
        outputs.append(tuple(x.shape))
    assert outputs == real  # every unit's output has its real shape, for the batch that came in
    fired: list[int] = []
    for index, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _p, index=index: fired.append(index))
    before = [p.detach().clone() for p in params]
    nn.functional.cross_entropy(x, labels).backward()
    assert sorted(fired) == list(range(len(params)))
    # backward order: a later unit's parameters are ready before an earlier unit's
    assert fired.index(len(params) - 1) < fired.index(0)
    assert all(p.grad is not None and p.grad.is_sparse and p.grad._nnz() == 0 for p in params)
    same = (torch.equal(a.view(torch.int32), p.detach().view(torch.int32)) for a, p in zip(before, params))
    assert all(same)  # nothing is trained (bit for bit: uninitialised values may be NaN)


def test_padded_messages_carry_the_values_first_and_the_target_size() -> None:
    values = torch.arange(6.0).reshape(2, 3)
    message = padded(values, 10)
    assert message.numel() == 10 and torch.equal(message[:6], values.reshape(-1))
    assert padded(values, 6).data_ptr() == values.data_ptr()  # the target's size already: no copy


def test_a_late_unit_makes_the_next_deadlines_earlier_until_caught_up() -> None:
    clock = Clock()
    pacer = Pacer(_targets(0.01, 3), lambda: 0.0, clock=clock)
    pacer.run(0.01, lambda: clock.advance(0.015))  # 5 ms late: an overrun
    assert pacer.take() == (1, 0) and pacer.behind == pytest.approx(0.005, abs=1e-4)
    began = clock.now
    pacer.run(0.01, lambda: clock.advance(0.002))
    assert clock.now == pytest.approx(began + 0.005, abs=1e-4)  # its 10 ms less the 5 ms carried
    assert pacer.behind == 0.0 and pacer.take() == (0, 0)
    assert pacer.needed == pytest.approx(1.4, abs=1e-2)  # the late unit would have fitted at D = 1.4 (1 ms spare)


def test_a_unit_late_only_because_the_host_did_not_run_it_is_a_stall_not_an_overrun() -> None:
    clock, stalled = Clock(), [0.0]
    pacer = Pacer(_targets(0.01), lambda: 0.0, clock=clock, stalled=lambda: stalled[0])

    def descheduled(work_s: float, off_core_s: float) -> None:
        clock.advance(work_s + off_core_s)
        stalled[0] += off_core_s

    pacer.run(0.01, lambda: descheduled(0.002, 0.013))  # 2 ms of work, 13 ms runnable without a core
    assert pacer.take() == (0, 1) and pacer.behind == pytest.approx(0.005, abs=1e-4)  # still late: caught up later
    assert pacer.needed == pytest.approx(0.1, abs=1e-2)  # its work fitted at D = 0.1 (after the 1 ms tolerance)
    pacer.run(0.01, lambda: descheduled(0.015, 0.004))  # 15 ms of work: an overrun whatever the host did
    assert pacer.take() == (1, 0)


def test_run_delay_grows_while_another_process_holds_the_only_core_and_is_each_threads_own() -> None:
    cpus = os.sched_getaffinity(0)
    core = {min(cpus)}
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {core}); exec('while 1: pass')"]
    )
    asleep: list[float] = []

    def sleeper() -> None:  # not runnable while this thread waits for the core: its own delay stays small
        before = run_delay_s()
        time.sleep(0.3)
        asleep.append(run_delay_s() - before)

    try:
        os.sched_setaffinity(0, core)
        time.sleep(0.1)  # the other process is on the core
        before, began = run_delay_s(), time.perf_counter()
        other = threading.Thread(target=sleeper)
        other.start()
        while time.perf_counter() - began < 0.3:  # runnable throughout, on a core shared with a busy process
            pass
        assert run_delay_s() - before > 0.05
        other.join()
        assert asleep[0] < 0.02
    finally:
        os.sched_setaffinity(0, cpus)
        busy.kill()
        busy.wait()


def test_communication_waited_absorbs_the_lateness_carried() -> None:
    clock, waited = Clock(), [0.0]
    pacer = Pacer(_targets(0.01), lambda: waited[0], clock=clock)
    pacer.run(0.01, lambda: clock.advance(0.015))
    began = clock.now

    def wait_for_a_transfer() -> None:
        clock.advance(0.02)
        waited[0] += 0.02

    pacer.run(0.01, wait_for_a_transfer)
    assert clock.now == pytest.approx(began + 0.03, abs=1e-4)  # the transfer's 20 ms took the 5 ms up: a full 10


def test_measure_only_records_the_factor_needed_and_never_waits() -> None:
    clock = Clock()
    pacer = Pacer(_targets(0.01), lambda: 0.0, clock=clock, measure_only=True)
    pacer.run(0.01, lambda: clock.advance(0.03))
    pacer.run(0.01, lambda: clock.advance(OVERRUN_TOLERANCE_S / 2))  # too short to judge
    assert clock.now == pytest.approx(0.03 + OVERRUN_TOLERANCE_S / 2, abs=1e-4)
    assert pacer.needed == pytest.approx(2.9, abs=1e-2) and pacer.take() == (0, 0)


def test_auto_factor_is_the_margin_over_the_need_rounded_up_to_two_digits() -> None:
    assert dilation.auto_factor(3.0, 1.25) == 3.8
    assert dilation.auto_factor(117.0, 1.25) == 150.0
    assert dilation.auto_factor(0.2, 1.25) == 1.0
    assert dilation.auto_factor(8.0, 1.25) == 10.0


@pytest.mark.slow
def test_targets_scale_with_the_factor() -> None:
    cfg = load(["model=resnet18", "train.image_size=32", "train.batch_size=2", "dilation.factor=1"])
    topo = of_strategy(cfg.strategy, cfg.cluster.gpus)
    one, three = dilation.targets(cfg, topo), dilation.targets(cfg, topo, 3.0)
    assert one is not None and three is not None
    scaled = one.scaled(3.0)
    assert scaled.fwd_s[WORKER] == pytest.approx(three.fwd_s[WORKER]) and scaled.factor == 3.0
    assert scaled.update_s_per_byte == pytest.approx(three.update_s_per_byte)


MODELLED = ["dataset.num_classes=10", "train.image_size=64", "train.measure_steps=2", "dilation.mode=modelled"]


@pytest.mark.slow  # train subprocesses
@pytest.mark.parametrize(
    "strategy,gpus,factor", [("ps", 2, 20.0), ("allreduce", 2, 20.0), ("ralp_n", 3, 20.0), ("ps", 2, 0.5)]
)  # 0.5: time compressed, the target's time halved
def test_a_modelled_run_moves_the_target_bytes_in_the_padded_time(
    strategy: str, gpus: int, factor: float, tmp_path: Path
) -> None:
    overrides = small(*MODELLED, f"strategy={strategy}", f"cluster.gpus={gpus}", f"dilation.factor={factor}")
    metrics = train_metrics(tmp_path / "run", overrides)
    record = metrics["dilation"]
    assert record["mode"] == "modelled" and record["factor"] == factor
    assert metrics["gb_per_step"] == pytest.approx(metrics["analytic_gb_per_step"], rel=1e-9)
    cfg = load(overrides)
    targets = dilation.targets(cfg, of_strategy(cfg.strategy, cfg.cluster.gpus))
    assert targets is not None
    worker = sum(targets.fwd_s[WORKER]) + sum(targets.bwd_s[WORKER])
    if strategy == "ralp_n":  # a worker runs the units below the split
        split = models.default_split(models.model_units("resnet18", 10, 0.5, "meta"))
        worker = sum(targets.fwd_s[WORKER][:split]) + sum(targets.bwd_s[WORKER][:split])
    assert metrics["step_time_s"] >= worker
    assert metrics["target_images_per_sec"] == pytest.approx(metrics["images_per_sec"] * factor)
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    assert record["overruns"] == int(steps.loc[steps["phase"] == "measure", "overruns"].sum())


@pytest.mark.slow  # a train subprocess
def test_a_real_run_on_a_smaller_batch_and_crop_sends_the_target_bytes(tmp_path: Path) -> None:
    overrides = small(
        "strategy=ralp_n",
        "cluster.gpus=3",
        "dataset.num_classes=10",
        "train.batch_size=4",
        "train.image_size=64",
        "train.measure_steps=2",
        "dilation.factor=4",
        "dilation.compute_batch_size=2",
        "dilation.compute_image_size=32",
    )
    metrics = train_metrics(tmp_path / "run", overrides)
    assert metrics["dilation"]["compute_batch_size"] == 2 and metrics["dilation"]["compute_image_size"] == 32
    sent, analytic = metrics["gb_per_step"], metrics["analytic_gb_per_step"]
    assert sent == pytest.approx(analytic, rel=1e-9)  # the target's 4 images at 64 px, padded
    units = models.model_units("resnet18", 10, 0.5, "meta")
    split = metrics["split"]
    with torch.device("meta"):
        elements = math.prod(models.activation_shapes(units[:split], 64)[-1][1:])
    assert analytic["activations"] == pytest.approx(2 * 4 * elements * 4 / 1e9)  # 2 workers x 4 images, float32


@pytest.mark.slow  # two launches of train's ranks
def test_auto_measures_the_units_and_leaves_no_overrun(tmp_path: Path) -> None:
    overrides = small("dataset.num_classes=10", "train.measure_steps=3", "dilation.factor=auto", "dilation.margin=2")
    metrics = train_metrics(tmp_path / "run", overrides)
    record = metrics["dilation"]
    auto = record["auto"]
    assert auto["method"] == "calibration" and auto["margin"] == 2.0 and auto["needed_factor"] > 1
    assert record["factor"] == dilation.auto_factor(auto["needed_factor"], 2.0)
    assert record["overruns"] == 0, record
    assert record["needed_factor"] <= record["factor"]


@pytest.mark.slow  # the link check's clusters and train's ranks
@pytest.mark.netns
@pytest.mark.parametrize("strategy", ["ps", "allreduce"])
def test_modelled_auto_checks_the_links_and_the_backends_own_traffic(strategy: str, tmp_path: Path) -> None:
    overrides = small(*MODELLED, "cluster=emulated", "network=1gbit", f"strategy={strategy}", "dilation.factor=auto")
    record = train_metrics(tmp_path / "run", overrides)["dilation"]
    auto = record["auto"]
    assert auto["method"] == "links" and auto["factor"] == record["factor"], auto
    # the measurement at the factor chosen (the search may have gone on below it to a D that failed)
    chosen = [m for m in auto["measurements"] if m["factor"] == auto["factor"]][-1]
    assert chosen["worst"] >= auto["threshold"]
    backend = chosen["backend"]  # gloo across the run's hosts (2 workers; 2 workers and a PS), at the factor chosen
    assert backend["pattern"] == {"allreduce": "ring", "ps": "star"}[strategy], backend
    assert backend["hosts"] == {"allreduce": 2, "ps": 3}[strategy] and backend["efficiency"] >= auto["threshold"]


@pytest.mark.slow  # the link check's clusters and train's ranks
@pytest.mark.netns
def test_a_checked_factor_is_taken_by_the_run_without_measuring_the_links_again(tmp_path: Path) -> None:
    """`ralp-pipe check-links` chooses once (the workflow's check_links job); `train --link-check` takes its D."""
    run = small(*MODELLED, "cluster=emulated", "network=1gbit", "strategy=ps", "dilation.factor=auto")
    check = tmp_path / "factors" / "star-h3.json"  # ps at N=2: 2 workers and a PS
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ralp_pipe.cli",
            "check-links",
            "--out",
            str(check),
            "--hosts",
            "3",
            "--pattern",
            "star",
            *run,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    chosen = json.loads(check.read_text())
    assert chosen["hosts"] == 3 and chosen["backend"] == "star" and chosen["seconds"] > 0
    proc = run_train(tmp_path / "run", [*run, "--link-check", str(check)])
    assert proc.returncode == 0, proc.stderr
    assert "measuring the emulated links" not in proc.stdout
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())["dilation"]
    assert record["factor"] == chosen["factor"]
    assert record["auto"] == {"method": "links", "link_check": str(check), **chosen}


def test_a_unit_the_target_does_in_no_time_is_lateness_not_an_overrun() -> None:
    clock = Clock()
    pacer = Pacer(_targets(0.0), lambda: 0.0, clock=clock)
    pacer.run(0.0, lambda: clock.advance(0.004))  # a flatten the host was slow in: no D would fit it
    assert pacer.take() == (0, 0) and pacer.needed == 0.0
    assert pacer.behind == pytest.approx(0.004, abs=1e-4)
