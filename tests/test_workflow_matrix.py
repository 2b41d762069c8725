"""The experiment matrix: configs per run, per-stage overrides and params, refusal of unsafe values."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from ralp_pipe.config import CONFIG_DIR, ConfigError, load, to_dict
from ralp_pipe.engine.train import with_plan
from ralp_pipe.workflow.matrix import STAGE_DIMS, STAGE_KEYS, Matrix, parse_settings, select
from workflow_helpers import snakemake

# The networks config/experiment/local.yaml names, read without composing (no fallback can touch them).
LOCAL_NETWORKS = set(yaml.safe_load((CONFIG_DIR / "experiment" / "local.yaml").read_text())["experiment"]["networks"])


@pytest.fixture(scope="module")
def local() -> Matrix:
    return Matrix(parse_settings({"experiment": "local", "overrides": ["train.measure_steps=7"]}))


@pytest.mark.slow  # the 36-run local matrix (~2.4 s fixture) against full compositions
def test_every_run_config_equals_a_full_composition(local: Matrix) -> None:
    e = local.base.experiment
    rows = len(e.strategies) + len(e.sequential) + e.reference  # + the N=1 reference row
    assert len(local.runs) == len(e.pairs) * rows * e.repeats  # (dataset, model) pairs x strategy rows x repeats
    assert {(r.dataset, r.model) for r in local.runs} == {tuple(pair) for pair in e.pairs}
    for run in [*local.runs[::7], local.runs[-1]]:  # the last: a reference run
        full = load(
            [
                "experiment=local",
                "train.measure_steps=7",
                f"dataset={run.dataset}",
                f"model={run.model}",
                f"strategy={run.strategy}",
                f"network={run.network}",
                f"cluster.gpus={run.gpus}",
                f"strategy.plan=results/plans/{run.dataset}/{run.model}/n{run.gpus}-{run.network}.json",
                f"strategy.overlap={str(run.overlap).lower()}",
                f"train.repeat={run.repeat}",
                *(["train.cpu_share=5"] if run.gpus == 1 else []),  # ps at N=4: the largest run, 5 ranks
            ]
        )
        assert to_dict(local.config(run)) == to_dict(full)


@pytest.mark.slow  # composes two smoke matrices (~3 s)
def test_repeats_and_the_sequential_ablation_are_runs_of_their_own_with_their_own_rerun_keys() -> None:
    """Raising experiment.repeats keeps every earlier run's path and params (Snakemake reruns none of them)."""
    extra = ["experiment.sequential=[ps]"]
    two = Matrix(parse_settings({"experiment": "smoke", "overrides": [*extra, "experiment.repeats=2"]}))
    three = Matrix(parse_settings({"experiment": "smoke", "overrides": [*extra, "experiment.repeats=3"]}))
    assert len(two.runs) == 5 * 2 and len(three.runs) == 5 * 3  # 4 strategies + ps-sequential
    paths = {two.path("run", run): two.stage_params("train", run) for run in two.runs}
    again = {three.path("run", run): three.stage_params("train", run) for run in three.runs}
    assert {p: again[p] for p in paths} == paths  # experiment.repeats is no key of a run's train stage
    assert sorted(set(again) - set(paths)) == sorted(
        f"results/runs/synthetic1k/resnet18/n2-loopback/{arm}/r2"
        for arm in ("ps", "allreduce", "ralp_h", "ralp_n", "ps-sequential")
    )
    sequential = three.first(arm="ps-sequential", repeat="1")
    assert three.config(sequential).strategy.overlap is False and three.config(sequential).train.repeat == 1
    assert three.stage_args("train", sequential)[-2:] == ["strategy.overlap=false", "train.repeat=1"]
    assert three.config(three.first(arm="ps", repeat="1")).strategy.overlap is True
    with pytest.raises(ConfigError, match=r"experiment.sequential\[\]='ralp_x' is not allowed"):
        Matrix(parse_settings({"experiment": "smoke", "overrides": ["experiment.sequential=[ralp_x]"]}))
    with pytest.raises(ConfigError, match="experiment.repeats=0 must be at least 1"):
        Matrix(parse_settings({"experiment": "smoke", "overrides": ["experiment.repeats=0"]}))


