"""`ralp-pipe train --out DIR [--shards DIR] [--plan FILE] <overrides>`: one distributed training measurement.

The command (the *driver*) checks the prepared shards a shard loader will read, resolves the
config, checks the plan against the run (model, dataset, class count, image size, batch, N and
strategy), the split point and the analytic bytes per step (from placement units on the meta
device, so no parameters are allocated), locks --out against other drivers, starts the
ranks of :mod:`ralp_pipe.engine.rank` (``cluster.kind``: local subprocesses, emulated-network
hosts, or srun tasks) and, once every rank succeeded, writes DIR/steps.parquet and the
:class:`~ralp_pipe.contract.records.RunMetrics` record DIR/metrics.json atomically (file names
from :mod:`ralp_pipe.contract.layout`). On any failure nothing is written and the command
raises :class:`~ralp_pipe.errors.RunFailure` naming the failing rank. Under ``srun`` with one
task per rank the command is itself a rank and rank 0 writes the files. Before the ranks start,
the driver prints where rank 0's log is: rank 0 logs its progress there while it trains.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import math
import os
import shutil
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import torch

from ralp_pipe.atomic import atomic_path, write_json_atomic
from ralp_pipe.config import AUTO_FACTOR, Config, cluster_kind, digest, load, made_for, strategy_kind, to_dict
from ralp_pipe.config.dilation import computes_for_real, emulated_rate, fixed_factor, transport_efficiency
from ralp_pipe.config.schema import MODELLED, REAL
from ralp_pipe.config.units import rate_bits_per_s
from ralp_pipe.contract.layout import METRICS_FILE, STEPS_FILE
from ralp_pipe.contract.records import Plan, RunMetrics
from ralp_pipe.contract.topology import PS, WORKER, Topology, links_of, placement
from ralp_pipe.data.loaders import reads_shards, shard_files
from ralp_pipe.data.shards import check_shards, damage_named, output_dir, read_manifest
from ralp_pipe.engine import dilation, models, volume
from ralp_pipe.engine.metrics import link_rate, summarize, target_equivalent
from ralp_pipe.engine.rank import BACKEND_ENV, DEVICE_ENV, RankResult, rank_command, run_rank
from ralp_pipe.engine.strategies.allreduce import ddp_buckets
from ralp_pipe.engine.strategies.base import bucket_elements, plan_buckets, receive_elements
from ralp_pipe.engine.strategies.dtf import GREEDY, variable_buckets
from ralp_pipe.errors import ConfigError, DataError, RunFailure, os_problem
from ralp_pipe.locks import LockHeld, exclusive
from ralp_pipe.runtime import devices, hardware
from ralp_pipe.runtime.launch import RankEnv, in_slurm_step, launch_local, launch_slurm, rank_log, srun_log
from ralp_pipe.runtime.nodes import node_of_ranks

# what this stage and its ranks read of the config (a key covers those below it)
CONFIG_KEYS = ("dataset", "model", "strategy", "cluster", "interconnect", "network", "train", "dilation", "paths")
LOCK_SUFFIX = ".lock"  # .NAME.lock next to --out: held by the driver writing it, removed when it ends
STAGING_INFIX = ".ranks-"  # a run's staging folder (rank logs, rank 0's result) is .NAME.ranks-<random> next to --out
DRIVER_FILE = "driver.json"  # in the staging folder: host, PID and start time of the driver that owns it
UNCLAIMED_STALE_S = 60.0  # a staging folder without DRIVER_FILE (written right after it is made) is stale after this
PREVIOUS_FOLDER = ".previous"  # in --out: an earlier run's records, set aside while a rerun runs
MIN_FREE_BYTES = 16 * 2**20  # free space a run needs at least, for its records, rank logs and temporary copies
ROW_BYTES = 1024  # one step record as JSON in the rank result, in steps.parquet and in their temporary copies
FULL_BYTES = 2**20  # a filesystem with less free space is full for the ranks' logs
RANK_BASE_BYTES = 500_000_000  # memory of one rank before its model: interpreter, torch, gloo buffers
PARAMETER_COPIES = 3  # a rank that updates its parameters holds them, their gradients and momentum (rank_memory)
CALIBRATION_WARMUP, CALIBRATION_STEPS = 2, 3  # dilation.factor=auto, real mode: steps before and while measuring
# What a plan was made for (Plan fields, as config.made_for names them) -> the config key of the run
PLAN_KEYS = {
    "model": "model.name",
    "dataset": "dataset.name",
    "num_classes": "dataset.num_classes",
    "image_size": "train.image_size",
    "batch_size": "train.batch_size",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe train`."""
    parser.add_argument("--out", required=True, type=Path, help=f"run folder for {METRICS_FILE} and {STEPS_FILE}")
    parser.add_argument(
        "--shards",
        type=Path,
        metavar="DIR",
        help="prepared shards a dali or torchvision loader reads "
        "(default: where `ralp-pipe prepare-shards` writes the configured dataset)",
    )
    parser.add_argument(
        "--plan", type=Path, metavar="FILE", help="plan from `ralp-pipe plan` (sets strategy.plan): the RALP split"
    )
    parser.add_argument(
        "--shared-hosts",
        type=shared_hosts,
        metavar="JSON",
        help="where each rank runs on an emulated cluster shared with other jobs (given by `ralp-pipe concurrent`)",
    )
    parser.add_argument(
        "--link-check",
        type=Path,
        metavar="FILE",
        help="the factor `ralp-pipe check-links` chose for this run's hosts (dilation.factor=auto, modelled mode), "
        "instead of measuring the links before the run",
    )


