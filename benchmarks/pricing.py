"""Configurations priced per second by `ralp-pipe simulate`, this checkout beside a git revision before it.

    python benchmarks/pricing.py [--before REV] [--model vgg16] [--published] [--record docs/records/pricing.json]

Each grid runs as ``ralp-pipe simulate --target v100`` in a fresh interpreter (in-process `cli.main`, timed
after the imports, so start-up is left out): the modelled profile, every strategy's best configuration at every
point, the table and the plots. A configuration is one row of ``simulation.parquet`` (one strategy at one N and
link, the best RALP split and PS-device place included). ``--before REV`` runs the same grids on that revision
(checked out in a temporary git worktree); a grid it does not finish within ``--limit`` seconds is shown as such.
This checkout runs each grid twice, with an empty trace cache (the model traced, as a first call traces it) and with
the trace cached by an untimed run first (``RALP_PIPE_CACHE``, :func:`ralp_pipe.engine.devicemodel.model_trace`),
each in a cache folder of the benchmark's own. Configurations per second are per CPU second of the whole command,
start-up and imports included (steadier than wall seconds on a shared machine, and fair to a side that imports less:
a cached pricing path imports no torch); beside them stand the CPU seconds after the imports and the wall seconds of
the whole command (what a user waits). ``--published`` also times the whole ``benchmarks/published.py`` on every
side. ``--record`` writes the figures as a docs record.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# (name, simulate options): one configuration's point, the paper's range, the whole default grid, hosts of 8
GRIDS = {
    "N=8, 10 Gbit/s": ["--gpus", "8", "--link-gbit", "10"],
    "N=2..16, 7 links": ["--gpus", "2", "4", "8", "16"],
    "default grid": [],
    "default grid, hosts of 8": ["cluster.gpus_per_node=8", "interconnect=nvlink2"],
}
RECIPE = ["train.batch_size=32", "train.image_size=224"]  # the same work on either side, whatever its default


def measure(model: str, options: list[str], out: Path) -> dict[str, float]:
    """CPU and wall seconds of one simulate command in this interpreter, and the configurations it priced."""
    import pandas as pd

    from ralp_pipe import cli
    from ralp_pipe.planning import simulate  # noqa: F401 (imported before the clock starts)

    argv = ["simulate", "--target", "v100", "--out", str(out), f"model={model}", *RECIPE, *options]
    cpu, wall = time.process_time(), time.perf_counter()
    with open(os.devnull, "w") as sink:
        stdout, sys.stdout = sys.stdout, sink
        try:
            status = cli.main(argv)
        finally:
            sys.stdout = stdout
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if status:
        raise SystemExit(f"simulate {' '.join(options)} exited {status}")
    return {"cpu_s": cpu, "wall_s": wall, "rows": len(pd.read_parquet(out / "simulation.parquet"))}


def pricing_alone(model: str) -> dict[str, float]:
    """Milliseconds per configuration of this checkout's `simulate` function alone over the default grid, the
    profile built: without and with `dtf`'s pipelined timeline (the one part whose cost grows with N)."""
    from ralp_pipe.config import load
    from ralp_pipe.contract.topology import hosts_of
    from ralp_pipe.engine import devicemodel
    from ralp_pipe.planning.batches import profile_batches
    from ralp_pipe.planning.planner import dtf_options, pipelining_of, whole_variables
    from ralp_pipe.planning.simulate import GPUS, Grid, Servers, simulate

    cfg = load(devicemodel.target_overrides("v100", ["experiment=paper", f"model={model}"]))
    profile = devicemodel.modelled_profile(cfg, profile_batches(cfg.train.batch_size, GPUS), max(GPUS))
    t = cfg.train
    units = devicemodel.unit_table(model, cfg.dataset.num_classes, t.image_size, cfg.model.dropout, t)
    variables = whole_variables(units, dtf_options(cfg))
    each = {}
    for name, servers in (
        ("sequential transfers", Servers()),
        ("pipelined, dtf's timeline", Servers(pipelining=pipelining_of(cfg, own_links=True))),
    ):
        cpu = time.process_time()
        frame = simulate(profile, units, cfg.train.batch_size, Grid(latency_s=0.0), servers, hosts_of(cfg), variables)
        cpu = time.process_time() - cpu
        each[name] = 1e3 * cpu / len(frame)
        print(f"{model}, default grid, {name}: {len(frame)} configurations, {each[name]:.2f} ms each")
    return each


