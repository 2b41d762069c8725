"""`ralp-pipe plan`: choose the RALP split point and predict every strategy's throughput.

For each strategy and GPU count the planner asks :mod:`ralp_pipe.planning.costmodel` for the step time
of every admissible configuration (every split 1..len(units)-1 for `ralp_h` / `ralp_n`) with
bytes per step from :func:`ralp_pipe.engine.volume.step_bytes`, keeps the fastest, and compares it
with every baseline of the strategy table (``speedup_over_<baseline>``). A RALP variant whose best split
is not faster than the reference baseline (`ps`) is kept in the plan with ``pays: false`` and a reason,
so the engine can still run it as the comparison.
It reads a :class:`~ralp_pipe.contract.records.Profile` (compute) and, with ``--link``, the
:class:`~ralp_pipe.contract.records.LinkProbe` of the run's network (else the profile's own probe),
and writes a :class:`~ralp_pipe.contract.records.Plan`; the engine reads ``plan.strategies[name]["split"]``.
Only emulated links are shaped, so only there does ``network.rate`` cap the measured bandwidth;
on SLURM the fabric is what the probe measured.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, cast

from ralp_pipe.atomic import check_writable
from ralp_pipe.config import (
    REFERENCE,
    STRATEGY_KINDS,
    Config,
    ConfigError,
    baselines,
    cluster_kind,
    load,
    made_for,
    reference_baseline,
    strategy_kind,
)
from ralp_pipe.config.schema import StrategyConfig
from ralp_pipe.config.units import rate_bytes_per_s
from ralp_pipe.contract.records import LinkProbe, Plan, Profile, check_profile_matches
from ralp_pipe.contract.topology import cpu_share, hosts_of, on_hosts, topology
from ralp_pipe.contract.unit_table import UnitTable
from ralp_pipe.engine import devicemodel
from ralp_pipe.engine.volume import Units, step_bytes
from ralp_pipe.errors import DataError
from ralp_pipe.planning.costmodel import (
    Link,
    Pipelining,
    Prediction,
    Pricing,
    SharedCpu,
    WholeVariables,
    compute_costs,
    effective_link,
    predict,
)

# what `ralp-pipe plan` reads of the config (a key covers those below it)
CONFIG_KEYS = (
    "dataset.name",
    "dilation.factor",
    "dataset.num_classes",
    "model",
    "strategy.num_ps",
    "strategy.overlap",
    "strategy.bucket_mb",
    "strategy.ps_placement",
    "strategy.name",  # where it is dtf or byteps, its own options price it (strategy_options) ...
    "strategy.variable_placement",
    "strategy.variable_update",
    "strategy.step_barrier",
    "strategy.ps_apply_ns_per_byte",
    "strategy.rpc_us_per_tensor",
    "strategy.transport_cap",  # ... else its shipped config/strategy/<name>.yaml's
    "network",
    "interconnect",
    "cluster.gpus_per_node",
    "cluster.kind",
    "cluster.gpus",
    "experiment.gpus",  # the single-device reference's CPU share: one rank of the largest run
    "experiment.strategies",  # ... of the experiment's strategies (dtf's PS task per host makes 2N ranks)
    "train.batch_size",
    "train.image_size",
    "train.cpu_share",
    "train.lr",  # ... these three only find the device model's cached trace, which holds the unit table
    "train.momentum",
    "train.weight_decay",
)

VolumeFn = Callable[[str, int, "int | None"], dict[str, int]]


def check_link_matches(probe: LinkProbe, cfg: Config, path: str | Path) -> None:
    """Refuse a link record of another network or cluster kind than `cfg` trains on."""
    for key, wanted in (("network", cfg.network.name), ("cluster_kind", cfg.cluster.kind)):
        if getattr(probe, key) != wanted:
            raise ConfigError(
                f"link record {path} has {key}={getattr(probe, key)!r} but the configuration asks for {wanted!r}: "
                f"probe that network with `ralp-pipe profile --link-only` or pass matching overrides"
            )


def cluster_link(profile: Profile, cfg: Config, probe: LinkProbe | None = None) -> Link:
    """The link the run will see: measured (by `probe`, else the profile's own probe), capped by
    network.rate where the cluster is shaped. A dilated run emulates the target's link: network.rate itself
    (this machine's probe says what its links deliver undilated, not what the target's do)."""
    measured = (probe.measured if probe else profile.link.get("measured")) or {}
    if cfg.dilation.factor is not None:
        measured = {}
    rate = cfg.network.rate if cluster_kind(cfg.cluster.kind).shapes_links else None
    try:
        return effective_link(
            measured.get("bytes_per_s"),
            rate,
            float(measured.get("latency_s", 0.0)),
            measured.get("allreduce_bus_bytes_per_s"),
        )
    except ValueError as exc:
        raise ConfigError(f"{exc} (profile of {profile.model}, network.rate={cfg.network.rate})") from exc


def shared_cpu(cfg: Config, profile: Profile, gpus: int) -> SharedCpu | None:
    """The CPU every rank shares where a local or emulated run at `gpus` has no GPUs, else None (a device each).

    A rank's threads follow its CPU share where one is set (:func:`ralp_pipe.contract.topology.cpu_share`:
    the single-device reference gets one rank's of the largest run), else the cores split over the world.
    """
    if profile.device != "cpu" or not cluster_kind(cfg.cluster.kind).shares_host_cpus:
        return None
    hw = profile.hardware or {}
    try:
        cores, threads = int(hw.get("cpu_affinity") or hw["cpu_count"]), int(hw["torch_threads"])
    except KeyError as exc:
        raise DataError(
            f"CPU profile of {profile.model} lacks hardware.{exc.args[0]}: re-run `ralp-pipe profile`"
        ) from exc
    return SharedCpu(cores, threads, cpu_share(cfg, REFERENCE[0], gpus))  # planned at N=1: as the reference runs


def volume_function(units: Units, batch_size: int, image_size: int, num_ps: int) -> VolumeFn:
    """``(strategy, gpus, split) -> volume.step_bytes(...)``, memoised, computing each split's shape once.

    Where a strategy's bytes are workers x per-worker bytes (``per_worker_volume`` in the strategy
    table: `ps` and RALP), they are its figures at its fewest devices scaled to the workers (the
    split's activation shape, the costly part, is then computed once per split rather than once
    per split and N); the planner's tests compare every figure with a direct call. Units built on the meta
    device (:func:`ralp_pipe.engine.models.model_units`) give the same figures without computing anything, and
    so does their unit table (:func:`ralp_pipe.engine.devicemodel.unit_table`) without torch.
    """
    cache: dict[tuple[str, int, int | None], dict[str, int]] = {}

    def exact(strategy: str, gpus: int, split: int | None) -> dict[str, int]:
        key = (strategy, gpus, split)
        if key not in cache:
            cache[key] = step_bytes(strategy, units, split, topology(strategy, gpus, num_ps), batch_size, image_size)
        return cache[key]

    def volume(strategy: str, gpus: int, split: int | None) -> dict[str, int]:
        kind = strategy_kind(strategy)
        if not kind.per_worker_volume:
            return exact(strategy, gpus, split)
        fewest, few = exact(strategy, kind.min_gpus, split), kind.workers(kind.min_gpus)
        workers = kind.workers(gpus)
        return {k: v // few * workers for k, v in fewest.items()}

    return volume


def transfers_overlap(cfg: Config) -> bool:
    """Whether transfers can run beside computation on `cfg`'s cluster.

    On one host's unshaped loopback the transfers are memory copies by the very cores that
    compute and serve, so nothing overlaps and the sequential phases price the step.
    """
    kind = cluster_kind(cfg.cluster.kind)
    return not (kind.shares_host_cpus and not kind.shapes_links)


def pipelining_of(cfg: Config, own_links: bool = False) -> Pipelining | None:
    """How `cfg`'s parameter-server and RALP steps are priced: pipelined (``strategy.overlap``) or sequential
    (None, also where transfers cannot overlap computation: :func:`transfers_overlap`, unless `own_links`: hosts
    of their own, as simulate prices them, whatever ``cluster.kind`` this machine runs)."""
    if not cfg.strategy.overlap or not (own_links or transfers_overlap(cfg)):
        return None
    return Pipelining(cfg.strategy.bucket_mb * 1e6)


@functools.cache
def _shipped_strategy(name: str) -> StrategyConfig:
    """``config/strategy/<name>.yaml``'s settings, composed once per process (a composition takes ~0.5 s)."""
    return load([f"strategy={name}"]).strategy


