"""What crossed each host's link: the kernel's byte counters of the interface a host's ranks send through.

A rank on an emulated host or a SLURM node has :data:`HOST_ENV` set to its host's index (and, where
its link is not :data:`INTERFACE`, :data:`LINK_ENV` to the interface carrying it); it reads that
interface's counters at the edges of the measured window (:func:`host_counters`), and rank 0 turns
the readings into GB per step per host link (:func:`wire_gb_per_step`), one reading per host however
many ranks share it. :func:`route_interface` finds the interface an srun task reaches rank 0 through.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from typing import Mapping, Sequence

from ralp_pipe.errors import RunFailure

INTERFACE = "eth0"  # an emulated host's link, whose counters a rank reads unless LINK_ENV names another
HOST_ENV = "RALP_PIPE_HOST"  # set for ranks on an emulated host or SLURM node: the host's index (its link)
LINK_ENV = "RALP_PIPE_LINK"  # the interface whose counters such a rank reads (default INTERFACE)
SIOCGIFADDR = 0x8915  # ioctl: an interface's IPv4 address


@dataclass(frozen=True)
class LinkCounters:
    """Kernel byte counters of one host's link interface (what crossed its link)."""

    tx_bytes: int
    rx_bytes: int


def interface_counters(path: str, interface: str = INTERFACE) -> LinkCounters:
    """Parse `interface`'s rx/tx bytes out of a /proc/net/dev file."""
    with open(path) as handle:
        for line in handle:
            name, _, fields = line.partition(":")
            if name.strip() == interface:
                values = fields.split()
                return LinkCounters(tx_bytes=int(values[8]), rx_bytes=int(values[0]))
    raise RuntimeError(f"{path} has no {interface} line; the host lost its link")


def host_counters() -> tuple[int, LinkCounters] | None:
    """In a rank on an emulated host or SLURM node: (host index, its link's counters now); None elsewhere."""
    host = os.environ.get(HOST_ENV)
    link = os.environ.get(LINK_ENV, INTERFACE)
    return None if host is None else (int(host), interface_counters("/proc/self/net/dev", link))


def wire_gb_per_step(
    start: Sequence[tuple[int, LinkCounters]], end: Sequence[tuple[int, LinkCounters]], steps: int
) -> dict[str, object]:
    """GB per step that crossed each host link (one reading per host, however many ranks share it).

    `start`/`end` are :func:`host_counters` readings taken by the ranks at the edges of the
    measured window. ``total`` sums what the hosts sent, the figure the comm layer's
    sender-side count is compared with; ``per_host`` gives each link's tx and rx.
    """
    first, last = dict(start), dict(end)
    per_host = {
        f"h{host}": {
            "tx": (last[host].tx_bytes - first[host].tx_bytes) / steps / 1e9,
            "rx": (last[host].rx_bytes - first[host].rx_bytes) / steps / 1e9,
        }
        for host in sorted(first.keys() & last.keys())
    }
    return {"total": wire_total(per_host), "per_host": per_host}


def wire_total(per_host: Mapping[str, Mapping[str, float]]) -> float:
    """GB per step on the wire: what every host link sent (``per_host``'s tx), each byte counted once."""
    return sum(link["tx"] for link in per_host.values())


def route_interface(host: str) -> str:
    """The network interface holding the source address this machine uses to reach `host`."""
    try:
        address = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # a UDP connect sends nothing: the kernel only picks route and source
            source = probe.getsockname()[0]
    except OSError as exc:
        raise RunFailure(f"cannot find the interface that reaches rank 0's host {host!r}: {exc}") from exc
    for _, name in socket.if_nameindex():
        if _ipv4_address(name) == source:
            return name
    raise RunFailure(f"no interface holds {source}, the address this host reaches {host!r} ({address}) from")


def _ipv4_address(interface: str) -> str | None:
    """The IPv4 address of `interface` (SIOCGIFADDR), None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])
