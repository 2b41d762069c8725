"""Time-dilated emulation, real mode: the deadline wait, per-unit padding and overruns, dilated strategies that
move the same bytes and train the same parameters as undilated ones, and the dilated run's records."""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
from matplotlib.container import BarContainer
from torch import nn

from ralp_pipe.config import ConfigError, load
from ralp_pipe.config.dilation import emulated_rate, shaped_rate, transport_efficiency
from ralp_pipe.contract.topology import of_strategy, topology
from ralp_pipe.engine import dilation, models
from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.dilation import OVERRUN_TOLERANCE_S, PS_DEVICE_BATCH, WORKER, Pacer, Targets, wait_until
from ralp_pipe.engine.strategies import Optim, StepSetup, build
from ralp_pipe.engine.strategies.base import Piece, assemble
from ralp_pipe.errors import BundleRefused
from ralp_pipe.results import plots
from ralp_pipe.results.aggregate import build_tables, load_records
from ralp_pipe.results.verify import check_record
from support.spawn import spawn_function
from support.train import train_metrics
from workflow_records import dilate, write_results

CLASSES, BATCH, IMAGE, STEPS = 5, 2, 16, 3
UNIT_S = 0.01  # a unit's forward (and backward) padded time at factor 1 in the distributed cases


def _targets(factor: float, units: int, fwd_s: float, bwd_s: float, update_s_per_byte: float = 0.0) -> Targets:
    return Targets(
        factor=factor,
        mode="real",
        device="test",
        fwd_s={role: [factor * fwd_s] * units for role in (WORKER, PS_DEVICE_BATCH)},
        bwd_s={role: [factor * bwd_s] * units for role in (WORKER, PS_DEVICE_BATCH)},
        update_s_per_byte=factor * update_s_per_byte,
        update_s_fixed=0.0,
        aggregate_s_per_byte=factor * update_s_per_byte,
        aggregate_s_fixed=0.0,
    )


def test_wait_until_reaches_the_deadline_and_not_before() -> None:
    late = []
    for ahead in (0.0005, 0.002, 0.005, 0.02) * 5:
        deadline = time.perf_counter() + ahead
        wait_until(deadline)
        now = time.perf_counter()
        assert now >= deadline
        late.append(now - deadline)
    assert statistics.median(late) < 2e-4, late  # time.sleep alone overshoots by ~1e-4 median, ms under load


def _units() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True)),
        nn.MaxPool2d(2),
        nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True)),
        nn.Flatten(1),
        nn.Linear(4 * 8 * 8, CLASSES),
    ]


def _timed_pass(
    pacer: Pacer | None,
) -> tuple[list[float], list[float], dict[int, float], dict[str, torch.Tensor]]:
    """Forward and backward of the padded units: each unit's forward time, the times its backward handed its
    input's gradient down, when its parameters' gradients were accumulated (by unit), and the gradients."""
    units = _units()
    net = nn.Sequential(*units)
    x = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))
    net(x).sum().backward()  # warm: a first call allocates and initialises for tens of ms
    net.zero_grad()
    if pacer is not None:
        pacer.attach(units, 0, WORKER)
    fwd_times: list[float] = []
    bwd_ends: list[float] = []
    accumulated: dict[int, float] = {}  # unit -> when the last of its gradients was accumulated
    began = [0.0]
    for u, unit in enumerate(units):
        for p in unit.parameters():
            p.register_post_accumulate_grad_hook(
                lambda _p, u=u: accumulated.__setitem__(u, time.perf_counter() - start)
            )
    for unit in units:  # registered after the pacer's: they see the padded unit
        unit.register_forward_pre_hook(lambda _m, _a: began.__setitem__(0, time.perf_counter()))
        unit.register_forward_hook(lambda _m, _a, _o: fwd_times.append(time.perf_counter() - began[0]))
    h = x
    outputs = []
    for unit in units:
        h = unit(h)
        outputs.append(h)
    start = time.perf_counter()  # (read by the accumulation hooks)
    for out in outputs[:-1]:
        out.register_hook(lambda _g: bwd_ends.append(time.perf_counter() - start))
    h.sum().backward()
    bwd_ends.append(time.perf_counter() - start)
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    return fwd_times, bwd_ends, accumulated, grads