def strategy_options(cfg: Config, name: str) -> StrategyConfig:
    """Strategy `name`'s settings: the configured strategy's where it is `name`, else (a copy of) its shipped
    ``config/strategy/<name>.yaml``."""
    return cfg.strategy if cfg.strategy.name == name else replace(_shipped_strategy(name))


def dtf_options(cfg: Config) -> StrategyConfig:
    """`dtf`'s settings (:func:`strategy_options`): its whole variables' placement, update and transport."""
    return strategy_options(cfg, "dtf")


def per_host_placements(cfg: Config) -> dict[str, bool]:
    """Whether the servers of each strategy with one PS per worker host sit beside its workers (``colocated``), as
    its own options say (:func:`strategy_options`)."""
    return {
        name: strategy_options(cfg, name).ps_placement == "colocated"
        for name, kind in STRATEGY_KINDS.items()
        if kind.ps_per_host
    }


def whole_variables(units: Units, options: StrategyConfig) -> WholeVariables:
    """`dtf`'s variables of `units` (each parameter tensor, in creation order) placed and pushed as `options` say."""
    if isinstance(units, UnitTable):
        variables = units.variables()
    else:
        variables = [(i, p.numel() * p.element_size()) for i, u in enumerate(units) for p in u.module.parameters()
                     if p.requires_grad]  # fmt: skip
    return WholeVariables(
        tuple(size for _, size in variables),
        tuple(unit for unit, _ in variables),
        greedy=options.variable_placement == "greedy",
        sum_in_host=options.variable_update == "distributed_replicated",
        transport_cap=None if options.transport_cap is None else rate_bytes_per_s(options.transport_cap),
        step_barrier=options.step_barrier,
        apply_s_per_byte=None if options.ps_apply_ns_per_byte is None else options.ps_apply_ns_per_byte * 1e-9,
        rpc_s=options.rpc_us_per_tensor * 1e-6,
        colocated=options.ps_placement == "colocated",
    )


