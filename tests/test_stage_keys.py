"""Each stage declares the config keys it reads; the declarations match what its code reads, key for key."""

from __future__ import annotations

import pytest

from ralp_pipe.workflow.matrix import STAGE_KEYS
from support.config_reads import OPAQUE, config_reads

PROFILING = "ralp_pipe.planning.profiling"
# stage -> the functions it enters with the config (module, function, parameter holding the config or None)
ENTRIES = {
    "prepare_shards": [("ralp_pipe.data.shards", "main", None)],
    "profile": [(PROFILING, "main", None)],
    "probe": [("ralp_pipe.planning.link_probe", "link_record", "cfg")],
    "plan": [("ralp_pipe.planning.planner", "main", None)],
    "check_links": [("ralp_pipe.runtime.linkcheck", "main", None)],
    "train": [("ralp_pipe.engine.train", "main", None), ("ralp_pipe.engine.rank", "main", None)],
}
# `ralp-pipe profile` also records the link (the probe's keys) in a compute profile
ALSO_READS = {"profile": STAGE_KEYS["probe"]}


def _covers(key: str, path: str) -> bool:
    return path == key or path.startswith(f"{key}.") or key.startswith(f"{path}.")


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(ENTRIES))
def test_a_stage_declares_every_key_its_code_reads_and_no_other(stage: str) -> None:
    reads = config_reads(ENTRIES[stage])
    declared = STAGE_KEYS[stage]
    assert OPAQUE not in reads, f"{stage} hands the whole config to code the check cannot follow"
    missing = sorted(p for p in reads if not any(_covers(k, p) for k in (*declared, *ALSO_READS.get(stage, ()))))
    unread = sorted(k for k in declared if not any(_covers(k, p) for p in reads))
    assert (missing, unread) == ([], []), f"{stage}: read but not declared {missing}, declared but not read {unread}"


def test_every_workflow_stage_has_entries_here() -> None:
    assert set(ENTRIES) == set(STAGE_KEYS)


def test_the_two_drifts_are_gone() -> None:
    assert "train.weight_decay" in STAGE_KEYS["profile"]
    assert "train.amp" not in STAGE_KEYS["profile"] and "train.amp" not in STAGE_KEYS["plan"]


@pytest.mark.slow  # composes a smoke matrix (~1.4 s)
def test_a_weight_decay_override_reaches_the_profile_job_and_amp_reaches_neither_profile_nor_plan() -> None:
    from ralp_pipe.workflow.matrix import Matrix, parse_settings

    matrix = Matrix(
        parse_settings({"experiment": "smoke", "overrides": ["train.weight_decay=0.001", "train.amp=true"]})
    )
    run = matrix.runs[0]
    assert "train.weight_decay=0.001" in matrix.stage_args("profile", run)
    assert '"train.weight_decay": 0.001' in matrix.stage_params("profile", run)
    for stage in ("profile", "plan"):
        assert "train.amp=true" not in matrix.stage_args(stage, run) and '"train.amp"' not in matrix.stage_params(
            stage, run
        )


@pytest.mark.slow  # composes a smoke matrix (~1.4 s)
def test_hosts_of_several_gpus_reach_the_training_job_with_their_interconnect() -> None:
    """Train validates `cluster.gpus_per_node > 1` against the interconnect: the workflow must hand it both."""
    from ralp_pipe.config import compose
    from ralp_pipe.workflow.matrix import Matrix, parse_settings

    matrix = Matrix(
        parse_settings({"experiment": "smoke", "overrides": ["cluster.gpus_per_node=2", "interconnect=pcie3"]})
    )
    args = matrix.stage_args("train", matrix.runs[0])
    assert "interconnect=pcie3" in args
    assert compose.load(args).interconnect.name == "pcie3"