@pytest.mark.slow
def test_padding_waits_each_unit_to_its_target_time_without_changing_gradients() -> None:
    fwd_s, bwd_s = 0.1, 0.125  # far above the real compute (under a millisecond; tens of ms on a loaded machine)
    pacer = Pacer(_targets(1.0, 5, fwd_s, bwd_s), lambda: 0.0)
    fwd_times, bwd_ends, accumulated, grads = _timed_pass(pacer)
    assert all(t >= fwd_s for t in fwd_times), fwd_times
    # the k-th gradient backward hands down (of unit 4 - k's input) arrives once k + 1 units spent their time
    assert len(bwd_ends) == 5 and all(end >= (k + 1) * bwd_s for k, end in enumerate(bwd_ends)), bwd_ends
    # a unit's gradients are accumulated (an all-reduce bucket or a push can leave) only at its padded end
    assert sorted(accumulated) == [0, 2, 4]
    assert all(at >= (5 - unit) * bwd_s for unit, at in accumulated.items()), accumulated
    assert pacer.take() == (0, 0)
    assert sum(fwd_times) < 5 * fwd_s + 0.5  # padded, not stalled
    *_, plain = _timed_pass(None)
    assert grads.keys() == plain.keys() and all(torch.equal(grads[n], plain[n]) for n in grads)