@pytest.mark.slow  # composes four smoke matrices (~3 s)
def test_the_reference_is_one_single_device_run_per_dataset_model_and_repeat_with_a_rank_share_of_threads() -> None:
    """experiment.reference adds allreduce at N=1 on the first network; its rank computes with the CPU share of
    one rank of the largest run (ps at N=2: 2 workers + 1 PS), so the ideal line is N x what one such rank does."""
    overrides = ["experiment.reference=true", "experiment.repeats=2", "experiment.networks=[loopback,1gbit]"]
    matrix = Matrix(parse_settings({"experiment": "smoke", "overrides": [*overrides, "cluster=emulated"]}))
    references = [run for run in matrix.runs if run.gpus == 1]
    assert [(r.strategy, r.network, r.repeat) for r in references] == [
        ("allreduce", "loopback", 0),
        ("allreduce", "loopback", 1),
    ]
    assert all(matrix.config(r).train.cpu_share == 3 for r in references)
    assert matrix.stage_args("train", references[1])[-2:] == ["train.repeat=1", "train.cpu_share=3"]
    assert matrix.path("plan", references[0]) == "results/plans/synthetic1k/resnet18/n1-loopback.json"
    assert {matrix.config(r).train.cpu_share for r in matrix.runs if r.gpus != 1} == {None}
    explicit = Matrix(parse_settings({"experiment": "smoke", "overrides": [*overrides, "train.cpu_share=7"]}))
    assert {explicit.config(r).train.cpu_share for r in explicit.runs} == {7}  # the user's share wins
    assert not [r for r in Matrix(parse_settings({"experiment": "smoke"})).runs if r.gpus == 1]
    with pytest.raises(ConfigError, match="train.cpu_share=0 must be at least 1"):
        Matrix(parse_settings({"experiment": "smoke", "overrides": ["train.cpu_share=0"]}))


@pytest.mark.slow  # uses the 36-run local matrix (~2.4 s fixture)
def test_each_stage_composes_the_params_it_is_keyed_by(local: Matrix) -> None:
    run = local.runs[-1]
    for stage, keys in STAGE_KEYS.items():
        params = json.loads(local.stage_params(stage, run))
        composed = load(local.stage_args(stage, run))
        if stage == "train":  # its rule adds --plan, the plan stage's output
            composed = with_plan(composed, Path(local.path("plan", run)))
        assert select(to_dict(composed), keys) == params["config"], stage


@pytest.mark.slow  # composes two smoke matrices (~2.8 s in the suite)
def test_overrides_reach_only_the_stages_that_read_them() -> None:
    settings = parse_settings({"experiment": "smoke", "overrides": "train.measure_steps=9 dataset.synthetic.seed=3"})
    matrix = Matrix(settings)
    run = matrix.runs[0]
    assert "train.measure_steps=9" in matrix.stage_args("train", run)
    assert all("train.measure_steps=9" not in matrix.stage_args(s, run) for s in ("prepare_shards", "profile", "plan"))
    assert "dataset.synthetic.seed=3" in matrix.stage_args("prepare_shards", run)
    assert "dataset.synthetic.seed=3" not in matrix.stage_args("profile", run)
    assert matrix.stage_args("prepare_shards", run) == [
        "experiment=smoke",
        "dataset=synthetic1k",
        "dataset.synthetic.seed=3",
    ]
    assert set(STAGE_DIMS) == set(STAGE_KEYS)
    fast = Matrix(parse_settings({"experiment": "smoke", "stage_options": {"profile": "--repeats 1"}}))
    assert fast.stage_args("profile", run)[:2] == ["--repeats", "1"]
    assert "--repeats" not in fast.stage_args("plan", run)


