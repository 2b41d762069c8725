"""What each rule hands the SLURM executor plugin, read from the workflow's DAG (a dry run), and the
sbatch line the plugin makes of it; impossible requests are refused while the workflow parses."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string

from ralp_pipe.config import ConfigError
from ralp_pipe.workflow.matrix import Matrix, parse_settings
from workflow_helpers import snakemake

# three tests dry-run the whole workflow (3-20 s each on the loaded 2-core machine); the refusals compose the matrix (1-3 s)
pytestmark = pytest.mark.slow

GPUS_PER_NODE = 4
BASE = [
    "experiment.gpus=[2,8,16]",
    "experiment.networks=[fabric]",
    "cluster.device=cuda",
    f"cluster.gpus_per_node={GPUS_PER_NODE}",
    "interconnect=nvlink2",
    "cluster.slurm.mem_mb=3000",
    "cluster.slurm.cpus_per_task=2",
]
# (strategy, N) -> (tasks, nodes, ranks on the fullest node), worked out by hand from the placement the plan prices
# at 4 GPUs per node (cluster.device=cuda: a GPU per rank): workers fill nodes in rank order, a dedicated PS rank
# and RALP's PS device (sized before the plan chooses: on a node of its own, the most nodes) get a node of their own.
# ps: N workers + 1 PS; allreduce: N; ralp_h: N/2 + 1; ralp_n: N - 1 + 1.
EXPECTED = {
    ("ps", 2): (3, 2, 2),
    ("ps", 8): (9, 3, 4),
    ("ps", 16): (17, 5, 4),
    ("allreduce", 2): (2, 1, 2),
    ("allreduce", 8): (8, 2, 4),
    ("allreduce", 16): (16, 4, 4),
    ("ralp_h", 2): (2, 2, 1),
    ("ralp_h", 8): (5, 2, 4),
    ("ralp_h", 16): (9, 3, 4),
    ("ralp_n", 2): (2, 2, 1),
    ("ralp_n", 8): (8, 3, 4),
    ("ralp_n", 16): (16, 5, 4),
}
# the training limit: init_timeout_s 120 + timeout_s 1800 of config/cluster/slurm.yaml = 32 min, + margin_min 10
TRAIN_MINUTES = 42


def dry_run(tmp_path: Path, overrides: list[str]) -> tuple[int, list[dict[str, Any]], str]:
    """Exit status, then every job of a slurm-launcher dry run as {rule, wildcards, resources}, and the log."""
    config = {"experiment": "smoke", "launcher": "slurm", "overrides": overrides}
    result = snakemake(tmp_path, "--dry-run", "--cores", "1", config=config, timeout=240)
    jobs: list[dict[str, Any]] = []
    for line in result.stdout.splitlines():
        line = line.strip()
        if match := re.match(r"^(?:local)?rule (\w+):$", line):
            jobs.append({"rule": match.group(1), "wildcards": {}, "resources": {}})
        elif jobs and (match := re.match(r"^(wildcards|resources): (.*)$", line)):
            pairs = (item.split("=", 1) for item in match.group(2).split(", "))
            jobs[-1][match.group(1)] = {key: _value(value) for key, value in pairs}
    return result.returncode, jobs, result.stdout + result.stderr


def _value(text: str) -> Any:
    return int(text) if re.fullmatch(r"-?\d+", text) else text


class _Resources(dict):
    """Job resources as the plugin reads them: ``.get`` and attributes."""

    __getattr__ = dict.get


def sbatch_line(resources: dict[str, Any]) -> str:
    """The sbatch command snakemake-executor-plugin-slurm builds from a job's resources."""
    job = SimpleNamespace(resources=_Resources(resources), threads=1)
    params = {
        "run_uuid": "job",
        "slurm_logfile": "log",
        "comment_str": "c",
        "account": "",
        "partition": "-p gpu",
        "workdir": "",
    }
    return get_submit_command(job, params) + set_gres_string(job)