def best_prediction(
    strategy: str, volume: VolumeFn, gpus: int, pricing: Pricing
) -> tuple[Prediction, list[Prediction]]:
    """The fastest configuration of `strategy` at `gpus` and every configuration it was chosen from: every split
    of a layer-placing strategy, and where hosts hold several GPUs both places of its PS device."""
    kind = strategy_kind(strategy)
    workers = kind.workers(gpus)
    splits: Sequence[int | None] = range(1, len(pricing.costs.units)) if kind.places_layers else [None]
    places = (
        [False, True] if kind.places_layers and pricing.hosts.gpus_per_node > 1 else [pricing.ps_device_shares_host]
    )
    table = [
        predict(strategy, workers, gpus, volume(strategy, gpus, k), replace(pricing, ps_device_shares_host=shares), k)
        for shares in places
        for k in splits
    ]
    return max(table, key=lambda p: p.images_per_sec), table


def ps_device_choice(best: Prediction, table: Sequence[Prediction]) -> str:
    """Why RALP's PS device is where `best` has it: the best of the other place, in words."""
    other = [p for p in table if p.ps_device_host != best.ps_device_host]
    if not other:
        return f"on {best.ps_device_host}"
    rival = max(other, key=lambda p: p.images_per_sec)
    return (
        f"on {best.ps_device_host}: {best.images_per_sec:.4g} img/s at split {best.split}, against "
        f"{rival.images_per_sec:.4g} img/s on {rival.ps_device_host} (its best split, {rival.split})"
    )