@pytest.mark.slow  # composes a smoke matrix (~1.4 s in the suite)
def test_slurm_launcher_trains_with_cluster_slurm_and_asks_one_task_per_rank() -> None:
    matrix = Matrix(
        parse_settings(
            {
                "experiment": "smoke",
                "launcher": "slurm",
                "overrides": ["cluster.slurm.mem_mb=1500", "cluster.slurm.partition=debug"],
            }
        )
    )
    ps = matrix.first(strategy="ps")
    assert "cluster=slurm" in matrix.stage_args("train", ps)
    assert matrix.config(ps).cluster.kind == "slurm"
    assert "cluster=slurm" in matrix.stage_args("profile", ps)
    assert "cluster.slurm.mem_mb=1500" not in matrix.stage_args("profile", ps)
    assert matrix.stage_args("prepare_shards", ps) == ["experiment=smoke", "dataset=synthetic1k"]
    resources = matrix.slurm_resources(ps, "train")
    assert resources["tasks"] == 3 and resources["mem_mb"] == 1500 and resources["slurm_partition"] == "debug"
    assert matrix.slurm_resources(matrix.first(strategy="ralp_h"), "train")["tasks"] == 2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"overrides": ["model=vgg16"]}, "would fight the experiment matrix"),
        ({"overrides": ["experiment=paper"]}, "would fight the experiment matrix"),
        ({"colour": "blue"}, "'colour' was unexpected"),
        ({"launcher": "pbs"}, "'pbs' is not one of \\['local', 'slurm'\\]"),
        ({"dataset_overrides": {"synthetic1k": ["train.lr=1"]}}, "is not a dataset.\\* override"),
        ({"dataset_overrides": {"imagenet1k": ["dataset.source=/x"]}}, "not in experiment.datasets"),
        ({"stage_options": {"train": "rm -rf x"}}, "must start with an option"),
        ({"stage_options": {"shell": "--x"}}, "'shell' is not one of"),
        ({"overrides": ["experiment.pairs=[[synthetic1k,vgg11]]"]}, r"pairs has \['synthetic1k', 'vgg11'\]"),
        ({"overrides": ["experiment.pairs=[[synthetic1k]]"]}, "each pair is \\[dataset, model\\]"),
    ],
)
def test_bad_workflow_settings_are_refused(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Matrix(parse_settings({"experiment": "smoke", **config}))


@pytest.mark.slow  # two snakemake subprocesses
def test_missing_dataset_path_fails_before_any_stage_naming_it(tmp_path: Path) -> None:
    result = snakemake(tmp_path, "--cores", "1", config={"experiment": "paper"})
    assert result.returncode != 0
    assert "dataset.source is missing for dataset 'imagenet1k'" in result.stdout + result.stderr
    bad = tmp_path / "no-such-imagenet"
    result = snakemake(
        tmp_path,
        "--cores",
        "1",
        config={"experiment": "paper", "dataset_overrides": {"imagenet1k": [f"dataset.source={bad}"]}},
    )
    assert f"dataset.source='{bad}'" in result.stdout + result.stderr and result.returncode != 0
    assert not (tmp_path / "results").exists()


@pytest.mark.slow  # a snakemake subprocess per case
@pytest.mark.parametrize(
    "override",
    [
        "model.name=vgg11; touch {marker}",
        "experiment.models=['vgg11; touch {marker}']",
        "network.name=$(touch {marker})",
    ],
)
def test_shell_metacharacters_in_config_values_are_refused_and_never_run(tmp_path: Path, override: str) -> None:
    marker = tmp_path / "pwned"
    result = snakemake(
        tmp_path, "--cores", "1", config={"experiment": "smoke", "overrides": [override.format(marker=marker)]}
    )
    assert result.returncode != 0
    assert "configuration error" in result.stdout + result.stderr
    assert not marker.exists() and not (tmp_path / "results").exists()


@pytest.mark.slow  # a snakemake subprocess whose three ready jobs fail at once
def test_a_job_that_never_started_shows_no_log_of_an_earlier_run(tmp_path: Path) -> None:
    """Logs of the jobs a run will execute are emptied before any starts: a job that fails before its command
    runs (cancelled while queued) shows no earlier run's success line."""
    config = {
        "experiment": "smoke",
        "overrides": ["experiment.strategies=[allreduce]"],
        "stage_options": {"prepare_shards": "--no-such-option", "profile": "--no-such-option"},  # fail at once
    }
    logs = tmp_path / "results" / "logs"
    stale = [
        logs / "plan/synthetic1k/resnet18/n2-loopback.log",
        logs / "train/synthetic1k/resnet18/n2-loopback/allreduce/r0.log",
    ]
    for log in stale:
        log.parent.mkdir(parents=True)
        log.write_text("an earlier run: done\n")
    result = snakemake(tmp_path, "--cores", "1", config=config)
    assert result.returncode != 0 and "--no-such-option" in (logs / "probe/loopback.log").read_text()
    assert [log.read_text() for log in stale] == ["", ""]  # neither job started, and neither shows the old log


@pytest.mark.slow  # a snakemake dry-run subprocess
def test_values_with_spaces_and_quotes_reach_the_stage_as_one_argument(tmp_path: Path) -> None:
    source = tmp_path / "image net; $(touch pwned) 'x'"
    source.mkdir()
    config = {
        "experiment": "smoke",
        "overrides": ["experiment.datasets=[imagenet1k]"],
        "dataset_overrides": {"imagenet1k": [f'dataset.source="{source}"', "dataset.num_classes=2"]},
    }
    result = snakemake(tmp_path, "--dry-run", "--printshellcmds", "--cores", "1", config=config)
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "prepare-shards" in x)
    quoted = os.popen(f"printf '%s\\n' {line.split('prepare-shards', 1)[1].split('>')[0]}").read().splitlines()
    assert f'dataset.source="{source}"' in quoted and not (tmp_path / "pwned").exists()


