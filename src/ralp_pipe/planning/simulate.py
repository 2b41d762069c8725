"""`ralp-pipe simulate`: predict every strategy on clusters this machine is not.

With the cost model of :mod:`ralp_pipe.planning.costmodel` and the unit costs of one profile, it
predicts images/sec and GB/step for N = 2..1024 GPUs (powers of two; ``--gpus 1`` adds the one-worker
reference, where the strategies that need more devices have no row) and links of 1..400
Gbit/s, one device per rank (the PS device computing at the profiled speed), choosing the
best split for each RALP variant at every point. Hosts hold ``cluster.gpus_per_node`` GPUs linked
by the ``interconnect`` (:class:`~ralp_pipe.contract.topology.Hosts`; the link speed is a host's). The
parameter servers are deployed as the strategy table says: `dtf` and `byteps` (``ps_per_host``) with one PS
task colocated on every worker host, as Distributed TensorFlow and BytePS are deployed, `ps` with the
config's ``strategy.num_ps`` and ``strategy.ps_placement``; ``--ps-per-host`` deploys every one of them one
per host, ``--no-ps-per-host`` every one as the config's `ps` says. Each row holds its speedup over every
baseline priced beside it (``speedup_over_<baseline>``). It writes ``simulation.parquet``, a plot of
images/sec against N (one panel per strategy, one line per link speed), a plot of the speedup
over `ps`, and prints a short summary.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, cast

import pandas as pd

from ralp_pipe.atomic import atomic_path, check_writable
from ralp_pipe.config import (
    STRATEGY_KINDS,
    Config,
    ConfigError,
    baselines,
    load,
    reference_baseline,
    strategy_kind,
)
from ralp_pipe.config.units import TCP_PAYLOAD_PER_WIRE_BYTE
from ralp_pipe.contract.records import LinkProbe, Profile, check_profile_matches
from ralp_pipe.contract.topology import Hosts, hosts_of
from ralp_pipe.engine import devicemodel
from ralp_pipe.engine.volume import Units
from ralp_pipe.planning.batches import profile_batches
from ralp_pipe.planning.costmodel import Link, Pipelining, Pricing, WholeVariables, compute_costs
from ralp_pipe.planning.planner import (
    best_prediction,
    dtf_options,
    pipelining_of,
    volume_function,
    whole_variables,
)
from ralp_pipe.planning.timeline import MAX_HOSTS

GPUS = tuple(2**i for i in range(1, 11))
MAX_GPUS = 2**20  # the most GPUs simulate prices: its topologies list every rank
BY_HAND = ("experiment=paper",)  # what a simulation composes unless told otherwise: the paper's recipe
LINK_GBIT = (1, 10, 25, 40, 100, 200, 400)
PAPER_GPUS = (2, 16)  # the paper's evaluation: 2..16 GPUs (config/experiment/paper.yaml) ...
PAPER_LINK_GBIT = (1, 10, 25)  # ... on 1, 10 and 25 Gbit/s links


@dataclass(frozen=True)
class Grid:
    """The clusters a simulation prices: every N of `gpus` on every link speed of `link_gbit`, paying
    `latency_s` per message (None: the profile's own probe's, 0 for a compute-only profile)."""

    gpus: Sequence[int] = GPUS
    link_gbit: Sequence[float] = LINK_GBIT
    latency_s: float | None = None


@dataclass(frozen=True)
class Servers:
    """How the parameter-server strategies run: with a PS rank colocated on each worker host where `per_host` is
    True, with `num_ps` PS ranks placed as `colocated` says where it is False, and where it is None as the strategy
    table says (``ps_per_host``: one per host, else `num_ps`); transfers pipelined as `pipelining` says (None:
    sequential)."""

    num_ps: int = 1
    colocated: bool = False
    per_host: bool | None = None
    pipelining: Pipelining | None = None

    def of(self, strategy: str, gpus: int, hosts: Hosts) -> tuple[int, bool]:
        """(PS ranks, colocated) of `strategy` at `gpus` on `hosts`."""
        kind = strategy_kind(strategy)
        per_host = kind.ps_per_host if self.per_host is None else self.per_host
        return (hosts.count(gpus), True) if kind.has_ps and per_host else (self.num_ps, self.colocated)


def simulate(
    profile: Mapping[str, Any],
    units: Units,
    batch_size: int,
    grid: Grid = Grid(),
    ps: Servers = Servers(),
    hosts: Hosts = Hosts(),
    variables: WholeVariables | None = None,
) -> pd.DataFrame:
    """One row per strategy x N x link speed of `grid` with the best configuration's predictions and its speedup
    over every baseline priced beside it, on hosts of `hosts`' GPUs; `dtf` is priced where its `variables` are
    given."""
    costs = compute_costs(profile)
    names = [u.name for u in units]
    volume = volume_function(units, batch_size, int(profile["image_size"]), ps.num_ps)
    latency_s = grid.latency_s
    if latency_s is None:
        latency_s = float(((profile.get("link") or {}).get("measured") or {}).get("latency_s", 0.0))
    rows = []
    for gbit in grid.link_gbit:
        link = Link(gbit * 1e9 / 8 * TCP_PAYLOAD_PER_WIRE_BYTE, latency_s, f"{gbit} Gbit/s")
        for n in grid.gpus:
            point = []
            for strategy, kind in STRATEGY_KINDS.items():
                if n < kind.min_gpus:  # RALP at N=1: no PS device beside a worker (the planner leaves it out too)
                    continue
                if kind.whole_variables and (variables is None or not dtf_priced(n, hosts, ps.pipelining)):
                    continue
                servers, beside = ps.of(strategy, n, hosts)
                pricing = Pricing(
                    costs, batch_size, link, servers, beside, ps.pipelining, hosts=hosts, variables=variables
                )
                best, _ = best_prediction(strategy, volume, n, pricing)
                point.append(
                    {
                        "model": profile["model"],
                        "num_classes": profile["num_classes"],
                        "strategy": strategy,
                        "gpus": n,
                        "link_gbit": gbit,
                        "num_ps": servers if kind.has_ps else None,
                        "ps_placement": ("colocated" if beside else "dedicated") if kind.has_ps else None,
                        "split": best.split,
                        "split_after_unit": names[cast(int, best.split) - 1] if kind.places_layers else None,
                        "gpus_per_node": hosts.gpus_per_node,
                        "hosts": hosts.count(n),
                        "ps_device_host": best.ps_device_host,
                        "images_per_sec": best.images_per_sec,
                        "step_time_s": best.step_time_s,
                        "compute_s": best.compute_s,
                        "server_s": best.server_s,
                        "comm_s": best.comm_s,
                        "gb_per_step": best.bytes_per_step["total"] / 1e9,
                        **{f"gb_{k}": v / 1e9 for k, v in best.bytes_per_step.items() if k != "total"},
                    }
                )
            rate = {row["strategy"]: row["images_per_sec"] for row in point}
            rows += [
                {**row, **{f"speedup_over_{b}": row["images_per_sec"] / rate[b] for b in baselines() if b in rate}}
                for row in point
            ]
    return pd.DataFrame(rows)


def dtf_priced(gpus: int, hosts: Hosts, pipelining: Pipelining | None) -> bool:
    """Whether `dtf` is priced at `gpus` on `hosts`: sequential always, pipelined up to
    :data:`~ralp_pipe.planning.timeline.MAX_HOSTS` hosts (its timeline's cost grows as the hosts squared)."""
    return pipelining is None or hosts.count(gpus) <= MAX_HOSTS


def priced_by(profile: Mapping[str, Any]) -> str:
    """What a profile prices, for titles: the target GPU of a modelled profile, else the device it was measured on."""
    if profile.get("kind") == "modelled":
        return f"{(profile.get('target') or {}).get('name', '?')} (modelled profile)"
    cpu = ((profile.get("hardware") or {}).get("cpu_model") or "").strip()
    return f"{profile['device']}{f' {cpu}' if cpu and profile['device'] == 'cpu' else ''} (measured profile)"


def plot(
    frame: pd.DataFrame, column: str, ylabel: str, path: Path, strategies: Sequence[str], log_y: bool, device: str
) -> None:
    """One panel per strategy: `column` against N, one line per link speed, the paper's setting shaded and its
    links drawn bold; titled with the device the profile prices; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, axes = plt.subplots(1, len(strategies), figsize=(4.2 * len(strategies), 3.8), sharey=True, squeeze=False)
    for ax, strategy in zip(axes[0], strategies):
        part = frame[frame.strategy == strategy]
        ax.axvspan(*PAPER_GPUS, color="0.9", zorder=0, label="paper: N 2-16")
        for gbit, line in part.groupby("link_gbit"):
            paper = gbit in PAPER_LINK_GBIT
            ax.plot(
                line.gpus,
                line[column],
                marker="o",
                markersize=3,
                linewidth=2.2 if paper else 0.9,
                label=f"{gbit:g} Gbit/s{' (paper)' if paper else ''}",
            )
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_minor_locator(NullLocator())  # a gridline a decade: minor ticks cost a second a figure
        ax.set_title(strategy, y=1.0)  # a fixed place: placing it by the axis ticks redraws them (1-2 s a figure)
        ax.set_xlabel("GPUs (N)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    model = frame.model.iloc[0]
    fig.suptitle(f"{model}, {frame.num_classes.iloc[0]} classes on {device}: predicted")
    fig.subplots_adjust(left=0.08 / len(strategies) ** 0.5, right=0.98, bottom=0.13, top=0.85, wspace=0.08)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def write_outputs(frame: pd.DataFrame, out: Path, device: str) -> list[Path]:
    """simulation.parquet, images_per_sec.png and speedup_over_ps.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    table = out / "simulation.parquet"
    with atomic_path(table) as tmp:
        frame.to_parquet(tmp, index=False)
    throughput, speedup = out / "images_per_sec.png", out / "speedup_over_ps.png"
    priced = [s for s in STRATEGY_KINDS if s in set(frame.strategy)]
    plot(frame, "images_per_sec", "images/sec", throughput, priced, log_y=True, device=device)
    others = [s for s, kind in STRATEGY_KINDS.items() if not kind.baseline and s in set(frame.strategy)]
    reference = reference_baseline()
    plot(frame, f"speedup_over_{reference}", f"speedup over {reference}", speedup, others, log_y=True, device=device)
    return [table, throughput, speedup]


def summary(frame: pd.DataFrame) -> str:
    """Per link speed, at the smallest and the largest N: every strategy's images/sec, then the best one with its
    speedup over each baseline, as short text lines."""
    lines = []
    for gbit in sorted(frame.link_gbit.unique()):
        for n in sorted({frame.gpus.min(), frame.gpus.max()}):
            part = frame[(frame.link_gbit == gbit) & (frame.gpus == n)]
            best = part.loc[part.images_per_sec.idxmax()]
            split = f" split {int(best.split)}" if strategy_kind(best.strategy).places_layers else ""
            over = ", ".join(
                f"{best[f'speedup_over_{b}']:.2f}x {b}" for b in baselines() if pd.notna(best.get(f"speedup_over_{b}"))
            )
            every = ", ".join(f"{r.strategy} {r.images_per_sec:,.0f}" for r in part.itertuples())
            lines.append(f"{gbit:>5g} Gbit/s N={n:<5d} img/s: {every}")
            lines.append(
                f"{'':>20}best {best.strategy}{split}: {best.images_per_sec:,.0f} img/s, {over}, "
                f"{best.gb_per_step:.3g} GB/step"
            )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe simulate`."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", type=Path, help="profile JSON from `ralp-pipe profile` (measured or modelled)")
    source.add_argument(
        "--target",
        help="price a modelled profile of this GPU (a config/device entry; device.* overrides adjust it)",
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for simulation.parquet and the PNG plots")
    parser.add_argument("--gpus", type=int, nargs="+", default=list(GPUS), help="GPU counts (default 2..1024)")
    parser.add_argument("--link-gbit", type=float, nargs="+", default=list(LINK_GBIT), help="link speeds in Gbit/s")
    parser.add_argument(
        "--link", type=Path, help="link record from `ralp-pipe profile --link-only`: its measured latency per message"
    )
    parser.add_argument(
        "--ps-per-host",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="price every parameter-server strategy with one PS colocated on every worker host; --no-ps-per-host: "
        "every one with strategy.num_ps and strategy.ps_placement of the config; default: dtf and byteps one per "
        "host, ps as the config says",
    )


def composed(args: argparse.Namespace) -> Config:
    """The configuration a simulation prices: the paper's recipe (:data:`BY_HAND`) unless an ``experiment=``
    override names another, then the user's overrides; with ``--target`` that GPU's entry adjusted by them."""
    named = any(o.split("=", 1)[0].lstrip("+") == "experiment" for o in args.overrides)
    overrides = [*([] if named else BY_HAND), *args.overrides]
    return load(devicemodel.target_overrides(args.target, overrides) if args.target else overrides)


def assumptions(cfg: Config, profile: Profile, source: str, hosts: Hosts, servers: Servers) -> dict[str, Any]:
    """What every row of a simulation assumes beyond its own columns (its `simulation.parquet` columns too)."""
    target = profile.target or {}
    return {
        "device": target.get("name", profile.device),
        "profile_kind": profile.kind,
        "device_source": source,
        "batch_size": cfg.train.batch_size,
        "image_size": profile.image_size,
        "interconnect": cfg.interconnect.name,
        "interconnect_gbytes_per_s": hosts.interconnect_bytes_per_s / 1e9,
        "pipelined": servers.pipelining is not None,
    }


def describe(facts: Mapping[str, Any], hosts: Hosts, servers: Servers, gpus: Sequence[int]) -> list[str]:
    """The assumptions of a simulation as the lines its summary starts with."""
    per_host = "one PS task beside every worker host"
    deployed = {
        strategy: per_host
        if (kind.ps_per_host if servers.per_host is None else servers.per_host)
        else f"{servers.num_ps} PS {'colocated with workers' if servers.colocated else 'on hosts of their own'}"
        for strategy, kind in STRATEGY_KINDS.items()
        if kind.has_ps
    }
    inside = (
        f", {facts['interconnect']} ({facts['interconnect_gbytes_per_s']:g} GB/s per GPU) inside a host"
        if hosts.gpus_per_node > 1
        else ""
    )
    lines = [
        f"device {facts['device']} ({facts['profile_kind']} profile, {facts['device_source']}); "
        f"batch {facts['batch_size']} per GPU at {facts['image_size']} px",
        f"hosts of {hosts.gpus_per_node} GPU{'s' if hosts.gpus_per_node > 1 else ''} (N / {hosts.gpus_per_node} "
        f"hosts){inside}; each host one link at its row's rate (TCP payload: {TCP_PAYLOAD_PER_WIRE_BYTE:.3g} of it)",
        "PS: "
        + "; ".join(f"{s} {d}" for s, d in deployed.items())
        + ("; transfers pipelined with backward" if facts["pipelined"] else "; transfers after backward"),
    ]
    left_out = [n for n in gpus if not dtf_priced(n, hosts, servers.pipelining)]
    if left_out:
        lines.append(
            f"dtf left out at N={', '.join(map(str, left_out))}: its timeline is priced up to {MAX_HOSTS} hosts"
        )
    return lines


def main(args: argparse.Namespace) -> int:
    """Simulate every strategy over N and link speed and write the table and plots."""
    if min(args.gpus) < 1 or min(args.link_gbit) <= 0:
        raise ConfigError(f"--gpus {args.gpus} must all be >= 1 and --link-gbit {args.link_gbit} all positive")
    if max(args.gpus) > MAX_GPUS:
        raise ConfigError(f"--gpus {max(args.gpus)} is beyond the {MAX_GPUS} GPUs simulate prices: give fewer")
    check_writable(args.out, f"--out {args.out}")
    cfg = composed(args)
    if args.target:
        batches = profile_batches(cfg.train.batch_size, args.gpus)
        profile = Profile.from_dict(
            devicemodel.modelled_profile(cfg, batches, max(args.gpus)), f"--target {args.target}"
        )
        source = f"config/device/{args.target}.yaml" + "".join(
            f" {o}" for o in args.overrides if o.split("=", 1)[0].startswith("device.")
        )
    else:
        profile = Profile.read(args.profile)
        check_profile_matches(profile, cfg, args.profile)
        source = str(args.profile)
    units = devicemodel.unit_table(  # the trace's, where it is cached: no torch
        cfg.model.name, cfg.dataset.num_classes, profile.image_size, cfg.model.dropout, cfg.train
    )
    latency_s = float((LinkProbe.read(args.link).measured or {}).get("latency_s", 0.0)) if args.link else None
    servers = Servers(
        cfg.strategy.num_ps,
        cfg.strategy.ps_placement == "colocated",
        args.ps_per_host,
        pipelining_of(cfg, own_links=True),
    )
    hosts = hosts_of(cfg)
    frame = simulate(
        profile.to_dict(),
        units,
        cfg.train.batch_size,
        Grid(args.gpus, args.link_gbit, latency_s),
        servers,
        hosts,
        whole_variables(units, dtf_options(cfg)),
    )
    facts = assumptions(cfg, profile, source, hosts, servers)
    frame = frame.assign(**facts)
    paths = write_outputs(frame, args.out, priced_by(profile.to_dict()))
    print("\n".join([*describe(facts, hosts, servers, args.gpus), summary(frame)]))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
