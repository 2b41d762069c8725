"""`ralp-pipe rerun RUN_FOLDER... [KEY=VALUE ...]`: train the given runs again, and redo all that uses them.

Snakemake keeps outputs whose intermediate inputs vanished: deleting a run folder and running the
workflow again does nothing, and the tables and the bundle keep that run's figures. This command
runs the workflow with ``--forcerun`` on the exact outputs of those runs' training jobs, so those
jobs run again and so does everything downstream of them (aggregate, bundle). The KEY=VALUE
entries are the workflow's ``--config`` entries, the same ones that made the runs (e.g.
``experiment=smoke``); each folder must be a run of the experiment they describe, present or deleted.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from ralp_pipe.config import CONFIG_DIR
from ralp_pipe.contract.layout import METRICS_FILE
from ralp_pipe.errors import ConfigError
from ralp_pipe.workflow.matrix import Matrix, parse_settings, run_id

CONFIG_ENTRIES = True  # args.overrides: the workflow's --config entries, not Hydra overrides (ralp_pipe.cli)
SNAKEFILE = CONFIG_DIR.parent / "workflow" / "Snakefile"
SHOWN = 6  # runs of the experiment named when a folder is none of them


def training_outputs(folders: list[Path], config: dict[str, object], workdir: Path) -> list[str]:
    """The metrics file of each run folder, spelt as the workflow's train rule names it (relative to `workdir`
    where the results folder is)."""
    matrix = Matrix(parse_settings(config))
    runs = {run_id(run): run for run in matrix}
    below = (workdir / matrix.results).resolve() / "runs"
    targets = []
    for folder in folders:
        path = (folder if folder.is_absolute() else Path.cwd() / folder).resolve()
        name = path.relative_to(below).as_posix() if path.is_relative_to(below) else None
        if name not in runs:
            some = ", ".join(sorted(runs)[:SHOWN]) + (", ..." if len(runs) > SHOWN else "")
            raise ConfigError(
                f"{folder} is not a run folder of experiment {matrix.settings.experiment!r} (under {below}: "
                f"{some}): give a run folder and the workflow's --config entries that made it, e.g. experiment=smoke"
            )
        targets.append(f"{matrix.path('run', runs[name])}/{METRICS_FILE}")
    return targets


def snakemake_command(args: argparse.Namespace, targets: list[str]) -> list[str]:
    """The snakemake command line that reruns `targets` and everything downstream of them."""
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(args.directory)]
    command += ["--cores", args.cores, *(["--profile", args.profile] if args.profile else [])]
    command += [*(["--dry-run"] if args.dry_run else []), "--forcerun", *targets]
    return command + (["--config", *args.overrides] if args.overrides else [])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe rerun`."""
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_FOLDER", help="run folders (results/runs/...)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="the workflow's --config entries that made the runs, e.g. experiment=smoke",
    )
    parser.add_argument("--cores", default="all", help="snakemake --cores (default all)")
    parser.add_argument("--profile", help="snakemake --profile, e.g. slurm")
    parser.add_argument("--directory", type=Path, default=Path("."), help="the workflow's working folder (default .)")
    parser.add_argument("-n", "--dry-run", action="store_true", help="list the jobs that would run, run none")


def main(args: argparse.Namespace) -> int:
    """Run the workflow again for the given run folders; snakemake's exit status."""
    from snakemake.cli import parse_config

    try:
        config = parse_config(args.overrides)
    except ValueError as exc:
        raise ConfigError(f"{' '.join(args.overrides)}: {exc}") from None
    if not args.directory.is_dir():
        raise ConfigError(f"--directory {args.directory} is not a folder: give the workflow's working folder")
    command = snakemake_command(args, training_outputs(args.runs, config, args.directory.resolve()))
    print("rerun: " + " ".join(command[1:]), flush=True)
    with subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"}) as snake:
        try:
            return snake.wait()
        except BaseException:  # stopped: snakemake stops its jobs on SIGINT; wait for it to have done so
            if snake.poll() is None:
                snake.send_signal(signal.SIGINT)
            snake.wait()
            raise