class Clock:
    """A clock that advances by `tick` seconds at every reading."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_a_unit_past_its_padded_time_is_an_overrun() -> None:
    pacer = Pacer(_targets(1.0, 5, 0.5, 0.5), lambda: 0.0, Clock(1.0))  # every unit takes 1 s of a 0.5 s target
    _timed_pass(pacer)
    assert pacer.take() == (10, 0)  # every forward and every backward of 5 units
    assert pacer.take() == (0, 0)  # counted since the last take


def test_an_overrun_is_a_unit_later_than_its_deadline_by_more_than_the_tolerance() -> None:
    for late, overrun in ((0.5 * OVERRUN_TOLERANCE_S, 0), (2 * OVERRUN_TOLERANCE_S, 1)):
        clock = Clock(0.0)
        pacer = Pacer(_targets(1.0, 1, 0.01, 0.01), lambda: 0.0, clock)
        pacer.run(0.01, lambda: setattr(clock, "now", clock.now + 0.01 + late))  # noqa: B023
        assert pacer.take() == (overrun, 0)


def test_a_unit_ends_when_the_device_finished_its_queued_work() -> None:
    clock = Clock(0.0)
    pacer = Pacer(_targets(1.0, 1, 0.01, 0.01), lambda: 0.0, clock, sync=lambda: setattr(clock, "now", 0.02))
    pacer.run(0.01, lambda: None)  # the hooks returned at once, the GPU's kernels ran until 20 ms
    assert pacer.take() == (1, 0)


def test_communication_waited_inside_a_unit_moves_its_deadline() -> None:
    waited = [0.0]
    pacer = Pacer(_targets(1.0, 1, 0.01, 0.01), lambda: waited[0])
    began = time.perf_counter()

    def work() -> None:
        time.sleep(0.002)
        waited[0] += 0.02  # as if the block had been blocked on a transfer for 20 ms

    pacer.run(0.01, work)
    assert time.perf_counter() - began >= 0.03
    assert pacer.take() == (0, 0)


def test_shaped_rate_divides_the_link_by_the_factor() -> None:
    assert shaped_rate("1gbit", 4.0) == "250000000bit"
    assert shaped_rate("1gbit", 0.125) == "8000000000bit"  # time compressed: faster than the target
    assert shaped_rate("1gbit", None) == "1gbit"
    assert shaped_rate("unlimited", 4.0) == "unlimited"


@pytest.mark.slow
def test_a_capped_transport_costs_each_byte_the_link_and_itself_in_series() -> None:
    """gRPC's cap: near the line rate on slow links, the cap's share on fast ones; the emulated link is shaped to it."""
    payload = 1448 / 1514  # TCP payload per wire byte
    assert transport_efficiency("10gbit", None) == 1.0
    assert transport_efficiency("unlimited", "19.3gbit") == 1.0  # nothing to shape
    assert transport_efficiency("10gbit", f"{10 * payload}gbit") == pytest.approx(0.5)  # cap = payload rate: half
    slow, fast = transport_efficiency("200mbit", "2.8gbit"), transport_efficiency("5gbit", "2.8gbit")
    assert slow == pytest.approx(1 / (1 + 0.2 * payload / 2.8))
    assert slow > 0.93 and fast < 0.4  # a factor fixed over rates could not give both
    cfg = load(["cluster=emulated", "strategy=dtf", "network.rate=1gbit", "strategy.transport_cap=1gbit"])
    efficiency = 1 / (1 + payload)
    assert emulated_rate(cfg) == f"{1e9 * efficiency:.0f}bit"
    dilated = load(
        ["cluster=emulated", "strategy=dtf", "network.rate=1gbit", "strategy.transport_cap=1gbit", "dilation.factor=4"]
    )
    assert emulated_rate(dilated) == f"{1e9 * efficiency / 4:.0f}bit"
    with pytest.raises(ConfigError, match="strategy.transport_cap"):
        load(["strategy=dtf", "strategy.transport_cap=fast"])
    with pytest.raises(ConfigError, match="strategy.transport_cap"):
        load(["strategy=dtf", "strategy.transport_cap=0gbit"])


@pytest.mark.slow
def test_dilation_settings_are_checked() -> None:
    for factor in ("0", "-0.5", "inf"):
        with pytest.raises(ConfigError, match=rf"dilation.factor={factor}.*\(0, inf\).*0 < D < 1.*0\.125"):
            load([f"dilation.factor={factor}"])
    for factor in (0.5, 0.25, 0.125, 3):  # time compressed (D < 1) or dilated
        assert load([f"dilation.factor={factor}"]).dilation.factor == factor
    with pytest.raises(ConfigError, match=r"dilation.mode='fast'.*real, modelled"):
        load(["dilation.mode=fast"])
    with pytest.raises(ConfigError, match=r"dilation.factor='fast'.*auto"):
        load(["dilation.factor=fast"])
    with pytest.raises(ConfigError, match=r"dilation.compute_batch_size=2 applies to mode real only"):
        load(["dilation.mode=modelled", "dilation.compute_batch_size=2"])
    with pytest.raises(ConfigError, match=r"dilation.compute_image_size=512 .*train.image_size"):
        load(["dilation.compute_image_size=512", "train.image_size=64"])
    assert load(["dilation.factor=auto"]).dilation.factor == "auto"
    with pytest.raises(ConfigError, match=r"dilation.target='tpu'.*v100"):
        load(["dilation.target=tpu"])
    assert load([]).dilation.factor is None


@pytest.mark.slow
def test_targets_price_the_worker_and_ps_device_batches_at_the_factor() -> None:
    overrides = ["model=resnet18", "train.image_size=32", "train.batch_size=2", "strategy=ralp_n", "cluster.gpus=3"]
    one, four = (load([*overrides, f"dilation.factor={d}"]) for d in (1, 4))
    topo = of_strategy(one.strategy, one.cluster.gpus)
    t1, t4 = dilation.targets(one, topo), dilation.targets(four, topo)
    assert t1 is not None and t4 is not None and t1.device == "v100"
    assert len(t1.fwd_s[WORKER]) == len(models.model_units("resnet18", 1000, 0.5, "meta"))
    assert t4.fwd_s[WORKER] == pytest.approx([4 * s for s in t1.fwd_s[WORKER]])
    assert t4.update_s_per_byte == pytest.approx(4 * t1.update_s_per_byte)
    assert t4.update_s_fixed == pytest.approx(4 * t1.update_s_fixed) and t1.update_s_fixed > 0  # kernel launches
    assert t1.aggregate_s_fixed == pytest.approx(dilation.device_entry("v100").launch_overhead_us * 1e-6)  # one add
    a100 = dilation.targets(load([*overrides, "dilation.factor=1", "dilation.target=a100"]), topo)
    assert a100 is not None and a100.device == "a100" and sum(a100.fwd_s[WORKER]) < sum(t1.fwd_s[WORKER])
    # the `device` group keys modelled profiles, not the dilation's target
    assert dilation.targets(load([*overrides, "dilation.factor=1", "device.memory_gbps=1"]), topo) == t1
    assert sum(t1.fwd_s[PS_DEVICE_BATCH]) > sum(t1.fwd_s[WORKER])  # two workers' batches on the PS device
    assert dilation.targets(load(overrides), topo) is None


@pytest.mark.slow
def test_a_dtf_ps_task_pads_to_its_cpus_applies_and_rpcs() -> None:
    """With TensorFlow's PS costs given, a `dtf` server's reduce of N sets and its step pad to N applies, each with
    its two RPCs: (N - 1) x (rpc + apply x bytes) + (rpc + apply x bytes)."""
    overrides = ["model=resnet18", "train.image_size=32", "train.batch_size=2", "strategy=dtf", "cluster.gpus=2"]
    base = load([*overrides, "dilation.factor=4", "strategy.ps_apply_ns_per_byte=null", "strategy.rpc_us_per_tensor=0"])
    cpu = load([*overrides, "dilation.factor=4", "strategy.ps_apply_ns_per_byte=2", "strategy.rpc_us_per_tensor=50"])
    topo = of_strategy(cpu.strategy, cpu.cluster.gpus)
    profiled, on_cpu = dilation.targets(base, topo), dilation.targets(cpu, topo)
    assert profiled is not None and on_cpu is not None
    assert on_cpu.fwd_s == profiled.fwd_s  # the workers' compute is the device's still
    pacer = Pacer(on_cpu, lambda: 0.0)
    n, size = 3, 1000
    assert pacer.aggregate_s(size, n) + pacer.update_s(size) == pytest.approx(n * 4 * (100e-6 + 2e-9 * size))
    rpc_only = load(
        [*overrides, "dilation.factor=4", "strategy.ps_apply_ns_per_byte=null", "strategy.rpc_us_per_tensor=50"]
    )
    padded = dilation.targets(rpc_only, topo)
    assert padded is not None and padded.update_s_per_byte == profiled.update_s_per_byte
    assert padded.update_s_fixed == pytest.approx(profiled.update_s_fixed + 4 * 100e-6)
    with pytest.raises(ConfigError, match="strategy.ps_apply_ns_per_byte"):
        load(["strategy=dtf", "strategy.ps_apply_ns_per_byte=0"])


@pytest.mark.slow
def test_the_peer_harness_runs_dtf_with_the_ps_costs_of_its_record() -> None:
    """The harness's `dtf` overrides are the PS-cost record's fits (the shipped dtf.yaml leaves them off), and compose."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("ps_cpu", root / "benchmarks/peers/ps_cpu.py")
    assert spec is not None and spec.loader is not None
    ps_cpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ps_cpu)
    record = root / "docs/records/peers-ps-cpu.json"
    fits = json.loads(record.read_text())["figures"]["fits"]
    strategy = load(["strategy=dtf", *ps_cpu.overrides_of_record(record)]).strategy
    assert strategy.ps_apply_ns_per_byte == pytest.approx(fits["apply_momentum"]["s_per_byte"] * 1e9, rel=5e-3)
    assert strategy.rpc_us_per_tensor == pytest.approx(fits["recv_tensor"]["s_per_tensor"] * 1e6, rel=5e-3)
    shipped = load(["strategy=dtf"]).strategy
    assert shipped.ps_apply_ns_per_byte is None and shipped.rpc_us_per_tensor == 0


