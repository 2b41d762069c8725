"""The concurrent stage hands each child `ralp-pipe train` the hosts of the shared cluster on its command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import pytest

from ralp_pipe.config import ConfigError, load
from ralp_pipe.engine import train
from ralp_pipe.runtime import concurrent_jobs
from ralp_pipe.runtime.emulated import emulated_sites
from ralp_pipe.runtime.sites import RankSite

# What EmulatedCluster.share gives for two ranks on hosts 2 and 0 (namespace files of its holders)
SHARED = [
    {
        "namespaces": [f"/proc/{pid}/ns/net"],
        "env": {"GLOO_SOCKET_IFNAME": "eth0", "MASTER_ADDR": "10.213.0.3", "RALP_PIPE_HOST": str(host)},
        "master_addr": "10.213.0.3",
    }
    for pid, host in ((4242, 2), (4240, 0))
]


class SharedCluster:
    """Stands in for the stage's EmulatedCluster: what it shares for a job's hosts."""

    def share(self, hosts_of_ranks: Sequence[int], master_host: int) -> list[dict[str, Any]]:
        assert (list(hosts_of_ranks), master_host) == ([2, 0], 2)
        return SHARED


def test_each_job_gets_its_hosts_as_an_option_and_no_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[list[str], Any]] = []

    def start_logged(argv: Sequence[str], log: Path, env: Any = None) -> object:
        started.append((list(argv), env))
        return object()

    monkeypatch.setattr(concurrent_jobs, "start_logged", start_logged)
    monkeypatch.setattr(concurrent_jobs, "wait_all", lambda procs, timeout_s, fail_fast: [0] * len(procs))
    monkeypatch.setattr(concurrent_jobs, "stop", lambda procs: None)
    out = tmp_path / "job0" / "alone"
    concurrent_jobs._run_jobs(SharedCluster(), [(out, ["strategy=ps", "cluster.gpus=1"], [2, 0])], 60.0)  # type: ignore[arg-type]
    [(argv, env)] = started
    assert env is None, "the child's environment carries more than this process's own"
    assert argv[argv.index("train") + 1 :] == [
        "--out",
        str(out),
        "--shared-hosts",
        argv[argv.index("--shared-hosts") + 1],
        "strategy=ps",
        "cluster.gpus=1",
    ]
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    parsed = parser.parse_args(argv[argv.index("train") + 1 : argv.index("strategy=ps")])
    assert (parsed.out, parsed.shared_hosts) == (out, SHARED)
    with emulated_sites([0, 1], "unlimited", "1mb", parsed.shared_hosts) as sites:  # no cluster of its own is built
        assert [sites(rank) for rank in (0, 1)] == [
            RankSite((f"/proc/{pid}/ns/net",), SHARED[rank]["env"], "10.213.0.3")
            for rank, pid in enumerate((4242, 4240))
        ]


def test_shared_hosts_are_refused_for_a_run_that_is_not_emulated_and_when_they_lack_a_key(tmp_path: Path) -> None:
    small = ["model=resnet18", "strategy=ps", "cluster.gpus=1", "train.loader=synthetic"]
    with pytest.raises(ConfigError, match="--shared-hosts places ranks on an emulated cluster but this run has "):
        train.run(load(["cluster=local", *small]), tmp_path / "run", shared=SHARED)
    with pytest.raises(ConfigError, match="--shared-hosts lacks or mistypes 'master_addr' of a rank"):
        with emulated_sites([0, 1], "unlimited", "1mb", [{"namespaces": [], "env": {}}] * 2):
            pass
    assert list(tmp_path.iterdir()) == []