def test_every_rule_asks_slurm_for_what_its_job_needs_at_n_2_8_16(tmp_path: Path) -> None:
    status, jobs, log = dry_run(tmp_path, [*BASE, "cluster.slurm.account=proj_1"])
    assert status == 0, log[-4000:]
    submitted = [j for j in jobs if j["rule"] not in ("all", "aggregate", "resolved_config", "bundle")]
    assert submitted and all(j["resources"]["slurm_account"] == "proj_1" for j in submitted)  # sbatch -A
    trains = [j for j in jobs if j["rule"] == "train"]
    assert len(trains) == len(EXPECTED)
    for job in trains:
        w, r = job["wildcards"], job["resources"]
        tasks, nodes, fullest = EXPECTED[w["arm"], w["gpus"]]
        where = (w["arm"], w["gpus"], r)
        assert (r["tasks"], r["nodes"], r["gres"]) == (tasks, nodes, f"gpu:{fullest}"), where
        assert r["mpi"] == "srun" and r["tasks_per_gpu"] == 0 and r["cpus_per_task"] == 2, where
        assert r["mem_mb"] == fullest * 3000 and r["runtime"] == TRAIN_MINUTES, where
        assert r["slurm_extra"] == f"--exclusive --ntasks-per-node={fullest}", where
        line = sbatch_line(r)
        for flag in (f"--nodes={nodes}", f"--ntasks={tasks}", f"--gres=gpu:{fullest}", "--cpus-per-task=2"):
            assert flag in line.split(), (flag, line)
        assert f"-t {TRAIN_MINUTES}" in line and f"--mem {fullest * 3000}" in line and "--exclusive" in line
        assert "--ntasks-per-gpu" not in line and "--gpus=" not in line, line
    profiles = [j["resources"] for j in jobs if j["rule"] == "profile"]
    assert len(profiles) == 3  # one per N
    for profile in profiles:
        assert profile["cpus_per_task"] == 2 and profile["gres"] == "gpu:1" and profile["slurm_extra"] == "--exclusive"
        assert "--cpus-per-task=2" in sbatch_line(profile)  # one rank's CPUs, not the submit host's cores
    (probe,) = [j["resources"] for j in jobs if j["rule"] == "probe"]
    assert (probe["nodes"], probe["tasks"], probe["mpi"]) == (2, 2, "srun")  # across the fabric
    assert probe["slurm_extra"] == "--exclusive --ntasks-per-node=1"
    plans = [j["resources"] for j in jobs if j["rule"] == "plan"]
    assert len(plans) == 3 and all("slurm_extra" not in p and "gres" not in p for p in plans)