def shared_hosts(text: str) -> list[dict[str, Any]]:
    """--shared-hosts: a JSON list, one object per rank (:meth:`ralp_pipe.runtime.emulated.EmulatedCluster.share`)."""
    placed = json.loads(text)
    if not isinstance(placed, list) or not all(isinstance(rank, dict) for rank in placed):
        raise ValueError("not a JSON list of objects")
    return placed


def main(args: argparse.Namespace) -> int:
    """Run one training measurement and report its throughput."""
    marks = {"started": _started_at(), "imported": time.time()}
    cfg = with_plan(load(args.overrides), args.plan)
    metrics = run(cfg, args.out, args.shards, args.shared_hosts, args.link_check, marks)
    if metrics is not None:
        print(
            f"{metrics.strategy} {metrics.model} N={metrics.gpus}: {metrics.images_per_sec:.2f} images/s, "
            f"{metrics.gb_per_step['total']:.4f} GB/step -> {args.out}"
        )
    return 0


def with_plan(cfg: Config, plan: Path | None) -> Config:
    """`cfg` with strategy.plan set to --plan `plan` (where given); a strategy.plan naming another file is refused."""
    if plan is None:
        return cfg
    if cfg.strategy.plan and Path(cfg.strategy.plan) != plan:
        raise ConfigError(
            f"--plan {plan} and strategy.plan={cfg.strategy.plan} name different plans: give the run one of them"
        )
    return dataclasses.replace(cfg, strategy=dataclasses.replace(cfg.strategy, plan=str(plan)))


def resolve_split(cfg: Config, units: list[models.Unit]) -> int | None:
    """RALP split point: `strategy.split`, else the plan file's, else the default; None for ps/allreduce.

    A plan is checked against the run whatever its strategy (:func:`plan_entry`).
    """
    name = cfg.strategy.name
    entry = plan_entry(cfg)
    if not strategy_kind(name).places_layers:
        return None
    if cfg.strategy.split is not None:
        split, source = cfg.strategy.split, "strategy.split"
    elif entry is not None:
        split, source = _plan_split(entry, Path(str(cfg.strategy.plan)), name), f"plan {cfg.strategy.plan}"
    else:
        return models.default_split(units)
    return models.check_split(split, len(units), f"{source}, model {cfg.model.name}")


def plan_entry(cfg: Config) -> dict[str, Any] | None:
    """The entry of the run's strategy at its N in the plan `strategy.plan` (None without a plan).

    The plan must have been made for this run: every field it holds of model, dataset, class
    count, image size and batch equal to the run's, N among the GPU counts it planned (`by_gpus`,
    else its `gpus`) and an entry for the strategy there; otherwise a ConfigError names the file,
    the key and both values.
    """
    if not cfg.strategy.plan:
        return None
    path = Path(cfg.strategy.plan)
    plan = Plan.read(path)
    wanted = made_for(cfg)
    for field, key in PLAN_KEYS.items():
        held = getattr(plan, field)
        if held is not None and held != wanted[field]:
            raise _plan_mismatch(path, f"{field}={held!r}", f"{key}={wanted[field]!r}")
    gpus, name = cfg.cluster.gpus, cfg.strategy.name
    if plan.by_gpus:
        if str(gpus) not in plan.by_gpus:
            planned = ", ".join(sorted(plan.by_gpus, key=int))
            raise _plan_mismatch(path, f"by_gpus for N={planned}", f"cluster.gpus={gpus}")
        entries = plan.by_gpus[str(gpus)]
    elif plan.gpus is not None and plan.gpus != gpus:
        raise _plan_mismatch(path, f"gpus={plan.gpus}", f"cluster.gpus={gpus}")
    else:
        entries = plan.strategies
    if not isinstance(entries, dict):
        raise DataError(f"plan {path} has no table of strategies at N={gpus}: regenerate it with `ralp-pipe plan`")
    if name not in entries:
        raise _plan_mismatch(path, f"strategies {sorted(entries)} at N={gpus}", f"strategy.name={name!r}")
    entry: dict[str, Any] = entries[name]
    return entry


def _plan_mismatch(path: Path, held: str, wanted: str) -> ConfigError:
    return ConfigError(
        f"plan {path} has {held} but this run has {wanted}: give the run the plan made for it "
        f"(`ralp-pipe plan` with the run's overrides)"
    )


def _plan_split(entry: Any, path: Path, strategy: str) -> int:
    split = entry.get("split") if isinstance(entry, dict) else None
    if not isinstance(split, int) or isinstance(split, bool):
        raise DataError(
            f"plan {path} has no integer strategies.{strategy}.split (found {split!r}): "
            f"regenerate it with `ralp-pipe plan`"
        )
    return split


