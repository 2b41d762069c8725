"""`ralp-pipe <stage> [options] [hydra overrides]`: one entry point per pipeline stage.

Each stage lives in the module named below, which provides ``add_arguments(parser)`` and
``main(args) -> int``. Modules are imported only when their stage runs, so `--help` and light
stages start fast. Hydra overrides (``key=value``, ``group=option``) are collected in
``args.overrides`` and passed to :func:`ralp_pipe.config.load` by the stage.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from types import FrameType
from typing import Sequence

from ralp_pipe.errors import Interrupted, RalpError

STAGES: dict[str, tuple[str, str]] = {
    "prepare-shards": ("ralp_pipe.data.shards", "turn an image collection into webdataset shards"),
    "train": ("ralp_pipe.engine.train", "run one distributed training measurement"),
    "concurrent": ("ralp_pipe.runtime.concurrent_jobs", "run several training jobs at once on one emulated network"),
    "profile": ("ralp_pipe.planning.profiling", "measure per-unit compute, memory and link bandwidth"),
    "plan": ("ralp_pipe.planning.planner", "choose the split point and predict throughput from a profile"),
    "simulate": ("ralp_pipe.planning.simulate", "predict throughput for clusters this machine is not"),
    "aggregate": ("ralp_pipe.results.aggregate", "collect runs into Parquet tables, summaries and plots"),
    "bundle": ("ralp_pipe.results.bundle", "archive results with checksums"),
    "verify": ("ralp_pipe.results.verify", "check a bundle's checksums and recompute its tables"),
}


def _parser(stage: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="ralp-pipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    stage_parsers = {}
    for name, (module, text) in STAGES.items():
        stage_parser = sub.add_parser(name, help=text, description=text)
        if name == stage:
            importlib.import_module(module).add_arguments(stage_parser)
        stage_parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=vgg11 cluster.gpus=4")
        stage_parsers[name] = stage_parser
    return parser, stage_parsers


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the chosen stage and return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    stage = next((a for a in argv if a in STAGES), None)
    parser, stage_parsers = _parser(stage)
    if stage is None or argv.index(stage) > 0:
        parser.parse_args(argv)  # no stage, or options before it: argparse answers (help/usage) and exits
    # The stage's own parser does the intermixed parsing (options between overrides): Python
    # 3.11's parse_intermixed_args refuses a parser that has subparsers.
    args = stage_parsers[stage].parse_intermixed_args(argv[1:])
    args.stage = stage
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return int(importlib.import_module(STAGES[args.stage][0]).main(args) or 0)
    except KeyboardInterrupt:
        return _report(stage, Interrupted(signal.SIGINT))
    except RalpError as exc:
        return _report(stage, exc)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


def _report(stage: str, exc: RalpError) -> int:
    """Print a foreseeable failure as one line on stderr and return its exit status."""
    print(f"ralp-pipe {stage}: {exc.kind}: {exc}", file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