def run_grid(src: Path, model: str, options: list[str], limit: float, cache: Path) -> dict[str, float] | None:
    """:func:`measure` in a fresh interpreter importing ralp_pipe from `src` and caching traces in `cache`, with the
    wall seconds of the whole command (``command_s``); None past `limit` seconds."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, __file__, "--measure", model, out, *options]
        env = {**os.environ, "PYTHONPATH": str(src), "RALP_PIPE_CACHE": str(cache)}
        started, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=limit, check=True)
        except subprocess.TimeoutExpired:
            return None
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        process_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
        found = json.loads(done.stdout.splitlines()[-1])
        return {**found, "command_s": time.perf_counter() - started, "command_cpu_s": process_cpu}


def run_published(src: Path, limit: float, cache: Path) -> float | None:
    """Wall seconds of the whole ``benchmarks/published.py`` of the checkout at `src` (its parent), traces cached
    in `cache`; None past `limit` seconds."""
    env = {**os.environ, "PYTHONPATH": str(src), "RALP_PIPE_CACHE": str(cache)}
    started = time.perf_counter()
    try:
        subprocess.run([sys.executable, str(src.parent / "benchmarks" / "published.py")], env=env,
                       capture_output=True, timeout=limit, check=True)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    return time.perf_counter() - started


def cell(result: dict[str, float] | None, limit: float) -> str:
    if result is None:
        return f"not done in {limit:g} s"
    rate = result["rows"] / result["command_cpu_s"]
    return (
        f"{int(result['rows'])} in {result['command_cpu_s']:.2f} CPU s: {rate:,.0f}/s "
        f"({result['cpu_s']:.2f} after imports); command {result['command_s']:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a git revision to compare with (run in a temporary worktree)")
    parser.add_argument("--model", default="vgg16")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds a grid may take on either side")
    parser.add_argument("--published", action="store_true", help="also time the whole benchmarks/published.py")
    parser.add_argument("--record", type=Path, help="also write the figures as a docs record (JSON)")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)  # MODEL OUT [options]: one grid, as JSON
    args, rest = parser.parse_known_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], [*args.measure[2:], *rest], Path(args.measure[1]))))
        return
    sides = {"now": ROOT / "src"}
    figures: dict[str, Any] = {"model": args.model, "recipe": RECIPE, "grids": {}, "published_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            tree = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.before], check=True,
                           capture_output=True)  # fmt: skip
            sides = {f"at {args.before}": tree / "src", **sides}
        # every side but this checkout's own runs as it always did (an empty cache: a revision before the cache
        # never reads one); this checkout with an empty cache, then with the trace it wrote
        columns = [(side, src, None) for side, src in sides.items() if side != "now"]
        columns += [("now, empty cache", ROOT / "src", "empty"), ("now, trace cached", ROOT / "src", "kept")]
        kept = Path(tmp) / "kept"
        run_grid(ROOT / "src", args.model, next(iter(GRIDS.values())), args.limit, kept)  # the trace, cached untimed
        try:
            print(f"| {args.model}, batch 32, 224 px | " + " | ".join(c[0] for c in columns) + " |")
            print("|---|" + "---:|" * len(columns))
            for name, options in GRIDS.items():
                results = {}
                for side, src, cache in columns:
                    folder = kept if cache == "kept" else Path(tempfile.mkdtemp(dir=tmp))
                    results[side] = run_grid(src, args.model, options, args.limit, folder)
                figures["grids"][name] = {"options": options, **results}
                print(f"| {name} | " + " | ".join(cell(r, args.limit) for r in results.values()) + " |", flush=True)
            if args.published:
                for side, src, cache in columns:
                    folder = kept if cache == "kept" else Path(tempfile.mkdtemp(dir=tmp))
                    if cache == "kept":
                        run_published(src, args.limit, folder)  # its models traced once, then timed with them
                    figures["published_s"][side] = run_published(src, args.limit, folder)
                print(
                    "| benchmarks/published.py, whole | "
                    + " | ".join(
                        f"{s:.1f} s" if s is not None else f"not done in {args.limit:g} s"
                        for s in figures["published_s"].values()
                    )
                    + " |"
                )
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    figures["pricing_alone_ms"] = pricing_alone(args.model)
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from record import write_record

        write_record(
            args.record,
            figures,
            note="command_cpu_s: CPU seconds of the whole command (the rate's base); cpu_s: after the imports; "
            "command_s: wall seconds, start-up included",
        )


if __name__ == "__main__":
    main()