@pytest.mark.slow  # composes the local matrix (~2.2 s in the suite)
def test_local_experiment_runs_on_the_emulated_network_where_namespaces_exist() -> None:
    matrix = Matrix(parse_settings({"experiment": "local"}))
    assert matrix.base.cluster.kind == "emulated"
    assert "unlimited" not in {matrix.config(run).network.rate for run in matrix.runs}  # every link shaped


@pytest.mark.slow  # composes the local matrix (~1.7 s in the suite)
def test_the_workflow_never_probes_namespaces_while_parsing(monkeypatch) -> None:
    monkeypatch.setenv("RALP_PIPE_EMULATION", "off")  # any probe would now report "unavailable"
    matrix = Matrix(parse_settings({"experiment": "local"}))
    assert matrix.base.cluster.kind == "emulated"
    assert {run.network for run in matrix.runs} == LOCAL_NETWORKS


@pytest.mark.slow  # composes the local matrix (~1.7 s in the suite)
def test_an_explicit_cluster_choice_is_never_replaced(monkeypatch) -> None:
    monkeypatch.setenv("RALP_PIPE_EMULATION", "off")
    matrix = Matrix(parse_settings({"experiment": "local", "overrides": ["cluster=emulated"]}))
    assert matrix.base.cluster.kind == "emulated"
    assert {run.network for run in matrix.runs} == LOCAL_NETWORKS


@pytest.mark.slow  # composes a 64-run matrix (~3 s)
def test_one_compute_profile_per_compute_key_and_one_link_probe_per_network(tmp_path: Path) -> None:
    """imagenet1k and synthetic1k share a class count, so their compute profiles; the network changes
    none; synthetic22k's 21841 classes need their own, and each N its own. Each network is probed once."""
    config = {
        "experiment": "smoke",
        "overrides": [
            "experiment.datasets=[synthetic1k,imagenet1k,synthetic22k]",
            "experiment.gpus=[2,4]",
            "experiment.networks=[1gbit,10gbit]",
        ],
        "dataset_overrides": {
            "imagenet1k": [f"dataset.source={tmp_path}"],
            "synthetic1k": ["dataset.synthetic.seed=5"],
        },
    }
    matrix = Matrix(parse_settings(config))
    profiles = {matrix.path("profile", run) for run in matrix}
    assert sorted(profiles) == [
        f"results/profiles/compute/resnet18/{classes}c-2b-32px-local-auto-n{n}.json"
        for classes in (1000, 21841)
        for n in (2, 4)
    ]
    assert {matrix.path("link", run) for run in matrix} == {
        f"results/profiles/links/{n}.json" for n in ("1gbit", "10gbit")
    }
    assert len({matrix.path("plan", run) for run in matrix}) == 3 * 2 * 2
    key = {"model": "resnet18", "classes": "1000", "batch": "2", "size": "32", "hw": "local-auto", "gpus": "2"}
    assert matrix.job_run("profile", key) == matrix.runs[0]  # the one job of a profile stands for its first run
    synthetic, imagenet = (matrix.first(dataset=d) for d in ("synthetic1k", "imagenet1k"))
    assert "dataset.synthetic.seed=5" in matrix.stage_args("prepare_shards", synthetic)
    assert "dataset.synthetic.seed=5" not in matrix.stage_args("profile", synthetic)  # images it never reads
    assert f"dataset.source={tmp_path}" in matrix.stage_args("profile", imagenet)  # needed to compose