def meta_units(cfg: Config) -> list[models.Unit]:
    """The model's placement units on the meta device: shapes and parameter counts only, no memory, no initialisation."""
    return models.model_units(cfg.model.name, cfg.dataset.num_classes, cfg.model.dropout, "meta")


def split_and_bytes(
    cfg: Config, topo: Topology, units: list[models.Unit] | None = None
) -> tuple[int | None, dict[str, int]]:
    """The run's split point and analytic bytes per step, from placement units on the meta device (`units` if given)."""
    t = cfg.train
    units = meta_units(cfg) if units is None else units
    with torch.device("meta"):  # the activation shapes too
        split = resolve_split(cfg, units)
        return split, volume.step_bytes(topo.strategy, units, split, topo, t.batch_size, t.image_size)


@dataclasses.dataclass(frozen=True)
class Measured:
    """What a run produced: the driver's split and analytic bytes per step, rank 0's result, where
    ``dilation.factor=auto`` chose the factor, how (:func:`resolve_auto`), and when the driver's phases ended
    (:func:`run`'s `marks`)."""

    split: int | None
    analytic: dict[str, int]
    result: RankResult
    calibration: dict[str, Any] | None
    marks: dict[str, float] = dataclasses.field(default_factory=dict)


def resolve_auto(
    cfg: Config, topo: Topology, staging: Path, ranks: Ranks, link_check: Path | None = None
) -> tuple[Config, Ranks, dict[str, Any] | None]:
    """`cfg` and `ranks` with ``dilation.factor=auto`` resolved, and how it was (None when the factor was given).

    Real mode: the ranks run :data:`CALIBRATION_STEPS` steps after a warm-up, undilated and all at once on
    their hosts, measuring every unit's time against its target time; D = ``dilation.margin`` x the largest
    ratio (:func:`ralp_pipe.engine.dilation.auto_factor`). Modelled mode: D is the smallest at which the
    emulated links deliver ``dilation.link_accuracy`` of network.rate / D and gloo's own traffic across the run's
    hosts (its all-reduce ring, or a parameter server's incast and fan-out) reaches that share of their payload
    rate at twice it (:func:`ralp_pipe.runtime.linkcheck.accurate_factor`); with `link_check`, the choice
    ``ralp-pipe check-links`` recorded there for the run's hosts, instead of measuring again.
    """
    d = cfg.dilation
    if d.factor != AUTO_FACTOR:
        return cfg, ranks, None
    if cfg.dilation.mode == REAL:
        measuring = dilation.targets(cfg, topo, factor=1.0)
        steps = dataclasses.replace(cfg.train, warmup_steps=CALIBRATION_WARMUP, measure_steps=CALIBRATION_STEPS)
        print(
            f"ralp-pipe train: dilation.factor=auto: measuring every unit's time on {topo.world_size} ranks", flush=True
        )
        calibration_staging = staging / "calibration"
        calibration_staging.mkdir()
        result = _launch(
            dataclasses.replace(cfg, train=steps),
            topo,
            calibration_staging,
            dataclasses.replace(ranks, targets=measuring),
            calibrate=True,
        )
        needed = max(result["needed_factor"])
        factor = dilation.auto_factor(needed, d.margin)
        how: dict[str, Any] = {
            "method": "calibration",
            "needed_factor": needed,
            "margin": d.margin,
            "warmup_steps": CALIBRATION_WARMUP,
            "steps": CALIBRATION_STEPS,
        }
    else:
        if cluster_kind(cfg.cluster.kind).launcher != "emulated":
            raise ConfigError(
                f"dilation.factor=auto in mode modelled measures the emulated links at network.rate / D, but "
                f"cluster.kind={cfg.cluster.kind} shapes none: add cluster=emulated, or give dilation.factor a number"
            )
        from ralp_pipe.runtime import linkcheck  # brings up network namespaces: emulated runs only

        if link_check is not None:
            record = linkcheck.recorded_choice(link_check, cfg)
            factor, how = float(record["factor"]), {"method": "links", "link_check": str(link_check), **record}
        else:
            print(
                f"ralp-pipe train: dilation.factor=auto: measuring the emulated links at {cfg.network.rate} / D",
                flush=True,
            )
            choice = linkcheck.run_check(cfg, *links_of(cfg))
            factor, how = choice.factor, {"method": "links", **choice.to_dict()}
    print(f"ralp-pipe train: dilation.factor=auto chose D = {factor:g}", flush=True)
    cfg = dilation.with_factor(cfg, factor)
    return cfg, dataclasses.replace(ranks, targets=dilation.targets(cfg, topo)), how


