"""The command line's front door: `ralp-pipe` alone lists the stages, `--version`, and Hydra overrides accepted
wherever they stand, after an option's list of values included."""

from __future__ import annotations

import argparse
import importlib
import subprocess
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from conftest import RALP_PIPE, Ran
from ralp_pipe import __version__, cli
from ralp_pipe.config import STRATEGY_KINDS
from ralp_pipe.contract.stages import STAGES, TOOLS

LIST_STAGES = ("profile", "plan", "simulate", "aggregate", "bundle")  # the stages with an option taking a list
OVERRIDES = ["model=vgg11", "+train.extra=1", "~dataset.seed", "device/arch=volta"]

ECHO_STAGE = """
import json


def add_arguments(parser):
    parser.add_argument("--gpus", type=int, nargs="+")
    parser.add_argument("--files", nargs="*", default=[])
    parser.add_argument("--maybe", nargs="?")
    parser.add_argument("--out")
    parser.add_argument("--pair", nargs=2)
    parser.add_argument("--flag", action="store_true")


def main(args):
    print(json.dumps({k: v for k, v in vars(args).items() if k != "stage"}, sort_keys=True))
"""


def _list_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.nargs in ("+", "*")]


def _stage_parser(stage: str) -> argparse.ArgumentParser:
    """Stage `stage`'s parser with nothing required, to parse only the options under test."""
    parser = cli._parser(stage)[1][stage]
    for action in parser._actions:
        if action.option_strings:
            action.required = False
    for group in parser._mutually_exclusive_groups:
        group.required = False
    return parser


def test_the_list_stages_are_every_stage_with_a_list_option() -> None:
    with_lists = {stage for stage in STAGES if _list_options(_stage_parser(stage))}
    assert with_lists == set(LIST_STAGES)


@pytest.mark.parametrize("stage", LIST_STAGES)
def test_overrides_after_every_list_option_of_a_real_stage_are_overrides(stage: str) -> None:
    parser = _stage_parser(stage)
    for action in _list_options(parser):
        value = "2" if action.type in (int, float) else "some/path"
        args = cli._parse_stage(parser, [action.option_strings[0], value, value, *OVERRIDES])
        assert args.overrides == OVERRIDES, (stage, action.dest)
        assert len(getattr(args, action.dest)) == 2, (stage, action.dest)


@pytest.fixture
def echo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict]:
    (tmp_path / "echo_stage.py").write_text(ECHO_STAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.STAGES, "plan", ("echo_stage", "test stage"))

    def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
        import json

        capsys.readouterr()
        assert cli.main(["plan", *argv]) == 0
        return json.loads(capsys.readouterr().out)

    return run


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--gpus", "2", "4", "model=vgg11", "dataset=synthetic1k"], {"gpus": [2, 4]}),
        (["model=vgg11", "--gpus", "2", "dataset=synthetic1k", "--flag"], {"gpus": [2], "flag": True}),
        (["--files", "model=vgg11", "dataset=synthetic1k"], {"files": []}),
        (["--files", "a", "b", "model=vgg11", "--maybe", "dataset=synthetic1k"], {"files": ["a", "b"]}),
        (["--gpus", "2", "--maybe", "x", "model=vgg11", "dataset=synthetic1k"], {"gpus": [2], "maybe": "x"}),
    ],
)
def test_overrides_stand_anywhere(echo, capsys, argv: list[str], expected: dict) -> None:
    args = echo(capsys, *argv)
    assert args["overrides"] == ["model=vgg11", "dataset=synthetic1k"]
    assert {key: args[key] for key in expected} == expected


def test_the_value_of_a_fixed_arity_option_stays_its_value_even_shaped_like_an_override(echo, capsys) -> None:
    args = echo(capsys, "--out", "a=b", "--pair", "c=d", "e=f", "--ou", "g=h", "model=vgg11")
    assert (args["out"], args["pair"], args["overrides"]) == ("g=h", ["c=d", "e=f"], ["model=vgg11"])
    args = echo(capsys, "--out=x=y", "model=vgg11")
    assert (args["out"], args["overrides"]) == ("x=y", ["model=vgg11"])


def test_after_a_double_dash_tokens_are_taken_as_they_stand(echo, capsys) -> None:
    args = echo(capsys, "--gpus", "2", "--", "model=vgg11", "dataset=synthetic1k")
    assert (args["gpus"], args["overrides"]) == ([2], ["model=vgg11", "dataset=synthetic1k"])


@pytest.mark.slow  # simulate imports torch and draws two PNGs (~10 s)
def test_simulate_as_its_usage_line_reads_with_a_one_gpu_reference_row(ralp_pipe: Callable[..., Ran], tmp_path) -> None:
    out = tmp_path / "sim"
    argv = ["--target", "v100", "--out", str(out), "--gpus", "1", "2", "--link-gbit", "10", "model=vgg11"]
    ran = ralp_pipe("simulate", *argv, "dataset=synthetic1k")
    assert ran.returncode == 0, ran.stderr
    frame = pd.read_parquet(out / "simulation.parquet")
    assert set(frame.model) == {"vgg11"} and set(frame.num_classes) == {1000}
    one = frame[frame.gpus == 1].set_index("strategy")
    # the strategy table's fewest devices: RALP needs 2 (its PS device and a worker), allreduce runs on 1
    assert set(one.index) == {name for name, kind in STRATEGY_KINDS.items() if kind.min_gpus == 1}
    assert {"allreduce", "ps"} <= set(one.index) and not {"ralp_h", "ralp_n"} & set(one.index)
    assert one.loc["allreduce", "comm_s"] == 0 and one.loc["allreduce", "gb_per_step"] == 0
    assert set(frame[frame.gpus == 2].strategy) == set(STRATEGY_KINDS)


def test_simulate_still_refuses_zero_gpus(ralp_pipe: Callable[..., Ran], tmp_path) -> None:
    ran = ralp_pipe("simulate", "--target", "v100", "--out", str(tmp_path / "s"), "--gpus", "0", "2")
    assert ran.returncode != 0 and "--gpus" in ran.stderr and "Traceback" not in ran.stderr


def test_ralp_pipe_alone_lists_the_stages_in_data_flow_order_and_what_to_run(ralp_pipe: Callable[..., Ran]) -> None:
    ran = ralp_pipe()
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("  ")]
    assert listed == list(STAGES)
    flow = ["prepare-shards", "profile", "plan", "check-links", "train", "aggregate", "bundle"]
    assert [s for s in listed if s in flow] == flow
    assert listed[-len(TOOLS) :] == list(TOOLS)
    for name, (_, text) in STAGES.items():
        assert any(line.split()[0:1] == [name] and line.endswith(text) for line in lines), name
    assert "start with: make run" in ran.stdout


def test_version() -> None:
    ran = subprocess.run([str(RALP_PIPE), "--version"], capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout.strip()) == (0, f"ralp-pipe {__version__}")


def test_every_stage_module_provides_the_stage_interface() -> None:
    for stage, (module, _) in STAGES.items():
        loaded = importlib.import_module(module)
        assert callable(loaded.add_arguments) and callable(loaded.main), stage
