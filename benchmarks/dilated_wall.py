"""Wall time of a dilated experiment's training runs, estimated from the planner's own predictions.

A dilated run's wall time is set by its target: every step takes D x the target's step time. So the
training runs of a dilated experiment take about

    sum over runs of  start + (warmup + measure steps) x D x the predicted step time of the run's target

where the predicted step time is the cost model's for the V100 profile of the run's model and class
count at its N and link (what `ralp-pipe simulate --target` prices; RALP at its best split; sequential
arms without pipelining; the N=1 reference without communication) and `start` is what a run costs
besides its steps (Python and torch imports, rank start-up, the emulated network, the records), plus,
where ``dilation.factor=auto`` (modelled mode), ``check`` seconds for each of the workflow's
``check_links`` jobs, one per number of hosts, traffic pattern and network. Run it on an experiment that was timed
(`benchmarks/workflow_local.py`) to see how far the estimate is from a measurement, then on one that was not.

Usage: python benchmarks/dilated_wall.py [--experiment paper-dilated] [--start-s 5] [--check-s 25]
                                         [--factor 1gbit=1 1gbit:star=0.5 1gbit:star:17=2 ...] [--checks DIR]
                                         [--side-by-side] [--overrides KEY=VALUE ...]
``--factor`` gives D per network where the experiment sets ``dilation.factor=auto`` (what the link check
would choose is only known once it ran), or per network and link pattern (``star``: `ps` and RALP, ``ring``:
`allreduce`), or per network, pattern and number of hosts (N + 1 for `ps`), the most specific applying
(`benchmarks/link_accuracy.py` measures them); ``--checks`` a folder of link-check records as the workflow lays them
out (``<network>/<pattern>-h<hosts>.json``, written by ``ralp-pipe check-links --out``): a run whose hosts,
pattern and network have one takes its D (D < 1 where the links keep up faster than the target), the others
``--factor``'s; ``--start-s`` the seconds a run costs besides its steps (5 s:
the default workflow's 44 training runs took 484 s, 203 s of them AlexNet's 12 and 281 s ResNet-18's 32,
against 138 s and 122 s of predicted steps); ``--check-s`` what one link check costs (5-55 s on 2 cores,
a median of 22 s over the 36 checks of a ResNet-50/22K slice; the more the larger the D it has to try).
Concurrent workloads are not counted. ``--side-by-side`` also packs the runs as the workflow starts them beside
each other (:mod:`ralp_pipe.workflow.resources`: a modelled run's cores and its links' shaped load within the
machine's cores and the link budget; each run's D as given, though the workflow's checks certify D beside that
budget, which may raise it): the makespan of starting each run, in the matrix's order, as soon as it fits.
Whatever the D, a run's bytes cross emulated links that this machine's kernel shapes, and it shapes a limited rate
accurately in all (the link budget, 6 Gbit/s on 2 cores, is what the checks certify runs beside each other at): so
the bytes the runs send (the planner's GB/step, which train checks against its counters, x the steps) over
``--capacity`` bound the training wall time from below, however the runs are compressed and packed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

from ralp_pipe.config import AUTO_FACTOR, load
from ralp_pipe.config.units import rate_bits_per_s
from ralp_pipe.contract.records import Profile
from ralp_pipe.contract.topology import hosts_of
from ralp_pipe.engine import devicemodel, models
from ralp_pipe.errors import ConfigError
from ralp_pipe.planning.planner import dtf_options, pipelining_of, whole_variables
from ralp_pipe.planning.profiling import profile_batches
from ralp_pipe.planning.simulate import Grid, Servers, simulate
from ralp_pipe.workflow.matrix import Matrix, Run, parse_settings
from ralp_pipe.workflow.resources import LINK_BUDGET, budget_mbps, cpu_units, link_units, train_demand


def step_times(base: list[str], dataset: str, model: str, gpus: list[int], gbit: list[float]) -> pd.DataFrame:
    """Predicted target step time per strategy, N, link speed and overlap for one (dataset, model) pair."""
    cfg = load([*base, f"dataset={dataset}", f"model={model}"])
    batches = profile_batches(cfg.train.batch_size, [n for n in gpus if n > 1] or [2])
    profile = Profile.from_dict(devicemodel.modelled_profile(cfg, batches, max(gpus)), "modelled").to_dict()
    units = models.placement_units(models.build(model, cfg.dataset.num_classes, cfg.model.dropout))
    frames = []
    for overlap, pipelining in ((True, pipelining_of(cfg)), (False, None)):
        # ps as the experiment configures it; dtf and byteps one PS per worker host, as the strategy table deploys them
        servers = Servers(cfg.strategy.num_ps, cfg.strategy.ps_placement == "colocated", None, pipelining)
        variables = whole_variables(units, dtf_options(cfg))
        frame = simulate(
            profile, units, cfg.train.batch_size, Grid(gpus, gbit, 0.0), servers, hosts_of(cfg), variables=variables
        )
        frames.append(frame.assign(overlap=overlap))
    return pd.concat(frames)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="paper-dilated")
    parser.add_argument("--start-s", type=float, default=5.0, help="seconds a run costs besides its steps")
    parser.add_argument("--check-s", type=float, default=25.0, help="seconds one check_links job costs")
    parser.add_argument(
        "--factor", nargs="*", default=[], help="NETWORK[:PATTERN[:HOSTS]]=D where dilation.factor is auto"
    )
    parser.add_argument("--checks", type=Path, help="folder of link-check records: <network>/<pattern>-h<hosts>.json")
    parser.add_argument("--side-by-side", action="store_true", help="also the wall time with runs side by side")
    parser.add_argument("--cores", type=int, default=2, help="cores of the machine (--side-by-side)")
    parser.add_argument(
        "--capacity", nargs="*", default=[LINK_BUDGET], help="rates the emulated links carry in all, for the bound"
    )
    parser.add_argument("--overrides", nargs="*", default=[], help="Hydra overrides, e.g. 'experiment.repeats=1'")
    args = parser.parse_args()
    try:
        return estimate(args, parser)
    except ConfigError as exc:  # a wrong experiment, override or rate: its message names it
        parser.exit(2, f"{parser.prog}: {exc}\n")


def estimate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Print the estimate and the bound for the parsed `args` (`parser` reports a missing --factor)."""
    matrix = Matrix(parse_settings({"experiment": args.experiment, "overrides": args.overrides}))
    overrides = [f"experiment={args.experiment}", *args.overrides]
    base = load(overrides)
    given = {k: float(v) for k, v in (item.split("=", 1) for item in args.factor)}
    gbit = {n: rate_bits_per_s(load([f"network={n}"]).network.rate) / 1e9 for n in {r.network for r in matrix.runs}}

    def factor_of(run: Run) -> float:
        """The run's D: fixed, its link check's record under --checks, or --factor's most specific entry."""
        if base.dilation.factor != AUTO_FACTOR:
            return float(base.dilation.factor)
        record = _check_of(matrix, run, args.checks)
        if record is not None and record.is_file():
            return float(json.loads(record.read_text())["factor"])
        hosts, pattern = (matrix.link_fields(run)[k] for k in ("hosts", "pattern"))
        for key in (f"{run.network}:{pattern}:{hosts}", f"{run.network}:{pattern}", run.network):
            if key in given:
                return given[key]
        parser.error(f"dilation.factor is auto in experiment {args.experiment}: give --factor {run.network}=D")

    steps = base.train.warmup_steps + base.train.measure_steps
    by_pair: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in matrix.runs:
        by_pair[run.dataset, run.model].append(run)
    total, sent_gb, lines, jobs = 0.0, 0.0, [], []
    by_factor: dict[tuple[str, str, float], int] = defaultdict(int)
    by_slice: dict[tuple[str, int], float] = defaultdict(float)  # (network, N) -> seconds
    for (dataset, model), runs in sorted(by_pair.items()):
        gpus = sorted({max(r.gpus, 2) for r in runs})
        times = step_times(overrides, dataset, model, gpus, sorted(set(gbit.values())))
        seconds = 0.0
        for run in runs:
            n = max(run.gpus, 2)  # the reference: one worker's step, priced as allreduce's compute without a ring
            row = times[
                (times.strategy == run.strategy)
                & (times.gpus == n)
                & (times.link_gbit == gbit[run.network])
                & (times.overlap == run.overlap)
            ].iloc[0]
            step = row.compute_s + row.server_s if run.gpus == 1 else row.step_time_s
            d = factor_of(run)
            took = args.start_s + steps * d * step
            sent_gb += 0.0 if run.gpus == 1 else steps * row.gb_per_step
            seconds += took
            by_factor[run.network, matrix.link_fields(run)["pattern"], d] += 1
            by_slice[run.network, run.gpus] += took
            if args.side_by_side:
                demand = train_demand(matrix.config(run), {"factor": d, "budget": LINK_BUDGET})
                jobs.append((took, cpu_units(demand, args.cores), link_units(demand)))
        total += seconds
        lines.append(f"  {dataset:<14} {model:<10} {len(runs):4d} runs  {seconds / 60:7.1f} min")
    checks = len({path for run in matrix.runs for path in matrix.link_check(run)})
    total += checks * args.check_s
    print(f"experiment {args.experiment}: {len(matrix.runs)} training runs, {steps} steps each")
    print(
        "  runs per network, pattern and D: "
        + ", ".join(f"{n} {p} D={d:g}: {c}" for (n, p, d), c in sorted(by_factor.items()))
    )
    print("\n".join(lines))
    print(
        "  minutes per network and N: "
        + ", ".join(f"{n} N={g}: {t / 60:.0f}" for (n, g), t in sorted(by_slice.items()))
    )
    print(f"  {checks} link checks ({args.check_s:g} s each)  {checks * args.check_s / 60:7.1f} min")
    print(
        f"estimated training wall time, serial: {total:.0f} s ({total / 3600:.2f} h), {args.start_s:g} s per run "
        "besides its steps"
    )
    for capacity in args.capacity:
        bound = sent_gb * 8e9 / budget_mbps(capacity) / 1e6
        print(
            f"bytes the runs send through emulated links: {sent_gb / 1e3:.3g} TB; at {capacity} in all, at least "
            f"{bound:.0f} s ({bound / 3600:.2f} h) of training wall time, whatever D and packing"
        )
    if args.side_by_side:
        packed = side_by_side(jobs, 1000 * args.cores, budget_mbps()) + checks * args.check_s
        print(
            f"estimated training wall time, side by side ({args.cores} cores, {LINK_BUDGET} of links): {packed:.0f} s "
            f"({packed / 3600:.2f} h); link checks serial, each run's D as measured alone"
        )
    return 0


def side_by_side(jobs: list[tuple[float, int, int]], cores: int, links: int) -> float:
    """The makespan of `jobs` ((seconds, millicores, link Mbit/s), in order) started first-fit whenever their cores
    and link load fit beside the jobs running, as Snakemake starts them within its resources."""
    waiting, running, now = list(jobs), [], 0.0  # running: (ends at, millicores, Mbit/s)
    while waiting or running:
        for job in list(waiting):
            used = (sum(r[1] for r in running), sum(r[2] for r in running))
            if used[0] + job[1] <= cores and used[1] + job[2] <= links:
                running.append((now + job[0], job[1], job[2]))
                waiting.remove(job)
        now = min(r[0] for r in running)
        running = [r for r in running if r[0] > now]
    return now


def _check_of(matrix: Matrix, run: Run, checks: Path | None) -> Path | None:
    """The record a run's D would come from: its network, pattern and hosts' under `checks` (None where none)."""
    if checks is None or not matrix.checks_links(run):
        return None
    fields = matrix.link_fields(run)
    return checks / fields["network"] / f"{fields['pattern']}-h{fields['hosts']}.json"


if __name__ == "__main__":
    sys.exit(main())