def test_a_workstation_runs_the_paper_experiment_without_any_slurm_request_or_check(tmp_path: Path) -> None:
    sources = {}
    for name in ("imagenet1k", "imagenet22k"):
        (tmp_path / name).mkdir()
        sources[name] = [f"dataset.source={tmp_path / name}"]
    config = {"experiment": "paper", "dataset_overrides": sources, "overrides": ["cluster.device=cuda"]}
    result = snakemake(tmp_path, "--dry-run", "--cores", "all", config=config, timeout=240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    asked = {line.strip() for line in result.stdout.splitlines() if line.strip().startswith("resources:")}
    assert asked and not any(word in line for line in asked for word in ("gres", "slurm_", "nodes=", "mpi="))


def test_colocated_parameter_servers_share_their_workers_nodes(tmp_path: Path) -> None:
    status, jobs, log = dry_run(
        tmp_path,
        [*BASE, "experiment.strategies=[ps]", "strategy.ps_placement=colocated", "cluster.slurm.exclusive=false"],
    )
    assert status == 0, log[-4000:]
    found = {j["wildcards"]["gpus"]: j["resources"] for j in jobs if j["rule"] == "train"}
    # N=8: the plan's placement: 8 workers fill 2 nodes of 4 GPUs and the PS rank shares worker 0's node and link
    # (5 ranks there: it shares a GPU, so the run talks over gloo); dedicated puts it on a node of its own
    assert (found[8]["tasks"], found[8]["nodes"], found[8]["gres"]) == (9, 2, "gpu:4")
    assert found[8]["slurm_extra"] == "--ntasks-per-node=5"  # no --exclusive where it is switched off


def test_a_concurrent_workload_asks_one_node_for_all_its_ranks_at_once(tmp_path: Path) -> None:
    """Its jobs run together on an emulated network inside one node: every rank's CPUs and memory, and time
    for each job alone plus the run together (not the submit host's cores, which its threads would ask)."""
    workload = "experiment.concurrent=[['strategy=ps cluster.gpus=2','strategy=ralp_n cluster.gpus=2']]"
    overrides = ["experiment.networks=[fabric]", "cluster.slurm.mem_mb=3000", "cluster.slurm.cpus_per_task=2"]
    status, jobs, log = dry_run(tmp_path, [*overrides, workload])
    assert status == 0, log[-4000:]
    (job,) = [j["resources"] for j in jobs if j["rule"] == "concurrent"]
    # ps at N=2 (2 workers + 1 PS) and ralp_n at N=2 (1 worker + the PS device): 5 ranks; each job's bound is
    # the emulated cluster's init_timeout_s 60 + timeout_s 1800, 3 of them (two alone, then together) + 10 margin
    assert (job["nodes"], job["tasks"], job["cpus_per_task"], job["mem_mb"]) == (1, 1, 10, 15000), job
    assert job["runtime"] == 3 * 31 + 10 and job["slurm_extra"] == "--exclusive", job
    line = sbatch_line(job).split()
    assert "--cpus-per-task=10" in line and "--nodes=1" in line and "--ntasks=1" in line, line
    # a node of 8 CPUs: the 5 ranks share them (as they share this machine's locally); its memory must hold them
    shared = Matrix(parse_settings({"experiment": "smoke", "launcher": "slurm",
                                    "overrides": [*overrides, workload, "cluster.slurm.cpus_per_node=8"]}))  # fmt: skip
    assert shared.concurrent_resources()["cpus_per_task"] == 8
    # a second workload, ps beside itself: one job runs both, the largest's 6 ranks at once, ps and ralp_n alone once
    # a round (ps is in both) and each workload together: 4 bounds
    both = workload.replace("]]", "],['strategy=ps cluster.gpus=2','strategy=ps cluster.gpus=2']]")
    two = Matrix(parse_settings({"experiment": "smoke", "launcher": "slurm", "overrides": [*overrides, both]}))
    assert two.concurrent_resources()["tasks"] == 1 and two.concurrent_resources()["mem_mb"] == 6 * 3000
    assert two.concurrent_resources()["runtime"] == 4 * 31 + 10
    with pytest.raises(ConfigError, match=r"concurrent workload of 2 jobs .* 5 x cluster.slurm.mem_mb=3000 = 15000 MB"):
        Matrix(
            parse_settings(
                {
                    "experiment": "smoke",
                    "launcher": "slurm",
                    "overrides": [*overrides, workload, "cluster.slurm.mem_mb_per_node=12000"],
                }
            )
        )


# ranks of each smoke strategy at N=4 (as EXPECTED): ps 4 workers + 1 PS, allreduce 4, ralp_h 2 + the PS device,
# ralp_n 3 + the PS device
EMULATED_RANKS = {"ps": 5, "allreduce": 4, "ralp_h": 3, "ralp_n": 4}


def test_an_emulated_experiment_keeps_its_cluster_and_runs_each_job_on_one_node() -> None:
    """cluster=emulated under the slurm profile: every job makes its hosts on its one node (one task, the
    ranks' memory, CPUs at most the node's), and no stage composes cluster=slurm."""
    overrides = ["cluster=emulated", "experiment.networks=[1gbit]", "experiment.gpus=[4]",
                 "cluster.slurm.mem_mb=500", "cluster.slurm.cpus_per_node=2"]  # fmt: skip
    matrix = Matrix(parse_settings({"experiment": "smoke", "launcher": "slurm", "overrides": overrides}))
    assert {run.strategy for run in matrix.runs} == set(EMULATED_RANKS)
    for run in matrix.runs:
        ranks, cfg = EMULATED_RANKS[run.strategy], matrix.config(run)
        assert cfg.cluster.kind == "emulated" and "cluster=slurm" not in matrix.stage_args("train", run)
        asked = matrix.slurm_resources(run, "train")
        assert (asked["nodes"], asked["tasks"], asked["cpus_per_task"], asked["mem_mb"]) == (1, 1, 2, ranks * 500)
        assert "mpi" not in asked and asked["slurm_extra"] == "--exclusive", asked  # no srun: ranks in namespaces
        check = matrix.slurm_resources(run, "check_links")  # one rank per host checked (every rank a host: G = 1)
        assert (check["nodes"], check["tasks"], check["mem_mb"], check["slurm_extra"]) == (
            1,
            1,
            ranks * 500,
            "--exclusive",
        )
    probe = matrix.slurm_resources(matrix.runs[0], "probe")
    assert (probe["nodes"], probe["tasks"], probe["mem_mb"]) == (1, 1, 1000) and "mpi" not in probe
    with pytest.raises(ConfigError, match=r"cluster=local.*cluster=slurm, or with cluster=emulated"):
        parse_settings({"experiment": "smoke", "launcher": "slurm", "overrides": ["cluster=local"]})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.slurm.max_nodes=4"], r"training ps at N=16 \(5 node\(s\), up to 4 rank\(s\) on one\) needs 5 nodes"),
        (["cluster.slurm.cpus_per_node=6"], r"asks one node for 4 x cluster.slurm.cpus_per_task=2 = 8 CPUs"),
        (["cluster.slurm.mem_mb_per_node=8000"], r"4 x cluster.slurm.mem_mb=3000 = 12000 MB"),
        (["cluster.slurm.gpus_per_node=4"], r"^cluster.slurm.gpus_per_node is no longer a config key: set cluster"),
    ],
    ids=["max_nodes", "cpus_per_node", "mem_mb_per_node", "old_gpus_key"],
)
def test_a_request_no_node_can_hold_is_refused_with_the_numbers(overrides: list, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        base = [o for o in BASE if o.partition("=")[0] not in {o.partition("=")[0] for o in overrides}]
        Matrix(parse_settings({"experiment": "smoke", "launcher": "slurm", "overrides": [*base, *overrides]}))


def test_the_workflow_refuses_it_while_parsing_in_one_line(tmp_path: Path) -> None:
    status, jobs, log = dry_run(tmp_path, [*BASE, "cluster.slurm.max_nodes=4"])
    assert status != 0 and not jobs
    assert "configuration error: training ps at N=16 (5 node(s), up to 4 rank(s) on one) needs 5 nodes" in log
    assert "Traceback" not in log