# Distributed: each strategy undilated, at D and at 2D, on one set of spawned gloo ranks.
CASES = [("allreduce", 2), ("ps", 2), ("ralp_n", 3)]
FACTORS = (None, 2.0, 4.0)


def _tiny() -> list[models.Unit]:
    torch.manual_seed(0)
    return [
        models.Unit("conv0", nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True))),
        models.Unit("pool0", nn.MaxPool2d(2)),
        models.Unit("conv1", nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True))),
        models.Unit("flatten", nn.Flatten(1)),
        models.Unit("fc0", nn.Sequential(nn.Linear(8 * 8 * 8, 32), nn.ReLU(inplace=True))),
        models.Unit("fc1", nn.Linear(32, CLASSES)),
    ]


def _run(rank: int, strategy: str, gpus: int, factor: float | None, group: dist.ProcessGroup) -> dict:
    topo = topology(strategy, gpus, 1)
    units = _tiny()
    comm = Comm(rank, topo.world_size, "gloo", group)
    targets = None if factor is None else _targets(factor, len(units), UNIT_S, UNIT_S, 1e-9)
    pacer = None if targets is None else Pacer(targets, lambda: comm.wait_s)
    setup = StepSetup(
        topo, comm, units, 4, Optim(0.05, 0.9, 0.0), torch.device("cpu"), BATCH, IMAGE, pacer=pacer, bucket_mb=0.02
    )
    engine = build(setup)
    gen = torch.Generator().manual_seed(3)
    steps, sent = [], []
    for _ in range(STEPS):
        images = torch.randn(2 * BATCH, 3, IMAGE, IMAGE, generator=gen)
        labels = torch.randint(0, CLASSES, (2 * BATCH,), generator=gen)
        batch = None
        if rank in topo.workers:
            mine = slice(topo.workers.index(rank) * BATCH, (topo.workers.index(rank) + 1) * BATCH)
            batch = (images[mine], labels[mine])
        began = time.perf_counter()
        engine.step(batch)
        engine.finish()
        steps.append(time.perf_counter() - began)
        sent.append(comm.take().bytes_by_category)
    comm.barrier()
    return {"state": engine.state(), "steps": steps, "sent": sent, "role": topo.role(rank)}