@pytest.mark.slow  # composes three smoke matrices (~4 s)
def test_changing_experiment_gpus_keeps_every_other_n_s_profile_plan_and_runs() -> None:
    """N=2's profile, plan and training runs keep their paths and rerun keys whether experiment.gpus is [2],
    [2,3] or [3,2]; [3] has its own. Only the N=1 reference, one rank of the largest run, follows the largest N."""

    def keys(gpus: str) -> tuple[Matrix, dict[str, str]]:
        overrides = [f"experiment.gpus={gpus}", "experiment.reference=true"]
        matrix = Matrix(parse_settings({"experiment": "smoke", "overrides": overrides}))
        found = {}
        for run in matrix:
            for stage, name in (("profile", "profile"), ("plan", "plan"), ("train", "run")):
                found[matrix.path(name, run)] = matrix.stage_params(stage, run)
        return matrix, found

    (two, alone), (_, more), (three, other) = keys("[2]"), keys("[2,3]"), keys("[3,2]")
    n2 = {path: key for path, key in alone.items() if "-n2" in path or "/n2-" in path}
    assert len(n2) == 1 + 1 + 4  # a profile, a plan, a run per strategy
    assert {path: more[path] for path in n2} == n2 == {path: other[path] for path in n2}
    profile = two.path("profile", two.first(gpus="2"))
    assert profile.endswith("-n2.json") and "cluster.gpus=2" in two.stage_args("profile", two.first(gpus="2"))
    reference = two.first(gpus="1")  # plans from the largest N's profile, with that N's rank share of threads
    assert two.path("profile", reference) == profile and three.path("profile", three.first(gpus="1")).endswith(
        "-n3.json"
    )
    assert alone[two.path("plan", reference)] != more[two.path("plan", reference)]


@pytest.mark.slow  # composes two smoke matrices of four pairs (~3 s)
def test_pairs_run_only_their_datasets_and_models_and_none_is_every_combination() -> None:
    cross = ["experiment.datasets=[synthetic1k,synthetic22k]", "experiment.models=[resnet18,vgg11]"]
    every = Matrix(parse_settings({"experiment": "smoke", "overrides": cross}))
    assert {(r.dataset, r.model) for r in every.runs} == {
        (d, m) for d in ("synthetic1k", "synthetic22k") for m in ("resnet18", "vgg11")
    }
    pairs = "experiment.pairs=[[synthetic22k,resnet18],[synthetic1k,vgg11]]"
    paired = Matrix(parse_settings({"experiment": "smoke", "overrides": [*cross, pairs]}))
    assert {(r.dataset, r.model) for r in paired.runs} == {("synthetic22k", "resnet18"), ("synthetic1k", "vgg11")}
    assert len(paired.runs) == len(every.runs) // 2


@pytest.mark.slow  # composes six smoke matrices (~3 s)
def test_gpus_by_model_narrows_a_model_to_its_own_n_and_refuses_a_model_left_with_none() -> None:
    base = ["experiment.models=[resnet18,alexnet]", "experiment.gpus=[2,4]", "experiment.reference=true"]
    base.append("train.image_size=64")  # AlexNet's smallest
    every = Matrix(parse_settings({"experiment": "smoke", "overrides": base}))
    own = Matrix(parse_settings({"experiment": "smoke", "overrides": [*base, "+experiment.gpus_by_model.alexnet=[4]"]}))
    assert {r.gpus for r in every.runs if r.model == "alexnet"} == {1, 2, 4}
    assert {r.gpus for r in own.runs if r.model == "alexnet"} == {1, 4}  # the reference stays
    assert [r for r in own.runs if r.model == "resnet18"] == [r for r in every.runs if r.model == "resnet18"]
    # an entry narrows: N it lists beyond the experiment's, or a model the experiment does not run, change nothing
    for narrowing in ("alexnet=[4,8]", "vgg11=[2]"):
        more = Matrix(
            parse_settings({"experiment": "smoke", "overrides": [*base, f"+experiment.gpus_by_model.{narrowing}"]})
        )
        assert more.runs == (own if narrowing.startswith("alexnet") else every).runs
    for wrong, named in (
        ("alexnet=[8]", "gpus_by_model.alexnet=[8] has none of experiment.gpus=[2, 4]"),
        ("vgg1=[2]", "'vgg1'"),
    ):
        with pytest.raises(ConfigError, match=re.escape(named)):
            Matrix(parse_settings({"experiment": "smoke", "overrides": [*base, f"+experiment.gpus_by_model.{wrong}"]}))


