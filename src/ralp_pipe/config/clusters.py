"""What each `cluster.kind` means, decided once: how ranks start, whether links are shaped, who shares CPUs."""

from __future__ import annotations

from dataclasses import dataclass

from ralp_pipe.errors import ConfigError


@dataclass(frozen=True)
class ClusterKind:
    """The properties of one kind of cluster that stages decide on."""

    name: str
    launcher: str  # "local": subprocesses here; "emulated": subprocesses in netns hosts; "srun": SLURM tasks
    shapes_links: bool  # links run at `network.rate` (tc tbf); elsewhere the network is what the hardware is
    shares_host_cpus: bool  # every rank runs on this host, so ranks split its CPU threads
    on_fabric: bool  # ranks talk over a real cluster's network: a network entry names its interface, not a rate
    description: str


CLUSTER_KINDS: dict[str, ClusterKind] = {
    kind.name: kind
    for kind in (
        ClusterKind("local", "local", False, True, False, "ranks are processes on this machine, over loopback"),
        ClusterKind(
            "emulated",
            "emulated",
            True,
            True,
            False,
            "every rank is a host of its own in a network namespace behind a tc-shaped switch",
        ),
        ClusterKind(
            "slurm", "srun", False, False, True, "ranks are srun tasks on the job's nodes, over the real fabric"
        ),
    )
}


def cluster_kind(name: str) -> ClusterKind:
    """The description of cluster kind `name`; an unknown kind raises naming the choices."""
    try:
        return CLUSTER_KINDS[name]
    except KeyError:
        raise ConfigError(f"cluster.kind={name!r} is not allowed; choose one of: {', '.join(CLUSTER_KINDS)}") from None