def transport_record(cfg: Config) -> dict[str, Any] | None:
    """metrics.json's ``transport``: where the strategy's transport has a cap (``strategy.transport_cap``), the
    cap, the share of the link's rate it leaves (:func:`transport_efficiency`) and how the run applied it
    (emulated links shaped to that share of ``network.rate`` / D; elsewhere nothing slows the transfers, so they
    ran at the link's rate); None without a cap."""
    cap = cfg.strategy.transport_cap
    if cap is None:
        return None
    shaped = cluster_kind(cfg.cluster.kind).shapes_links and rate_bits_per_s(cfg.network.rate) is not None
    return {
        "cap": cap,
        "efficiency": transport_efficiency(cfg.network.rate, cap),
        "applied": shaped,
        "how": f"emulated links shaped to {emulated_rate(cfg)}: network.rate x efficiency / D"
        if shaped
        else "not applied: nothing shapes this cluster's links, so transfers ran at the link's own rate",
    }


def _intra_host(cfg: Config, topo: Topology) -> dict[str, Any] | None:
    """metrics.json's ``intra_host`` on emulated hosts of several GPUs (:func:`ralp_pipe.runtime.emulated.intra_host_record`)."""
    if cluster_kind(cfg.cluster.kind).launcher != "emulated":
        return None
    from ralp_pipe.runtime.emulated import intra_host_record

    return intra_host_record(cfg, topo)


def build_metrics(cfg: Config, topo: Topology, measured: Measured) -> RunMetrics:
    """The run's record from the driver's split and analytic bytes and rank 0's result."""
    t, split, analytic, result = cfg.train, measured.split, measured.analytic, measured.result
    figures = summarize(result["rows"], result["window_s"], topo.num_workers, t.batch_size, t.measure_steps)
    wire = result["wire"]
    config = to_dict(cfg)
    link_gbit, link_source = link_rate(
        cfg.network.rate, cfg.cluster.kind, Plan.read(cfg.strategy.plan) if cfg.strategy.plan else None
    )
    return RunMetrics(
        model=cfg.model.name,
        dataset=cfg.dataset.name,
        num_classes=cfg.dataset.num_classes,
        strategy=topo.strategy,
        gpus=topo.gpus,
        workers=topo.num_workers,
        num_ps=len(topo.ps),
        split=split,
        network=cfg.network.name,
        rate=cfg.network.rate,
        link_gbit=None if math.isnan(link_gbit) else link_gbit,
        link_source=link_source,
        batch_size=t.batch_size,
        global_batch=t.batch_size * topo.num_workers,
        image_size=t.image_size,
        warmup_steps=t.warmup_steps,
        measure_steps=t.measure_steps,
        images_per_sec=figures.images_per_sec,
        target_images_per_sec=target_equivalent(figures.images_per_sec, fixed_factor(cfg)),
        dilation=dilation.record(cfg, result, measured.calibration),
        transport=transport_record(cfg),
        intra_host=_intra_host(cfg, topo),
        gate=None if t.gate is None else {"jobs": t.gate_jobs, "tail_steps": max(result["tail_steps"])},
        images_per_step=figures.images_per_step,
        step_time_s=figures.step_time_s,
        window_s=result["window_s"],
        gb_per_step=figures.gb_per_step,
        analytic_gb_per_step={"total": analytic["total"] / 1e9, **{k: analytic[k] / 1e9 for k in volume.CATEGORIES}},
        wire_gb_per_step=None if wire is None else wire["total"],
        wire_per_host=None if wire is None else wire["per_host"],
        world_size=topo.world_size,
        roles=topo.roles,
        hosts=result["hosts"],
        peak_rss_mb=result["peak_rss_mb"],
        timeline={**measured.marks, **result["timeline"], "recorded": time.time()},
        device=result["device"],
        backend=result["backend"],
        loader=t.loader,
        # the ranks' threads and allocator, not this driver's
        hardware={
            **hardware.describe(),
            "torch_threads": min(result["threads"]),
            "malloc_keeps_freed": all(result["keeps_freed"]),
        },
        versions=hardware.versions(),
        git_revision=hardware.git_revision(),
        config_hash=digest(config),
        config=config,
    )


def write_run(out: Path, metrics: RunMetrics, rows: list[dict[str, Any]]) -> None:
    """Write steps.parquet, then metrics.json (the completion marker), each atomically; all or nothing."""
    # pyarrow alone, not pandas (which imports it and much more), imported here: the ranks fork from the command
    # before, and need neither; pandas reads the table back as it read the frame it wrote
    import pyarrow as pa
    import pyarrow.parquet as pq

    steps = pa.BufferOutputStream()
    pq.write_table(steps_table(sorted(rows, key=lambda row: (row["rank"], row["step"]))), steps)
    created = not out.exists()
    writing = out / STEPS_FILE
    try:
        with atomic_path(writing) as tmp:
            tmp.write_bytes(steps.getvalue().to_pybytes())  # Python's I/O gives the errno if it fails
        writing = out / METRICS_FILE
        metrics.write(writing)
    except OSError as exc:
        with contextlib.suppress(OSError):  # steps without metrics.json would be a record of nothing
            (out / STEPS_FILE).unlink(missing_ok=True)
            if created:
                out.rmdir()
        raise RunFailure(
            f"cannot write the run's records to {out}: {os_problem(exc, writing)}; the measurement is lost: "
            f"free space there (or choose another --out) and rerun"
        ) from exc