@pytest.mark.slow  # a snakemake dry-run subprocess
def test_rules_hand_stages_the_exact_paths_of_their_inputs_and_name_logs_from_the_layout(tmp_path: Path) -> None:
    """The train rule passes its input shards and plan as --shards and --plan (no override re-typing the
    plan's path), every --out is the rule's output, and every log is the layout's log path of the job."""
    workload = '["strategy=ps train.loader=synthetic", "strategy=allreduce train.loader=synthetic"]'
    config = {"experiment": "smoke", "overrides": [f"experiment.concurrent=[{workload}]"]}
    matrix = Matrix(parse_settings(config))
    result = snakemake(tmp_path, "--dry-run", "--printshellcmds", "--cores", "1", config=config)
    assert result.returncode == 0, result.stderr
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", result.stdout):
        rule = re.match(r"(?:local)?rule (\w+):\n", block)
        if rule:
            found = {key: re.search(rf"^\s*{key}: (.*)$", block, re.M) for key in ("log", "wildcards", "Shell command")}
            jobs.append((rule[1], *(None if m is None else m[1] for m in found.values())))
    assert {job[0] for job in jobs} >= {"prepare_shards", "profile", "probe", "plan", "train", "concurrent", "bundle"}
    for rule, log, wildcards, command in jobs:
        fields = dict(pair.split("=", 1) for pair in wildcards.split(", ")) if wildcards else {}
        assert log == (None if rule == "all" else matrix.log(rule).format(**fields)), rule
        if rule == "train":
            run = matrix.first(**fields)
            assert command.startswith(
                f"ralp-pipe train --out {matrix.path('run', run)} --shards {matrix.path('shards', run)} "
                f"--plan {matrix.path('plan', run)} "
            ), command
            assert "strategy.plan" not in command
        if rule == "concurrent":  # one job runs every workload, workload i into concurrent/w<i>
            root = os.path.dirname(matrix.path("concurrent", index=0))
            assert command.startswith(f"ralp-pipe concurrent --out {root} --workload "), command
    assert sum(rule == "train" for rule, *_ in jobs) == len(matrix.runs)


@pytest.mark.slow  # composes two paper-dilated matrices (~2 s)
def test_a_modelled_auto_experiment_checks_its_links_once_per_hosts_pattern_and_network() -> None:
    """Every run with the same hosts, pattern and network shares a check_links job (ps at N=2 and RALP-H at N=4:
    3 hosts in a star), whatever its strategy, N, arm, repeat, model or class count; the single-device reference
    and runs with a fixed factor need none."""
    overrides = ["experiment.models=[resnet50]", "experiment.datasets=[synthetic1k,synthetic22k]"]
    matrix = Matrix(parse_settings({"experiment": "paper-dilated", "overrides": overrides}))
    checked = [run for run in matrix if matrix.checks_links(run)]
    assert {run.gpus for run in matrix if not matrix.checks_links(run)} == {1}  # the reference only
    checks = {matrix.link_check(run)[0] for run in checked}
    # per network: a star of 2, 3, 4, 5, 8, 9, 16 and 17 hosts (ps 3/5/9/17, RALP-H 2/3/5/9, RALP-N 2/4/8/16), a ring
    # of 2, 4, 8, 16
    assert len(checks) == 12 * len(matrix.base.experiment.networks)
    ps = matrix.first(strategy="ps", gpus="2", network="25gbit")
    ralp_h = matrix.first(strategy="ralp_h", gpus="4", network="25gbit")
    assert matrix.link_check(ps) == matrix.link_check(ralp_h) == ["results/profiles/factors/25gbit/star-h3.json"]
    ring = matrix.first(strategy="allreduce", gpus="8", network="10gbit")
    assert matrix.link_check(ring) == ["results/profiles/factors/10gbit/ring-h8.json"]
    assert matrix.job_run("check_links", {"network": "25gbit", "pattern": "star", "hosts": "3"}) in (ps, ralp_h)
    args = matrix.stage_args("check_links", ralp_h)
    assert "network=25gbit" in args
    assert not any(a.startswith(("model=", "dataset=", "strategy=", "cluster.gpus=", "train.")) for a in args)
    with pytest.raises(ConfigError, match="has a check_links job for"):
        matrix.job_run("check_links", {"network": "25gbit", "pattern": "ring", "hosts": "3"})
    fixed = Matrix(parse_settings({"experiment": "paper-dilated", "overrides": [*overrides, "dilation.factor=8"]}))
    assert not any(fixed.checks_links(run) for run in fixed)