def _rank(rank: int, world: int) -> dict:
    groups = {n: dist.new_group(list(range(n))) for n in (2, 3)}
    out = {}
    for strategy, gpus in CASES:
        size = topology(strategy, gpus, 1).world_size
        for factor in FACTORS:
            if rank < size:
                out[(strategy, factor)] = _run(rank, strategy, gpus, factor, groups[size])
            dist.barrier()
    return out


@pytest.fixture(scope="module")
def dilated() -> list[dict]:
    return spawn_function(_rank, 3, timeout_s=240)


def _params(per_rank: list[dict], key: tuple) -> dict[str, torch.Tensor]:
    pieces: list[Piece] = [p for r in per_rank if key in r for p in r[key]["state"]]
    return assemble(pieces)


@pytest.mark.slow  # the module fixture spawns 3 gloo ranks (~40 s here)
@pytest.mark.parametrize("strategy,gpus", CASES)
def test_dilated_runs_train_the_same_parameters_and_move_the_same_bytes(
    strategy: str, gpus: int, dilated: list[dict]
) -> None:
    plain = _params(dilated, (strategy, None))
    for factor in FACTORS[1:]:
        got = _params(dilated, (strategy, factor))
        assert got.keys() == plain.keys()
        for name in plain:
            assert torch.equal(got[name], plain[name]), f"{strategy} D={factor}: {name} differs"
        for rank in dilated:
            if (strategy, factor) in rank:
                assert rank[(strategy, factor)]["sent"] == rank[(strategy, None)]["sent"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy,gpus", CASES)
def test_dilated_step_time_follows_the_factor(strategy: str, gpus: int, dilated: list[dict]) -> None:
    worker = dilated[0]  # rank 0 is a worker of every strategy
    units = len(_tiny())
    part = 4 if strategy == "ralp_n" else units  # a RALP worker runs the units below the split
    at = {f: statistics.median(worker[(strategy, f)]["steps"]) for f in FACTORS[1:]}
    for factor, step in at.items():
        assert step >= factor * UNIT_S * 2 * part  # every unit's forward and backward, padded
    assert 1.4 < at[4.0] / at[2.0] < 2.6, at  # loosely: the machine is shared


@pytest.mark.slow  # a train subprocess
def test_a_dilated_run_records_its_target_figures_and_overruns(tmp_path: Path) -> None:
    factor = 8.0
    overrides = ["cluster=local", "model=resnet18", "strategy=allreduce", "cluster.gpus=2", "dataset.num_classes=10"]
    overrides += ["train.image_size=32", "train.batch_size=2", "train.warmup_steps=1", "train.measure_steps=2"]
    overrides += ["train.loader=synthetic", f"dilation.factor={factor}"]
    metrics = train_metrics(tmp_path / "run", overrides)
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    measured = steps[steps["phase"] == "measure"]
    assert metrics["target_images_per_sec"] == pytest.approx(metrics["images_per_sec"] * factor)
    record = metrics["dilation"]
    assert record["factor"] == factor and record["mode"] == "real" and record["target_device"] == "v100"
    assert record["target_link_rate"] == record["shaped_link_rate"] == "unlimited"
    assert record["overruns"] == int(measured["overruns"].sum())
    cfg = load(overrides)
    targets = dilation.targets(cfg, of_strategy(cfg.strategy, cfg.cluster.gpus))
    assert targets is not None
    params = models.parameter_count(nn.Sequential(*(u.module for u in models.model_units("resnet18", 10, 0.5, "meta"))))
    padded = sum(targets.fwd_s[WORKER]) + sum(targets.bwd_s[WORKER]) + Pacer(targets, lambda: 0.0).update_s(4 * params)
    assert metrics["step_time_s"] >= padded  # every unit's forward and backward and the update waited for


@pytest.mark.slow
def test_tables_carry_target_equivalent_then_measured_figures_and_flag_overruns(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2,), repeats=3)
    factor = 8.0
    for k, run in enumerate(runs):
        dilate(run, factor, overruns=2 if k == 0 else 0)  # the first repeat of ps overran twice
    measured = {str(run): json.loads((run / "metrics.json").read_text())["images_per_sec"] for run in runs}
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
    repeats, rows = tables.repeats, tables.runs.set_index("strategy")
    wall_clock = [measured[str(tmp_path / "runs" / run)] for run in repeats["run"]]
    assert list(repeats["emulator_images_per_sec"]) == pytest.approx(wall_clock)
    assert list(repeats["images_per_sec"]) == pytest.approx([factor * m for m in wall_clock])
    for strategy, row in rows.iterrows():
        assert row.images_per_sec == pytest.approx(row.emulator_images_per_sec * factor)
        assert row.images_per_sec_ci_low == pytest.approx(row.emulator_images_per_sec_ci_low * factor)
        assert row.images_per_sec_ci_high == pytest.approx(row.emulator_images_per_sec_ci_high * factor)
        assert (row.dilation_factor, row.dilation_mode, row.target_device, row.target_link_rate) == (
            factor,
            "real",
            "v100",
            "1gbit",
        )
        assert row.overruns == (2 if strategy == "ps" else 0)
    assert tables.speedups.set_index("strategy").loc["ps", "overruns"] == 2
    assert list(tables.breakdown["overruns"]) == [2 if run.endswith("/ps/r0") else 0 for run in tables.breakdown.run]
    assert "dilated emulation of v100 on 1gbit, D=8; 2 overruns, up to 0 ms late at a step's end)" in tables.summary
    assert tables.summary.count("dilated emulation of v100 on 1gbit") == len(rows)
    for run in load_records(runs, [tmp_path / "plans"]):
        check_record(run)  # verify recomputes them from the step records