# the Arrow type (pyarrow's factory) of a column whose values are all of these Python types, None aside, as
# pyarrow.Table.from_pylist infers it
_ARROW_TYPES = {
    frozenset(): "null",
    frozenset({bool}): "bool_",
    frozenset({int}): "int64",
    frozenset({float}): "float64",
    frozenset({int, float}): "float64",
    frozenset({str}): "string",
}


def steps_table(rows: list[dict[str, Any]]) -> Any:
    """The step records `rows` as an Arrow table: ``pyarrow.Table.from_pylist(rows)``, without importing pandas.

    Every pyarrow call that turns Python values into an array first asks whether they are pandas objects, and the
    first such question imports pandas (0.5-1 s of the command's write-out). Its JSON reader does not ask: the rows
    go through it, with the schema ``from_pylist`` would infer (the first row's keys; per column, the Python types
    of its values) given explicitly. Rows it cannot carry (another type, a non-finite number, an integer beyond int64) take ``from_pylist``.
    """
    import pyarrow as pa
    import pyarrow.json as pa_json

    names = list(rows[0]) if rows else []
    types = [frozenset(type(row.get(name)) for row in rows) - {type(None)} for name in names]
    values = [v for row in rows for v in row.values()]
    finite = all(math.isfinite(v) for v in values if isinstance(v, float))
    in_range = all(-(2**63) <= v < 2**63 for v in values if isinstance(v, int))
    if not rows or not finite or not in_range or any(t not in _ARROW_TYPES for t in types):
        return pa.Table.from_pylist(rows)
    schema = pa.schema([(name, getattr(pa, _ARROW_TYPES[t])()) for name, t in zip(names, types)])
    lines = "\n".join(json.dumps({name: row.get(name) for name in names}) for row in rows).encode()
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    return pa_json.read_json(pa.py_buffer(lines), parse_options=options)


def _finish(cfg: Config, topo: Topology, out: Path, measured: Measured) -> RunMetrics:
    metrics = build_metrics(cfg, topo, measured)
    write_run(out, metrics, measured.result["rows"])
    return metrics


def check_host(cfg: Config, topo: Topology, units: list[models.Unit], on_cpu: bool) -> None:
    """Refuse more ranks, or larger batches, than this host's cores and memory can run, when every rank runs here
    (each rank's memory: :func:`rank_memory`)."""
    cores, (memory, bound) = hardware.usable_cores(), hardware.usable_memory()
    t, (batch, image) = cfg.train, dilation.compute_size(cfg)
    keeps = on_cpu and computes_for_real(cfg)  # modelled units keep no activations
    activations = models.activation_bytes(units, image, batch, 2 if t.amp else 4) if keeps else 0
    needs = rank_memory(cfg, topo, units, activations)
    # modelled ranks only wait and move bytes: 9 a core, so N = 16's `ps` (16 workers and a PS) runs on 2 cores, its
    # overruns and stalls saying whether they kept up
    spread = 4 if computes_for_real(cfg) else 9
    by_cores, need = max(2 * spread, spread * cores), sum(b for b, _ in needs)
    if topo.world_size <= by_cores and need <= memory:
        return
    largest, rank = max(needs)
    if largest > memory:
        raise ConfigError(
            f"train.batch_size={t.batch_size} does not fit in this host's {memory / 1e9:.1f} GB of memory ({bound}): "
            f"a rank taking {rank} = {largest / 1e9:.2f} GB for one rank: use a smaller train.batch_size or "
            f"train.image_size"
        )
    problems = []
    if topo.world_size > by_cores:
        problems.append(
            f"at most {by_cores} ranks fit its cores (max({2 * spread}, {spread} x {cores} cores) = {by_cores})"
        )
    if need > memory:
        kinds = Counter(f"{rank_bytes / 1e9:.2f} GB a rank: {what}" for rank_bytes, what in needs)
        ranks = "; ".join(f"{count} x {what}" for what, count in kinds.items())
        problems.append(f"its ranks need {need / 1e9:.1f} GB ({ranks})")
    raise ConfigError(
        f"cluster.gpus={cfg.cluster.gpus} makes {topo.strategy} start {topo.world_size} ranks on this host "
        f"(cluster.kind={cfg.cluster.kind}), which has {cores} CPU cores and {memory / 1e9:.1f} GB of memory "
        f"({bound}): {'; '.join(problems)}: use fewer cluster.gpus"
        f"{' or a smaller train.batch_size' if activations and len(problems) == 1 and need > memory else ''}, "
        f"or cluster=slurm to spread the ranks over nodes"
    )