def _reason(strategy: str, best: Prediction, baseline: Prediction, unit_names: Sequence[str]) -> str:
    """Why `strategy` pays or not: its best configuration against the reference baseline's (`baseline`)."""
    speedup = best.images_per_sec / baseline.images_per_sec
    name = baseline.strategy
    where = f"split {best.split} (after '{unit_names[best.split - 1]}')" if best.split else strategy
    moved = (
        f"{best.bytes_per_step['total'] / 1e9:.4g} GB/step instead of {name}'s "
        f"{baseline.bytes_per_step['total'] / 1e9:.4g}"
    )
    phases = f"compute {best.compute_s:.4g} s, server {best.server_s:.4g} s, network {best.comm_s:.4g} s per step"
    if speedup > 1:
        return f"{where} predicts {speedup:.3g}x the {name} baseline's images/sec, moving {moved} ({phases})"
    return (
        f"does not pay: the best, {where}, predicts {speedup:.3g}x the {name} baseline's images/sec "
        f"while moving {moved} ({phases})"
    )


def plan_gpus(
    unit_names: Sequence[str],
    volume: VolumeFn,
    gpus: int,
    pricing: Pricing,
    placements: Mapping[str, bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """Plan entries of every strategy at `gpus` devices, keyed by strategy name; the strategies with one PS per
    worker host colocated as `placements` says (:func:`per_host_placements`; default: colocated)."""
    entries: dict[str, dict[str, Any]] = {}
    priced = {
        s: strategy_pricing(s, gpus, pricing, (placements or {}).get(s, True))
        for s, kind in STRATEGY_KINDS.items()
        if gpus >= kind.min_gpus
    }
    best_of = {s: best_prediction(s, volume, gpus, p) for s, p in priced.items()}
    reference = best_of[reference_baseline()][0]
    for strategy, (best, table) in best_of.items():
        kind = strategy_kind(strategy)
        p = priced[strategy]  # the ranks as they run on its hosts (dtf, byteps: one PS task per worker host)
        topo = on_hosts(
            topology(strategy, gpus, p.num_ps, "colocated" if p.colocated else "dedicated"), p.hosts.gpus_per_node
        )
        entry = {
            **best.as_dict(),
            "roles": topo.roles,
            "world_size": topo.world_size,
            "num_workers": topo.num_workers,
            **{
                f"speedup_over_{other}": best.images_per_sec / best_of[other][0].images_per_sec
                for other in baselines()
                if other in best_of
            },
            "pays": None if kind.baseline else best.images_per_sec > reference.images_per_sec,
            "reason": "the baseline" if kind.baseline else _reason(strategy, best, reference, unit_names),
        }
        if kind.places_layers:
            entry["split_after_unit"] = unit_names[cast(int, best.split) - 1]
            entry["table"] = [{**p.as_dict(), "after_unit": unit_names[cast(int, p.split) - 1]} for p in table]
            if best.ps_device_host:
                entry["ps_device_choice"] = ps_device_choice(best, table)
        entries[strategy] = entry
    return entries


def strategy_pricing(strategy: str, gpus: int, pricing: Pricing, colocated: bool = True) -> Pricing:
    """How `strategy` is priced at `gpus`: a strategy with one PS per worker host (``ps_per_host``: `dtf` as
    Distributed TensorFlow was deployed, `byteps` as BytePS is) with that many, beside the workers where
    `colocated` (its ``strategy.ps_placement``, :func:`per_host_placements`), else on hosts of their own; every
    other strategy as `pricing` says."""
    if not strategy_kind(strategy).ps_per_host:
        return pricing
    return replace(pricing, num_ps=pricing.hosts.count(gpus), colocated=colocated)


def build_plan(
    profile: Profile,
    profile_path: str | Path,
    cfg: Config,
    gpus: Sequence[int],
    probe: LinkProbe | None = None,
    probe_path: str | Path | None = None,
) -> Plan:
    """The plan for `cfg` at every GPU count in `gpus` (the first one is the main entry), pricing
    transfers on `probe` (read from `probe_path`) where given, else on the profile's own link."""
    check_profile_matches(profile, cfg, profile_path)
    if probe is not None:
        check_link_matches(probe, cfg, probe_path or "?")
    t = cfg.train
    units = devicemodel.unit_table(cfg.model.name, cfg.dataset.num_classes, t.image_size, cfg.model.dropout, t)
    names = units.names
    if names != [u["name"] for u in profile.units]:
        raise ConfigError(f"profile {profile_path} lists other placement units than models.py builds: re-profile")
    link = cluster_link(profile, cfg, probe)
    volume = volume_function(units, cfg.train.batch_size, cfg.train.image_size, cfg.strategy.num_ps)
    pricing = Pricing(
        compute_costs(profile.to_dict()),
        cfg.train.batch_size,
        link,
        cfg.strategy.num_ps,
        cfg.strategy.ps_placement == "colocated",
        pipelining_of(cfg),
        ddp_overlap=transfers_overlap(cfg),  # DDP reduces its buckets during backward whatever strategy.overlap says
        hosts=hosts_of(cfg),
        variables=whole_variables(units, dtf_options(cfg)),
    )
    shared = {n: shared_cpu(cfg, profile, n) for n in gpus}
    placements = per_host_placements(cfg)
    by_gpus = {str(n): plan_gpus(names, volume, n, replace(pricing, shared=shared[n]), placements) for n in gpus}
    first_shared = shared[gpus[0]]
    best = max(by_gpus[str(gpus[0])].items(), key=lambda kv: kv[1]["predicted_images_per_sec"])
    return Plan(
        **made_for(cfg),
        gpus=gpus[0],
        network=cfg.network.name,
        cluster_kind=cfg.cluster.kind,
        bandwidth_bytes_per_s=link.bytes_per_s,
        bandwidth_source=link.source,
        latency_s=link.latency_s,
        allreduce_bytes_per_s=link.ring_bytes_per_s,
        shared_cpu=None if first_shared is None else asdict(first_shared),
        profile=str(profile_path),
        profile_kind=profile.kind,
        profile_device=(profile.target or {}).get("name", profile.device),
        link=None if probe_path is None else str(probe_path),
        recommended=best[0],
        strategies=by_gpus[str(gpus[0])],
        by_gpus=by_gpus,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe plan`."""
    parser.add_argument("--profile", required=True, type=Path, help="profile JSON from `ralp-pipe profile`")
    parser.add_argument("--out", required=True, type=Path, help="plan JSON file to write")
    parser.add_argument(
        "--link", type=Path, help="link record from `ralp-pipe profile --link-only` (default: the profile's probe)"
    )
    parser.add_argument("--gpus", type=int, nargs="+", help="GPU counts to plan for (default: cluster.gpus)")


def main(args: argparse.Namespace) -> int:
    """Plan every strategy for the configured model and write the plan file."""
    check_writable(args.out.parent, f"--out {args.out}")
    cfg = load(args.overrides)
    gpus = args.gpus or [cfg.cluster.gpus]
    if min(gpus) < 1:
        raise ConfigError(f"--gpus {' '.join(map(str, gpus))}: every GPU count must be at least 1")
    probe = LinkProbe.read(args.link) if args.link else None
    plan = build_plan(Profile.read(args.profile), args.profile, cfg, gpus, probe, args.link)
    plan.write(args.out)
    reference = reference_baseline()
    for name, entry in plan.strategies.items():
        split = f" split {entry['split']:>2}" if entry["split"] else " " * 9
        print(
            f"{name:9s}{split}  {entry['predicted_images_per_sec']:10.2f} img/s  "
            f"{entry['predicted_gb_per_step']['total']:.4f} GB/step  x{entry[f'speedup_over_{reference}']:.2f}  "
            f"{entry['reason'] if strategy_kind(name).places_layers else ''}"
        )
        if "ps_device_choice" in entry:
            print(f"{'':9s}PS device {entry['ps_device_choice']}")
    print(
        f"plan for {plan.model}/{plan.dataset} at N={plan.gpus} on {plan.profile_device} ({plan.profile_kind} profile, "
        f"{(plan.bandwidth_bytes_per_s or 0.0) / 1e9:.3g} GB/s, {plan.bandwidth_source}) -> {args.out}"
    )
    return 0
