"""`ralp-pipe <stage> [options] [hydra overrides]`: one entry point per pipeline stage.

Each stage lives in the module the command table names (:data:`ralp_pipe.contract.stages.STAGES`),
which provides ``add_arguments(parser)`` and ``main(args) -> int``. Modules are imported only when
their stage runs, so `--help` and light stages start fast. Hydra overrides (``key=value``, ``group=option``) are collected in
``args.overrides`` and passed to :func:`ralp_pipe.config.load` by the stage, wherever they stand: a token
shaped like one ends an option's list of values (``--gpus 2 4 model=vgg11``); after ``--`` every token is
taken as it stands. A stage module that sets ``CONFIG_ENTRIES = True`` takes the workflow's ``--config``
entries (``KEY=VALUE``) there instead, declaring that positional itself, and checks them itself.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import re
import signal
import sys
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Iterator, Sequence

from ralp_pipe import __version__
from ralp_pipe.contract.stages import STAGES, TOOLS
from ralp_pipe.errors import Interrupted, RalpError, disk_error

# stage -> the module its ranks run where it starts them on this machine (forked from a preloaded server)
LOCAL_RANKS = {"train": "ralp_pipe.engine.rank"}
REDELIVER_S = 0.01  # delay before a swallowed SIGINT/SIGTERM is sent again
# a Hydra override: [+|++]key=value or group=option (key, group: dotted or slashed names, @package), ~key[=value]
OVERRIDE = re.compile(r"(?:\+{0,2}[A-Za-z_][\w.@/-]*=|~[A-Za-z_][\w.@/-]*(?:=|$))", re.ASCII)
START = "make run  (or: snakemake --cores all; `make test` checks the set-up first)"


_RECEIVED: list[int] = []  # the stops the handler raised during the current command (_raise_if_swallowed)


class _Signalled(BaseException):
    """A SIGINT/SIGTERM: a BaseException like KeyboardInterrupt, so `except Exception` (torch's imports) lets it by."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stages_text() -> str:
    """What `ralp-pipe` alone prints: the stages in data-flow order, then the tools, and the command to start with."""
    width = max(map(len, STAGES))
    lines = [f"ralp-pipe {__version__}: the RALP evaluation's stages, in the order data flows through them"]
    for name, (_, text) in STAGES.items():
        if name == TOOLS[0]:
            lines.append("tools:")
        lines.append(f"  {name:<{width}}  {text}")
    lines += ["", "`ralp-pipe STAGE --help` for a stage's options; start with: " + START]
    return "\n".join(lines)


def _parser(
    stage: str | None = None, cfg_only: bool = False
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="ralp-pipe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ralp-pipe {__version__}")
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    stage_parsers = {}
    for name, (module, text) in STAGES.items():
        stage_parser = sub.add_parser(name, help=text, description=text)
        if name == stage:
            importlib.import_module(module).add_arguments(stage_parser)
            _add_cfg(stage_parser, module, cfg_only)
        if "overrides" not in {action.dest for action in stage_parser._actions}:  # noqa: SLF001 (a stage's own)
            stage_parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=vgg11 cluster.gpus=4")
        stage_parsers[name] = stage_parser
    return parser, stage_parsers


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the chosen stage and return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(_stages_text())
        return 0
    stage = next((a for a in argv if a in STAGES), None)
    with _interrupts_raised():  # before the stage module's (seconds long) import, so no signal finds a traceback
        try:
            parser, stage_parsers = _parser(stage, "--cfg" in argv[: argv.index("--") if "--" in argv else None])
            if stage is None or argv.index(stage) > 0:
                parser.parse_args(argv)  # no stage, or options before it: argparse answers (help/usage) and exits
            assert stage is not None
            # The stage's own parser does the intermixed parsing (options between overrides): Python
            # 3.11's parse_intermixed_args refuses a parser that has subparsers.
            args = _parse_stage(stage_parsers[stage], argv[1:])
            args.stage = stage
            module = importlib.import_module(STAGES[args.stage][0])
            _start_rank_server(stage, argv)
            if not getattr(module, "CONFIG_ENTRIES", False):
                from ralp_pipe.config import refuse_repeated  # here, not at the top: `--help` stays fast

                refuse_repeated(args.overrides)
            _raise_if_swallowed()
            if getattr(args, "cfg", False):
                return _print_config(module, args)
            return int(module.main(args) or 0)
        except KeyboardInterrupt:
            return _report(stage, Interrupted(signal.SIGINT))
        except _Signalled as stopped:
            return _report(stage, Interrupted(stopped.signum))
        except RalpError as exc:
            return _report(stage, exc)
        except OSError as exc:  # a full or read-only disk under a stage that does not word it itself
            full = disk_error(exc, f"the output of {stage}", None, "free space there (or write elsewhere) and rerun")
            if full is None:
                raise
            return _report(stage, full)


def _add_cfg(parser: argparse.ArgumentParser, module: str, cfg_only: bool) -> None:
    """``--cfg``: print the configuration the stage composes and exit; where it is given (`cfg_only`), the stage's
    other options are optional."""
    if getattr(importlib.import_module(module), "CONFIG_ENTRIES", False):
        return  # the stage takes the workflow's entries, not Hydra overrides
    parser.add_argument(
        "--cfg", action="store_true", help="print the configuration this command composes (YAML) and exit"
    )
    if cfg_only:
        for action in parser._actions:  # noqa: SLF001 (argparse has no public list of a parser's options)
            action.required = False
        for group in parser._mutually_exclusive_groups:  # noqa: SLF001 (nor of its groups)
            group.required = False


def _print_config(module: Any, args: argparse.Namespace) -> int:
    """Print the configuration `args` compose for the stage of `module` (its own ``composed(args)`` where it adds
    overrides of its own, else :func:`ralp_pipe.config.load` of the overrides) as YAML."""
    from omegaconf import OmegaConf

    from ralp_pipe.config import load, to_dict

    cfg = module.composed(args) if hasattr(module, "composed") else load(args.overrides)
    print(OmegaConf.to_yaml(to_dict(cfg)), end="")
    return 0


def _parse_stage(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse a stage's arguments, taking every token shaped like a Hydra override as one, wherever it stands,
    unless it is the value of an option of fixed arity (``--out a=b``) or follows ``--``."""
    arity = {
        option: action.nargs if isinstance(action.nargs, int) else 0 if action.nargs else 1
        for action in parser._actions  # noqa: SLF001 (argparse has no public list of a parser's options)
        for option in action.option_strings
    }
    overrides, rest, values = [], [], 0
    for index, token in enumerate(argv):
        if token == "--":
            rest += argv[index:]
            break
        if values == 0 and OVERRIDE.match(token):
            overrides.append(token)
            continue
        rest.append(token)
        values = max(values - 1, 0) if values else _values_of(token, arity)
    args = parser.parse_intermixed_args(rest)
    args.overrides = [*overrides, *args.overrides]
    return args


def _values_of(token: str, arity: dict[str, int]) -> int:
    """How many of the next tokens option `token` takes whatever their shape (0: not an option, or a list's)."""
    if not token.startswith("-") or "=" in token:
        return 0
    if token in arity:
        return arity[token]
    prefixed = [option for option in arity if token.startswith("--") and option.startswith(token)]
    return arity[prefixed[0]] if len(prefixed) == 1 else 0  # argparse's abbreviations; ambiguous: it refuses


def _start_rank_server(stage: str | None, argv: list[str]) -> None:
    """For a stage that may start ranks here, start the server they fork from, now that the stage's module (which
    imports theirs) is imported: a fork of this process, so torch and torchvision are imported once per command.

    Not inside a SLURM job, whose ranks srun starts, nor for ``--help``.
    """
    if stage in LOCAL_RANKS and not {"-h", "--help"} & set(argv) and "SLURM_JOB_ID" not in os.environ:
        from ralp_pipe.runtime.process import start_fork_server  # here: the workflow imports STAGES at parse time

        start_fork_server([LOCAL_RANKS[stage]])


@contextmanager
def _interrupts_raised() -> Iterator[None]:
    """SIGINT and SIGTERM stop the stage (unless ignored when we started), even where code swallows exceptions.

    An exception raised in a fork handler, ``__del__`` or weakref callback is only printed as
    "Exception ignored in ..." (Python hands it to ``sys.unraisablehook``), so a signal arriving
    while ``subprocess`` forks a rank would be lost and the run would go on: the hook sends such a
    swallowed signal again to this process's main thread, once the hook has returned.
    """
    signums = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
    _RECEIVED.clear()
    previous = {s: signal.signal(s, _raise_interrupted) for s in signums}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_redeliver, previous_hook)
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    """The SIGINT/SIGTERM handler: raise :class:`_Signalled`, or send the signal again when raising is futile."""
    while frame is not None:
        if frame.f_code is _redeliver.__code__:  # raised inside the hook, it would be swallowed again
            _send_again(signum)
            return
        frame = frame.f_back
    _RECEIVED.append(signum)
    raise _Signalled(signum)


def _raise_if_swallowed() -> None:
    """Raise a stop that :func:`_raise_interrupted` raised but code caught and dropped (a bare ``except:`` in
    some package's import code, say), so the stage stops instead of running on."""
    if _RECEIVED:
        raise _Signalled(_RECEIVED[0])


def _redeliver(previous_hook: Callable[[Any], object], unraisable: Any) -> None:
    """``sys.unraisablehook``: a swallowed :class:`_Signalled` is sent again, anything else goes to `previous_hook`."""
    if isinstance(unraisable.exc_value, _Signalled):
        _send_again(unraisable.exc_value.signum)
    else:
        previous_hook(unraisable)


def _send_again(signum: int) -> None:
    """Send `signum` to this process's main thread in a moment, if :func:`_raise_interrupted` still handles it."""

    def send() -> None:
        if signal.getsignal(signum) is _raise_interrupted:
            signal.pthread_kill(main_thread, signum)

    main_thread = threading.main_thread().ident or 0
    timer = threading.Timer(REDELIVER_S, send)
    timer.daemon = True
    timer.start()


def _report(stage: str | None, exc: RalpError) -> int:
    """Print a foreseeable failure as one line on stderr and return its exit status."""
    print(f"ralp-pipe {stage}: {exc.kind}: {exc}", file=sys.stderr)
    return exc.exit_code


def run() -> None:
    """The ``ralp-pipe`` command: :func:`main`, then :func:`ralp_pipe.runtime.process.exit_now` (a training
    job of the default workflow lasts 10-20 s, of which the interpreter's teardown would be 0.8 s)."""
    from ralp_pipe.runtime.process import exit_now

    exit_now(main())


if __name__ == "__main__":
    run()