@pytest.mark.slow
def test_speedups_compare_target_equivalent_figures_when_auto_chose_another_factor_per_strategy(
    tmp_path: Path,
) -> None:
    """`dilation.factor=auto` picks D per run (allreduce's ring check needs a larger one): a speedup over a baseline
    run at another D is the ratio of target-equivalent images/sec, never of the measured ones."""
    runs = write_results(tmp_path, models=("vgg11",), gpus=(4,), repeats=2)
    factors = {"ps": 2.0, "allreduce": 16.0, "ralp_h": 4.0, "ralp_n": 4.0}
    for run in runs:
        dilate(run, factors[run.parent.name], overruns=0)
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
    rows, speed = tables.runs.set_index("strategy"), tables.speedups.set_index("strategy")
    for strategy, row in rows.iterrows():
        for baseline in ("ps", "allreduce"):
            target = row.images_per_sec / rows.loc[baseline, "images_per_sec"]
            assert row[f"speedup_vs_{baseline}"] == pytest.approx(target), (strategy, baseline)
            assert speed.loc[strategy, f"{baseline}_images_per_sec"] == pytest.approx(
                rows.loc[baseline, "images_per_sec"]
            )
        assert speed.loc[strategy, "images_per_sec"] == pytest.approx(row.emulator_images_per_sec * factors[strategy])
        assert speed.loc[strategy, "emulator_images_per_sec"] == pytest.approx(row.emulator_images_per_sec)
    measured = rows.loc["ralp_n", "emulator_images_per_sec"] / rows.loc["allreduce", "emulator_images_per_sec"]
    assert rows.loc["ralp_n", "speedup_vs_allreduce"] == pytest.approx(measured * 4.0 / 16.0)
    for run in load_records(runs, [tmp_path / "plans"]):
        check_record(run)


