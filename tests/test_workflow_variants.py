"""The default's extra configurations: a model's own networks, variants of selected runs (their rows, configs and
commands) and this machine's measured profile planned beside the target's."""

from __future__ import annotations

import json
import re

import pytest

from ralp_pipe.config import ConfigError
from ralp_pipe.workflow.matrix import Matrix, parse_settings

SMOKE = ["experiment.models=[resnet18,alexnet]", "experiment.gpus=[2,4]", "train.image_size=64"]
REAL = ["model=resnet18", "strategy=ralp_n", "cluster.gpus=2", "dilation.mode=real", "dilation.factor=16"]


def _matrix(*overrides: str, experiment: str = "smoke") -> Matrix:
    return Matrix(parse_settings({"experiment": experiment, "overrides": [*SMOKE, *overrides]}))


def _variant(name: str, *overrides: str) -> str:
    """The override adding experiment.variants.<name> (its overrides quoted for Hydra's grammar)."""
    return f"+experiment.variants.{name}=[{','.join(repr(o) for o in overrides)}]"


@pytest.mark.slow
def test_networks_by_model_narrows_a_model_to_its_own_networks_and_refuses_a_model_left_with_none() -> None:
    both = ["experiment.networks=[loopback,1gbit]"]
    every = _matrix(*both)
    own = _matrix(*both, "+experiment.networks_by_model.alexnet=[1gbit]", "experiment.reference=true")
    assert {r.network for r in every.runs if r.model == "alexnet"} == {"loopback", "1gbit"}
    assert {r.network for r in own.runs if r.model == "alexnet"} == {"1gbit"}  # its N=1 reference's too
    assert {r.network for r in own.runs if r.gpus == 1} == {"loopback", "1gbit"}
    resnet = [r for r in own.runs if r.model == "resnet18" and r.gpus > 1]
    assert resnet == [r for r in every.runs if r.model == "resnet18"]
    with pytest.raises(ConfigError, match=re.escape("networks_by_model.alexnet=['10gbit']")):
        _matrix(*both, "+experiment.networks_by_model.alexnet=[10gbit]")


def test_a_variant_reruns_the_runs_it_selects_with_its_overrides_in_rows_of_its_own() -> None:
    matrix = _matrix(_variant("real", *REAL), "experiment.repeats=2", "dilation.factor=8", "dilation.mode=modelled")
    real = [r for r in matrix.runs if r.variant]
    assert [(r.model, r.strategy, r.gpus, r.repeat, r.arm) for r in real] == [
        ("resnet18", "ralp_n", 2, k, "ralp_n-real") for k in (0, 1)
    ]
    twin = next(r for r in matrix.runs if not r.variant and (r.model, r.strategy, r.gpus) == ("resnet18", "ralp_n", 2))
    cfg, base = matrix.config(real[0]), matrix.config(twin)
    assert (cfg.dilation.mode, cfg.dilation.factor, cfg.train.variant) == ("real", 16, "real")
    assert base.train.variant is None and base.dilation.factor != 16
    assert matrix.path("run", real[0]).endswith("/resnet18/n2-loopback/ralp_n-real/r0")
    # training alone changes: the variant reads the twin's shards, plan and profile
    for stage in ("prepare_shards", "profile", "plan"):
        assert matrix.stage_params(stage, real[0]) == matrix.stage_params(stage, twin)
    args = matrix.stage_args("train", real[0])
    assert {"dilation.mode=real", "dilation.factor=16", "train.variant=real"} <= set(args)
    assert not {"model=resnet18", "cluster.gpus=2"} & set(args[args.index("dilation.mode=real") :])  # selectors


@pytest.mark.slow
def test_a_variant_that_changes_a_plan_s_key_or_selects_nothing_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"variants.big changes train.batch_size \(2 -> 4\), which the profile stage reads"
    ):
        _matrix(_variant("big", "model=resnet18", "train.batch_size=4"))
    with pytest.raises(ConfigError, match=r"variants.on changes dilation.factor \(None -> 16\)"):
        _matrix(_variant("on", "model=resnet18", "dilation.factor=16"))  # an undilated plan prices this host's link
    with pytest.raises(ConfigError, match=r"variants.none selects no run"):
        _matrix(_variant("none", "model=resnet18", "cluster.gpus=8"))
    with pytest.raises(ConfigError, match="sequential ablation"):
        _matrix(_variant("sequential", "model=resnet18"))


@pytest.mark.slow
def test_measured_profiles_add_a_profile_measured_here_and_its_plan_beside_the_targets() -> None:
    matrix = _matrix("experiment.target=v100", "+experiment.measured_profiles=[alexnet]")
    [run] = matrix.measured_runs
    assert (run.model, run.gpus) == ("alexnet", 2)
    measured, modelled = matrix.path("measured_profile", run), matrix.path("profile", run)
    assert "/profiles/measured/alexnet/" in measured and "-target-" not in measured and "-target-v100-" in modelled
    assert matrix.path("measured_plan", run).endswith("profiles/measured/plans/synthetic1k/alexnet/n2-loopback.json")
    args = matrix.measured_args("profile", run)
    assert args[-1] == "experiment.target=null" and sum(a.startswith("experiment.target=") for a in args) == 1
    assert matrix.measured_args("plan", run) == matrix.stage_args("plan", run)
    assert json.loads(matrix.measured_params("profile", run))["config"]["experiment.target"] is None
    wildcards = {"dataset": "synthetic1k", "model": "alexnet", "gpus": "2", "network": "loopback"}
    assert matrix.measured_run("plan", wildcards) == run
    with pytest.raises(ConfigError, match="experiment.target is null"):
        _matrix("+experiment.measured_profiles=[alexnet]")


@pytest.mark.slow
def test_the_default_experiment_shows_every_stage_for_real() -> None:
    """The default: a real-mode configuration and its modelled twin at the same D, read through DALI; this
    machine's profile beside the V100's; one model on two links, so the headline plot draws lines."""
    matrix = Matrix(parse_settings({}))
    real = [r for r in matrix.runs if r.variant and matrix.config(r).dilation.mode == "real"]
    assert real and all(matrix.config(r).train.loader == "dali" for r in real)
    factor = matrix.config(real[0]).dilation.factor
    twins = [r for r in matrix.runs if r.variant and r != real[0] and r.arm != real[0].arm]
    assert any(
        matrix.config(r).dilation.mode == "modelled" and matrix.config(r).dilation.factor == factor for r in twins
    )
    assert matrix.measured_runs
    links: dict[str, set[str]] = {}
    for r in matrix.runs:
        links.setdefault(r.model, set()).add(r.network)
    assert max(len(networks) for networks in links.values()) >= 2