@pytest.mark.slow  # composes three smoke matrices (~1.5 s)
def test_a_target_device_models_the_profiles_and_its_entry_keys_their_reruns() -> None:
    def matrix(*extra: str) -> Matrix:
        return Matrix(parse_settings({"experiment": "smoke", "overrides": list(extra)}))

    measured, v100 = matrix(), matrix("experiment.target=v100")
    run = measured.runs[0]
    assert "-target-" not in measured.path("profile", run)
    assert "-target-v100-" in v100.path("profile", run)
    assert "experiment.target=v100" in v100.stage_args("profile", run)
    faster = matrix("experiment.target=v100", "device.memory_gbps=1800")
    assert faster.stage_params("profile", run) != v100.stage_params("profile", run)
    assert faster.stage_params("train", run) == v100.stage_params("train", run)


@pytest.mark.slow
def test_a_key_twice_in_the_users_overrides_is_refused_and_stage_commands_give_each_key_once() -> None:
    with pytest.raises(ConfigError, match=r"train.lr is given twice \(train.lr=0.1, then train.lr=0.2\)"):
        parse_settings({"experiment": "smoke", "overrides": ["train.lr=0.1", "train.lr=0.2"]})
    with pytest.raises(ConfigError, match=r"dataset_overrides.imagenet1k \(with overrides\): dataset.source is given"):
        parse_settings({"dataset_overrides": {"imagenet1k": ["dataset.source=/a", "dataset.source=/b"]}})
    with pytest.raises(ConfigError, match=r"\(dataset.shards.workers=1, then dataset.shards.workers=4\)"):
        parse_settings(
            {
                "overrides": ["dataset.shards.workers=1"],
                "dataset_overrides": {"imagenet1k": ["dataset.shards.workers=4"]},
            }
        )
    # the user's strategy.overlap=false, then the matrix's for every run: the command gets it once
    matrix = Matrix(parse_settings({"experiment": "smoke", "overrides": ["strategy.overlap=false", "train.repeat=0"]}))
    run = matrix.runs[0]
    args = matrix.stage_args("train", run)
    assert args.count("strategy.overlap=false") == 1 and args[-1] == "train.repeat=0", args
    assert matrix.config(run).strategy.overlap is False


@pytest.mark.slow
def test_a_concurrent_job_that_places_layers_trains_with_its_configurations_plan() -> None:
    """A RALP job of a workload gets the matrix's plan of its dataset, model, N and network (so it runs the split
    its configuration runs alone in the matrix); ps needs none, nor a job with a split of its own or whose
    configuration the matrix lacks (it keeps strategy.split or the default)."""
    jobs = ["strategy=ps model=resnet18 cluster.gpus=2 network=10gbit"]
    jobs += [f"strategy=ralp_n model=resnet18 cluster.gpus={n} network=10gbit" for n in (2, 4)]
    jobs += ["strategy=ralp_n model=resnet18 cluster.gpus=2 network=10gbit strategy.split=3"]
    elsewhere = "strategy=ralp_n model=resnet18 cluster.gpus=2 network=5gbit"  # ResNet-18 runs on 10gbit only
    workloads = ", ".join("[" + ", ".join(f'"{job}"' for job in group) + "]" for group in (jobs, [elsewhere] * 2))
    matrix = Matrix(parse_settings({"experiment": "dilated", "overrides": [f"experiment.concurrent=[{workloads}]"]}))
    n2, n4 = (matrix.path("plan", matrix.first(model="resnet18", gpus=n, network="10gbit")) for n in ("2", "4"))
    assert matrix.workload_plans(0) == [None, n2, n4, None]
    assert matrix.workload_plans(1) == [None, None]
    args = matrix.concurrent_args()
    assert args[0] == args[2] == "--workload" and args[4] == "experiment=dilated"
    given = json.loads(args[1])
    assert given[0] == jobs[0] and given[1] == f"{jobs[1]} strategy.plan={n2}" and given[3] == jobs[3]
    assert json.loads(args[3]) == [elsewhere] * 2