@pytest.mark.slow
def test_throughput_scaling_and_breakdown_draw_target_equivalent_figures_across_factors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a factor per run, measured images/sec and seconds lie on D different scales: the throughput, scaling
    and breakdown plots draw the target-equivalent figures (and say so), as the speedups compare them."""
    runs = write_results(tmp_path, models=("vgg11",), strategies=("ps",), gpus=(2, 4), repeats=2)
    runs += write_results(tmp_path, models=("vgg11",), strategies=("allreduce",), gpus=(1,), repeats=2)
    factors = {1: 2.0, 2: 4.0, 4: 16.0}  # by N
    for run in runs:
        dilate(run, factors[int(run.parent.parent.name.split("-")[0][1:])], overruns=0)
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
    rows = tables.runs.set_index(["strategy", "gpus"])
    figures: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    plots.throughput_vs_n(tables, Path("unused.png"))
    plots.scaling_efficiency(tables, Path("unused.png"))
    throughput, efficiency = (figure.axes[0] for figure in figures)
    [ps] = [c.lines[0] for c in throughput.containers if c.get_label() == "ps @ 1gbit"]
    target = [rows.loc[("ps", n), "emulator_images_per_sec"] * factors[n] for n in (2, 4)]
    assert list(ps.get_ydata()) == pytest.approx(target)
    assert figures[0].get_suptitle() == f"time-dilated runs: {plots.TARGET_IMAGES}"
    reference = rows.loc[("allreduce", 1), "emulator_images_per_sec"] * factors[1]
    [ideal] = [line for line in throughput.lines if line.get_label() == "ideal: N x single device"]
    assert list(ideal.get_ydata()) == pytest.approx([reference, 4 * reference])
    [scaled] = [c.lines[0] for c in efficiency.containers if c.get_label() == "ps @ 1gbit"]
    assert list(scaled.get_ydata()) == pytest.approx([t / (n * reference) for t, n in zip(target, (2, 4))])
    # the breakdown: each run's seconds / its D, then the mean over repeats; N=1, 2, 4 in one panel
    runs_by_n = tables.breakdown.assign(
        target_step=tables.breakdown["step_time_s"] / tables.breakdown["dilation_factor"]
    )
    want = runs_by_n.groupby("gpus")["target_step"].mean()
    plots.breakdown(tables, Path("unused.png"))
    [panel] = figures[-1].axes
    stacks = [
        c for c in panel.containers if isinstance(c, BarContainer) and c.get_label() in plots.PART_LABELS.values()
    ]
    assert list(np.sum([[bar.get_height() for bar in c] for c in stacks], axis=0)) == pytest.approx(list(want))
    assert figures[-1].get_suptitle() == "time-dilated runs: the target's seconds (measured / D)"
    assert "Time-dilated runs: the target's seconds, as measured / D." in tables.summary
    plt.close("all")


@pytest.mark.slow
def test_undilated_tables_show_the_measured_figures_as_the_target_s(tmp_path: Path) -> None:
    """D = 1: the target's images/sec is the measured figure, the emulator's the same; no dilated column in summary.md."""
    tables = build_tables(load_records(write_results(tmp_path, models=("vgg11",), gpus=(2,)), [tmp_path / "plans"]))
    runs = tables.runs
    assert list(runs["images_per_sec"]) == list(runs["emulator_images_per_sec"]) and (runs["overruns"] == 0).all()
    assert runs["dilation_factor"].isna().all() and "dilated emulation" not in tables.summary
    assert "target-equivalent" not in tables.summary and "wall clock" not in tables.summary


def test_verify_refuses_a_target_figure_or_overruns_its_steps_do_not_give(tmp_path: Path) -> None:
    run = write_results(tmp_path, models=("vgg11",), strategies=("ps",), gpus=(2,))[0]
    dilate(run, 4.0, overruns=1)
    doc = json.loads((run / "metrics.json").read_text())
    for field, forged in (
        ("target_images_per_sec", doc["images_per_sec"] * 5.0),
        ("dilation", {**doc["dilation"], "overruns": 0}),
    ):
        (run / "metrics.json").write_text(json.dumps({**doc, field: forged}))
        with pytest.raises(BundleRefused, match=field):
            check_record(load_records([run], [tmp_path / "plans"])[0])


@pytest.mark.slow
def test_emulated_links_of_a_dilated_run_are_shaped_to_rate_over_d(tmp_path: Path, monkeypatch) -> None:
    from ralp_pipe.engine import train
    from ralp_pipe.errors import RunFailure
    from ralp_pipe.runtime import emulated

    shaped = []

    def sites(hosts: list[int], rate: str, burst: str, shared: object = None) -> None:
        shaped.append(rate)
        raise RunFailure("stopped before any rank starts")

    monkeypatch.setattr(emulated, "emulated_sites", sites)
    for factor, rate in ((None, "1gbit"), (4.0, "250000000bit")):
        cfg = load(["cluster=emulated", "network=1gbit", "strategy=allreduce", "cluster.gpus=2"])
        cfg.dilation.factor = factor
        topo = of_strategy(cfg.strategy, cfg.cluster.gpus)
        with pytest.raises(RunFailure):
            train._launch(cfg, topo, tmp_path, train.Ranks(None, None, ("cpu", "gloo")))
        assert shaped[-1] == rate


def test_auto_is_refused_on_links_a_concurrent_workload_shaped(tmp_path: Path) -> None:
    from ralp_pipe.engine import train

    cfg = load(["cluster=emulated", "network=1gbit", "strategy=allreduce", "cluster.gpus=2", "dilation.factor=auto"])
    with pytest.raises(ConfigError, match=r"--shared-hosts.*dilation.factor=auto"):
        train.run(cfg, tmp_path / "run", shared=[{"host": 0}])


@pytest.mark.slow
def test_a_link_check_is_refused_where_the_run_does_not_choose_its_factor_from_the_links(tmp_path: Path) -> None:
    from ralp_pipe.engine import train

    check = tmp_path / "check.json"
    for extra, named in (("dilation.factor=8", "dilation.factor=8"), ("dilation.mode=real", "dilation.mode=real")):
        cfg = load(
            ["cluster=emulated", "network=1gbit", "strategy=ps", "cluster.gpus=2", "dilation.factor=auto", extra]
        )
        with pytest.raises(ConfigError, match=rf"--link-check {check}.*{named}.*leave --link-check out"):
            train.run(cfg, tmp_path / "run", link_check=check)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_concurrent_workload_shapes_its_links_at_rate_over_d_and_refuses_mixed_factors(
    tmp_path: Path, monkeypatch
) -> None:
    from ralp_pipe.runtime import concurrent_jobs

    shaped = []

    class Cluster:
        def __init__(self, hosts: int, rate: str, burst: str) -> None:
            shaped.append(rate)
            raise RuntimeError("stopped before any job starts")

    monkeypatch.setattr(concurrent_jobs, "EmulatedCluster", Cluster)
    common = ["network=1gbit", "dilation.factor=4", "dilation.mode=modelled"]
    jobs = [["strategy=ps", "cluster.gpus=2"], ["strategy=ralp_n", "cluster.gpus=2"]]
    with pytest.raises(RuntimeError, match="stopped"):
        concurrent_jobs.run_concurrent(jobs, common, tmp_path)
    assert shaped == ["250000000bit"]
    with pytest.raises(ConfigError, match=r"different networks"):
        concurrent_jobs.run_concurrent([jobs[0], [*jobs[1], "dilation.factor=2"]], common[:1], tmp_path)


def test_the_workflow_passes_dilation_overrides_to_its_stages() -> None:
    from ralp_pipe.workflow.matrix import parse_settings

    settings = parse_settings({"experiment": "smoke", "overrides": ["dilation.factor=8"]})
    assert "dilation.factor=8" in settings.overrides