def rank_memory(cfg: Config, topo: Topology, units: list[models.Unit], activations: int) -> list[tuple[int, str]]:
    """Each rank's memory (bytes, and what they are): a base, its copies of the parameters and, where it computes
    on the CPU, its activations.

    A `ps` worker holds the parameters and their gradients (its PS updates them); other workers and RALP's PS
    device also the optimizer's momentum (:data:`PARAMETER_COPIES`). A modelled worker holds one buffer of its
    largest bucket, which every push leaves from and every pull lands in (`allreduce`: DDP's largest bucket), no
    gradient (its units' are empty) and no momentum (no update runs): its units' own parameters are allocated
    uninitialised and never touched, so they take no memory; a modelled PS device at most one copy of the
    parameters. A PS rank holds its share of the parameters (and, where it computes, their momentum) and every
    worker's gradients of the buckets that may be in flight at once
    (:func:`ralp_pipe.engine.strategies.base.receive_elements`).
    """
    sizes = [p.numel() for u in units for p in u.module.parameters()]
    element = next(p.element_size() for u in units for p in u.module.parameters())
    parameters, name = sum(sizes) * element, cfg.model.name
    modelled = not computes_for_real(cfg)
    kind = strategy_kind(topo.strategy)
    s = cfg.strategy
    buckets = (
        variable_buckets(sizes, topo.ps, s.variable_placement == GREEDY)
        if kind.whole_variables
        else plan_buckets(sizes, topo.ps, bucket_elements(s.bucket_mb, element) if s.overlap else None)
        if kind.has_ps or kind.places_layers  # RALP's workers push to its PS device (its lower units': at most these)
        else []
    )
    needs = []
    for rank, role in enumerate(topo.roles):
        if role == PS:
            mine = [len(b) for b in buckets if b.server == rank]
            held = sum(mine) * element * (1 if modelled else 2)
            inbox = topo.num_workers * receive_elements(mine, s.credit if s.overlap else 0) * element
            what = (
                f"{RANK_BASE_BYTES / 1e9:.1f} GB + {held / 1e9:.2f} GB of its {name} parameters"
                f"{'' if modelled else ' and momentum'} + {inbox / 1e9:.2f} GB of the workers' gradients in flight"
            )
            needs.append((RANK_BASE_BYTES + held + inbox, what))
            continue
        if modelled and role == WORKER:
            params = [p for u in units for p in u.module.parameters()]
            largest = (
                max(len(b) for b in buckets) if buckets else max(sum(p.numel() for p in b) for b in ddp_buckets(params))
            )
            bucket = f"{RANK_BASE_BYTES / 1e9:.1f} GB + one bucket of {largest * element / 1e9:.2f} GB (modelled)"
            needs.append((RANK_BASE_BYTES + largest * element, bucket))
            continue
        copies = 1 if modelled else 2 if role == WORKER and kind.has_ps else PARAMETER_COPIES
        what = (
            f"{RANK_BASE_BYTES / 1e9:.1f} GB + {copies} x {parameters / 1e9:.2f} GB of {name} parameters + "
            f"{activations / 1e9:.2f} GB of activations (train.batch_size={cfg.train.batch_size} at "
            f"train.image_size={cfg.train.image_size})"
        )
        needs.append((RANK_BASE_BYTES + copies * parameters + activations, what))
    return needs


def record_bytes(cfg: Config, topo: Topology) -> int:
    """Free space the run needs next to and in --out: its step records (in several copies), logs and metrics."""
    rows = topo.world_size * (cfg.train.warmup_steps + cfg.train.measure_steps)
    return max(MIN_FREE_BYTES, rows * ROW_BYTES + FULL_BYTES)


def _process_start(pid: int) -> str | None:
    """Start time of process `pid` (clock ticks since boot, /proc/PID/stat field 22), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _started_at() -> float:
    """When this process started, in seconds since the epoch (to a clock tick)."""
    since_boot = int(_process_start(os.getpid()) or 0) / os.sysconf("SC_CLK_TCK")
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + since_boot


def _is_stale(staging: Path) -> bool:
    """True when the driver that made `staging` is gone (a folder no driver claimed counts after a minute)."""
    try:
        owner = json.loads((staging / DRIVER_FILE).read_text())
        host, pid, started = owner["host"], int(owner["pid"]), owner["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return time.time() - staging.lstat().st_mtime > UNCLAIMED_STALE_S
    return host == socket.gethostname() and _process_start(pid) != started


def remove_stale_staging(out: Path) -> None:
    """Remove the staging folders of earlier drivers of `out` that were killed (`.NAME.ranks-*` next to it)."""
    for staging in out.parent.glob(f".{out.name}{STAGING_INFIX}*"):
        if staging.is_dir() and not staging.is_symlink() and _is_stale(staging):
            shutil.rmtree(staging, ignore_errors=True)
            print(f"ralp-pipe train: removed {staging}, left by a driver that was killed")


def _refuse_out(out: Path, problem: str) -> ConfigError:
    return ConfigError(f"--out {out}: {problem}; choose another --out or fix that path")


def _unwritable_out(out: Path, exc: OSError) -> ConfigError:
    """The refusal of --out `out` where making or writing a path of it failed with `exc`."""
    if isinstance(exc, FileExistsError | NotADirectoryError):  # a file where a folder of the path should be
        return _refuse_out(out, f"{os_problem(exc)}: a file stands where a folder of the path should be")
    return _refuse_out(out, f"cannot write there: {os_problem(exc)}")


@contextlib.contextmanager
def out_locked(out: Path) -> Iterator[None]:
    """Hold --out against every other driver until the block ends (lock file .NAME.lock next to it, removed then).

    A second driver of the same --out is refused at once, naming the folder and the driver holding it.
    """
    lock = out.parent / f".{out.name}{LOCK_SUFFIX}"
    with contextlib.ExitStack() as held:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(exclusive(lock))
        except LockHeld as other:
            raise _refuse_out(
                out,
                f"another `ralp-pipe train` (PID {other.holder}) is writing this folder right now (it holds {lock}); "
                f"wait for it to end",
            ) from None
        except OSError as exc:
            raise _unwritable_out(out, exc) from exc
        yield


def make_staging(out: Path, needed: int) -> Path:
    """Check --out before any rank starts and make this run's staging folder next to it, claimed by this driver.

    --out must be a folder (or not exist yet), it and its parent writable, with `needed` bytes free.
    """
    if out.exists() and not out.is_dir():
        raise _refuse_out(out, "is a file, not a folder (the run writes metrics.json and steps.parquet into it)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(out)
        for folder in dict.fromkeys(p for p in (out.parent, out) if p.is_dir()):
            free = shutil.disk_usage(folder).free
            if free < needed:
                raise _refuse_out(
                    out,
                    f"{folder}: {os.strerror(errno.ENOSPC)} (ENOSPC): {free / 1e6:.1f} MB free, "
                    f"the run's records and logs need {needed / 1e6:.0f} MB",
                )
        if out.is_dir():
            fd, probe = tempfile.mkstemp(prefix=f".{out.name}.probe-", dir=out)
            os.close(fd)
            os.unlink(probe)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}{STAGING_INFIX}", dir=out.parent))
    except OSError as exc:
        raise _unwritable_out(out, exc) from exc
    try:
        write_json_atomic(
            staging / DRIVER_FILE,
            {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())},
        )
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _refuse_out(out, f"cannot write there: {os_problem(exc)}") from exc
    return staging


def set_aside_previous(out: Path) -> None:
    """Move an earlier run's records into `out/.previous/` (as NAME.old) so that a failed rerun leaves none current."""
    found = [name for name in (METRICS_FILE, STEPS_FILE) if (out / name).exists()]  # the completion marker first
    if not found:
        return
    previous = out / PREVIOUS_FOLDER
    try:
        previous.mkdir(exist_ok=True)
        for name in found:
            os.replace(out / name, previous / f"{name}.old")
    except OSError as exc:
        raise _refuse_out(out, f"cannot move the previous run's records aside: {os_problem(exc)}") from exc
    print(
        f"ralp-pipe train: moved the previous run's {' and '.join(found)} to {previous}/ as *.old "
        f"(removed once this run succeeds)"
    )


@dataclasses.dataclass(frozen=True)
class Ranks:
    """What the ranks of a launch are given: the split, the shards a shard loader reads, the ranks' device type and
    backend, where they run on a shared emulated cluster (`shared`) and, dilated, their padded times."""

    split: int | None
    shards: Path | None
    devices_of: tuple[str, str]
    shared: list[dict[str, Any]] | None = None
    targets: dilation.Targets | None = None


def _launch(
    cfg: Config,
    topo: Topology,
    staging: Path,
    ranks: Ranks,
    calibrate: bool = False,
    marks: dict[str, float] | None = None,
) -> RankResult:
    """Start and supervise the ranks (on the hosts `ranks.shared` names, where given); return rank 0's result.

    A dilated run's emulated links run at network.rate / D. A full disk under the ranks' logs is named. `marks`
    gets when the launch began (``configured``), its emulated hosts were up (``hosts_up``) and its ranks had
    all exited (``ranks_done``).
    """
    marks = {} if marks is None else marks
    marks["configured"] = time.time()
    device_type, backend = ranks.devices_of
    launcher = cluster_kind(cfg.cluster.kind).launcher
    result_file = staging / "result.json"
    entry = rank_command(result_file, cfg, ranks.split, ranks.shards, ranks.targets, calibrate, topo.hosts)
    env = {BACKEND_ENV: backend, DEVICE_ENV: device_type}
    timeout = cfg.cluster.init_timeout_s + cfg.cluster.timeout_s
    progress = srun_log(staging) if launcher == "srun" else rank_log(staging, 0)
    print(
        f"ralp-pipe train: {topo.world_size} rank{'s' * (topo.world_size > 1)} of {topo.strategy} {cfg.model.name} N={topo.gpus}; "
        f"rank 0 logs its progress to {progress} until the run ends",
        flush=True,
    )
    try:
        if launcher == "srun":
            os.environ.update(env)
            nodes = node_of_ranks(topo)
            launch_slurm(entry, nodes, timeout, staging, cfg.network.interface)
        elif launcher == "emulated":
            from ralp_pipe.runtime.emulated import emulated_sites

            rate = emulated_rate(cfg)
            with emulated_sites(topo.hosts, rate, cfg.network.burst, ranks.shared) as emulated:
                marks["hosts_up"] = time.time()
                launch_local(entry, topo.world_size, timeout, staging, emulated, env)
        else:
            launch_local(entry, topo.world_size, timeout, staging, None, env)
    except RunFailure as exc:
        if shutil.disk_usage(staging).free >= FULL_BYTES:
            raise
        raise RunFailure(
            f"{staging}: {os.strerror(errno.ENOSPC)} (ENOSPC): the disk holding the rank logs filled up "
            f"during the run, so the ranks' own errors may be missing; free space there and rerun. "
            f"{exc}"
        ) from exc
    marks["ranks_done"] = time.time()
    result: RankResult = json.loads(result_file.read_text())
    return result


def run(
    cfg: Config,
    out: Path,
    shards: Path | None = None,
    shared: list[dict[str, Any]] | None = None,
    link_check: Path | None = None,
    marks: dict[str, float] | None = None,
) -> RunMetrics | None:
    """Run the configured measurement and write its files to `out`; return the record (None on non-zero srun ranks).

    A shard loader reads `shards` (default: where ``prepare-shards`` writes the configured dataset);
    `shared` places the ranks on an emulated cluster of other jobs (:func:`shared_hosts`); `link_check`
    is the factor ``ralp-pipe check-links`` chose for a modelled ``auto`` run (:func:`resolve_auto`). `marks`
    (the command's start and imports) gets when the run's phases ended: metrics.json's ``timeline``.
    """
    marks = {} if marks is None else marks
    strategy_kind(cfg.strategy.name).check_trainable()
    kind = cluster_kind(cfg.cluster.kind)
    entry = plan_entry(cfg)  # hosts of cluster.gpus_per_node ranks, the PS device where the plan put it
    topo = placement(cfg, None if entry is None else entry.get("ps_device_host"))
    if kind.launcher == "emulated" and shared is not None and cfg.cluster.gpus_per_node > 1:
        raise ConfigError(
            f"--shared-hosts lays out hosts of one rank each, but cluster.gpus_per_node="
            f"{cfg.cluster.gpus_per_node} puts several on a host: run this job on its own"
        )
    if shared is not None and kind.launcher != "emulated":
        raise ConfigError(
            f"--shared-hosts places ranks on an emulated cluster but this run has cluster.kind={cfg.cluster.kind}: "
            f"add cluster=emulated"
        )
    if shared is not None and cfg.dilation.factor == AUTO_FACTOR:
        raise ConfigError(
            "--shared-hosts joins links the concurrent workload shaped before this job started, so "
            "dilation.factor=auto cannot choose them: give the jobs of a concurrent workload one number"
        )
    if link_check is not None and (cfg.dilation.factor != AUTO_FACTOR or cfg.dilation.mode != MODELLED):
        raise ConfigError(
            f"--link-check {link_check} gives a run in dilation.mode=modelled with dilation.factor=auto its factor, "
            f"but this run has dilation.mode={cfg.dilation.mode}, dilation.factor={cfg.dilation.factor}: "
            f"leave --link-check out"
        )
    if reads_shards(cfg.train.loader) and computes_for_real(cfg):  # unfit shards are refused before any rank starts
        shards = output_dir(cfg) if shards is None else shards
        shard_files(shards, cfg.dataset.num_classes)
        prepared = read_manifest(shards).get("dataset")
        if prepared != cfg.dataset.name:
            raise ConfigError(
                f"shards {shards} were prepared for dataset {prepared!r} but this run has "
                f"dataset.name={cfg.dataset.name!r}: give it that dataset's shards (--shards)"
            )
        check_shards(shards, cfg)  # a damaged shard is named before any rank starts
    else:
        shards = None
    units = meta_units(cfg)
    split, analytic = split_and_bytes(cfg, topo, units)
    device_type, backend = devices.resolve(cfg.cluster, topo.world_size, topo.hosts)
    ranks = Ranks(split, shards, (device_type, backend), shared, dilation.targets(cfg, topo))
    in_step = kind.launcher == "srun" and in_slurm_step(topo.world_size)
    if in_step:  # every task is a rank; rank 0 writes `out`
        if cfg.dilation.factor == AUTO_FACTOR:
            raise ConfigError(
                "dilation.factor=auto runs the ranks twice (a calibration, then the run), which one srun step of "
                "one task per rank cannot: give dilation.factor a number, or start `ralp-pipe train` outside srun"
            )
        result = run_rank(cfg, RankEnv.from_environ(), device_type, backend, split, shards, ranks.targets)
        return None if result is None else _finish(cfg, topo, out, Measured(split, analytic, result, None, marks))
    if kind.shares_host_cpus:
        check_host(cfg, topo, units, device_type == "cpu")
    with out_locked(out):
        staging = make_staging(out, record_bytes(cfg, topo))
        try:
            set_aside_previous(out)
            with damage_named(shards, cfg, staging):  # a rank failed on a shard damaged meanwhile: named
                cfg, ranks, calibration = resolve_auto(cfg, topo, staging, ranks, link_check)
                result = _launch(cfg, topo, staging, ranks, marks=marks)
            metrics = _finish(cfg, topo, out, Measured(split, analytic, result, calibration, marks))
            shutil.rmtree(out / PREVIOUS_FOLDER, ignore_errors=True)
            return metrics
        finally:
            shutil.rmtree(staging, ignore_errors=True)
