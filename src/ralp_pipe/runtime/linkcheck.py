"""The smallest dilation factor whose emulated links still deliver their rate.

Time-dilated emulation shapes every link to R / D. ``tc tbf`` holds its rate up to a few
Gbit/s on a small machine, but above that the kernel's CPU binds (the more so the more hosts
send at once) and a link delivers less than asked: a dilated run would then be slowed by the
emulation, not by the target's network. :func:`accurate_factor` tries factors D upward from 1 and,
where D = 1 is accurate, downward through 1/2, 1/4, 1/8 (time compression: links at R / D faster than the
target's, so a modelled run takes D x the target's time; :func:`search_order`). For each it brings up an emulated cluster with every link at R / D and loads it twice,
each direction of a link at once, one TCP stream and one process per sender. First host 0's
link the way a parameter server's is loaded: every other host sends to host 0 (incast) while
host 0 sends to every other host (fan-out). Then every link the way an all-reduce ring loads
them: host i sends to host (i + 1) mod n while receiving from host (i - 1) mod n, all hosts at
once, so n times as many bytes cross the emulation as under the first load, and the kernel binds
at a larger D. A star's check (``backend`` ``star``) makes only the first load: its runs' traffic all goes
through one server host's link, and their workers' links carry 1/(n - 1) of it each, never every link at its
rate at once (17 hosts on 2 cores: host 0's load passed at D = 1-2 at 10 Gbit/s, the ring only at 16-32). A
ring's check (every link at once: ``allreduce``, and servers on several hosts,
:func:`ralp_pipe.contract.topology.link_pattern`) and one with no pattern make both. The streams' receive buffers hold ~25 ms of the rate per direction, so
windows, not congestion control, bound what is in flight: left to the system's congestion
control (BBR, say), each direction's acknowledgements queue behind up to 100 ms of the other's
data in tbf's FIFO and one direction often starves even at low rates, hiding what D changes.
Even 50 ms starves the parameter server's fan-out now and then: 3 hosts at 200 Mbit/s read host
0's upload at 0.78-0.90 of the rate with 50 ms (0.64-0.75 with 100 ms), 0.97-1.01 with 25 ms.
Over a short window per load it reads, per direction, the bytes the link's tbf released (the qdisc's
own counter, which counts headers as tbf does, so an exact shaper reads 1.0 of R / D), the
bytes the interface counted (what a run's ``wire_gb_per_step`` sees: TCP payload plus one
header per segmentation-offload packet, ~0.96 of R / D when tbf is exact) and the kernel's
share of the machine's CPU time. With ``backend`` (a pattern of
:mod:`ralp_pipe.runtime.backendcheck`: ``ring`` for a run whose gradients cross an all-reduce, ``star``
for one whose workers push to and pull from a parameter server or PS device), a D the streams pass is
then loaded a third time, on a fresh cluster, with the training backend's own traffic in that pattern
(:func:`ralp_pipe.runtime.backendcheck.backend_efficiency`): gloo's copies (and the ring's additions)
share the cores with the kernel's TCP work, so the backend can fall short at a D the plain streams
pass. It runs at :data:`BACKEND_HEADROOM` times the run's link rate, because the run's ranks also
pace, copy buckets and messages and run Python on those cores: 8 hosts at 10 Gbit/s / 4 all-reduced
at 0.89 of the payload rate alone, while ``allreduce`` at N = 8 and D = 4 measured 23% below its D =
16 figure (D = 8: 4% below). A D is accurate where its worst direction (tbf's bytes) under the
loads made (for the ring, the worst host's upload and download), and the backend's figure over the
payload rate where measured, reach the threshold. It returns the first accurate D upward, or, where
that is D = 1, the last accurate D downward (the smallest before one falls short), with every
measurement taken.

A D whose reading falls short by less than :data:`NEAR_MISS` is read again, up to :data:`ATTEMPTS` readings,
before the next D is tried: the check asks what the links can deliver, and a short window also reads how
TCP streams sharing a link trade their shares, not only what the machine's cores allow. 3 hosts in a star
at 1 Gbit/s, D = 1, read host 0's upload at 0.927-0.988 in 6 loads back to back on an idle machine (with
50 ms in flight), and a check that moved on after one reading once chose D = 8 for them on 0.94, 0.93 and
0.91 at D = 1, 2 and 4 (their `ps` run then took 8x the time it needed).
Where the cores bind, readings fall well short at every attempt (0.2-0.8 at too small a D) and are not
repeated.

``ralp-pipe check-links --hosts H --pattern P`` makes that choice once for H hosts whose links carry
pattern P (:func:`ralp_pipe.contract.topology.link_pattern`) and writes it as JSON; a workflow's training
runs with those hosts, that pattern and that network (every strategy, N, arm, repeat, model and class count
that has them: ``ps`` at N = 2 and RALP-H at N = 4 both load 3 hosts as a star) then share it
(``ralp-pipe train --link-check``) instead of each measuring the links again before its window (a median of
20 s a run, up to 60 s, on 2 cores), and take the same D.

Runs side by side (``--budget RATE``, :func:`accurate_factor`'s `budget`): a workflow that lets training runs share
this machine caps the shaped rate of every emulated link of the runs going at once, summed (the budget; each run
counts its hosts x rate / D, :mod:`ralp_pipe.workflow.resources`). The check then certifies D with the rest of the
budget loaded beside it: while each D is measured, a second emulated cluster of two hosts sends both ways at once at
budget - hosts x rate / D in all (:func:`beside_load`), so the kernel shapes and moves the most the runs beside
it may. A D whose own links take the whole budget is measured alone, and its runs go alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ralp_pipe.atomic import write_json_atomic
from ralp_pipe.config import Config, load
from ralp_pipe.config.dilation import shaped_rate
from ralp_pipe.config.units import payload_bytes_per_s, rate_bits_per_s
from ralp_pipe.contract.topology import LINK_PATTERNS, STAR, links_of
from ralp_pipe.errors import ConfigError, RunFailure
from ralp_pipe.runtime.backendcheck import BackendMeasurement, backend_efficiency
from ralp_pipe.runtime.emulated import EmulatedCluster
from ralp_pipe.runtime.process import Process, start, stop
from ralp_pipe.runtime.wire import INTERFACE

# below 1, time compression: the emulation runs faster than the target, where the links keep up (module doc)
CANDIDATES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
BACKEND_HEADROOM = 2.0  # the backend must keep up at this many times the run's link rate (module doc)
THRESHOLD = 0.95
ATTEMPTS = 3  # readings of one D that falls short by less than NEAR_MISS (module doc)
NEAR_MISS = 0.1
WINDOW_S = 0.5  # measured window per candidate
WARMUP_S = 0.3  # traffic runs this long before the window opens (TCP ramps up, tbf's burst drains)
PORT = 5201  # every host has its own address, so one port serves them all
RING_PORT = 5202  # the ring's listeners, clear of the parameter server's just-closed streams
IN_FLIGHT_S = 0.025  # each direction's streams together keep about this much of the link's rate in flight
BUFFER_BYTES = (64 << 10, 4 << 20)  # bounds of one stream's receive buffer (the kernel caps it at net.core.rmem_max)
# what `ralp-pipe check-links` reads of the config (the hosts and their pattern are its options)
CONFIG_KEYS = ("network.rate", "network.burst", "dilation.link_accuracy")
_PROBE = [sys.executable, str(Path(__file__).with_name("link_traffic.py"))]  # standard library only: run by path


@dataclass(frozen=True)
class LinkMeasurement:
    """The links at one dilation factor under both loads: the parameter server's, then the ring's.

    Parameter-server load: ``upload`` (host 0's ``eth0`` to the switch) and ``download`` (the
    switch's port ``s0`` to host 0) are the bytes their tbf released per second over the asked rate;
    ``wire_upload``/``wire_download`` the same from those interfaces' counters. ``seconds`` is the
    window, ``kernel_cpu`` the share of all cores' time spent in the kernel (system, irq and
    softirq) during it, by every process on the machine. ``timing_error`` bounds the relative
    error the reads' timing may put on the ratios (a loaded machine delays a read).

    Ring load (every host sends to the next and receives from the previous at once, as an
    all-reduce ring does): ``ring_uploads``/``ring_downloads`` are every host's ratios (tbf's
    bytes, host order), ``ring_upload``/``ring_download`` the worst host's, ``ring_wire_upload``/
    ``ring_wire_download`` the worst host's from the interface counters; ``ring_seconds``,
    ``ring_kernel_cpu`` and ``ring_timing_error`` as above (the timing error the largest of any
    reading). All None where the ring's load was not made: a star's check (:func:`measure_link`).

    ``backend``: the training backend's traffic across every host in the run's pattern (None where it
    was not measured); its ``efficiency`` counts toward :attr:`worst`.
    """

    factor: float
    shaped_rate: str
    upload: float
    download: float
    wire_upload: float
    wire_download: float
    seconds: float
    kernel_cpu: float
    timing_error: float
    ring_upload: float | None
    ring_download: float | None
    ring_wire_upload: float | None
    ring_wire_download: float | None
    ring_uploads: tuple[float, ...] | None
    ring_downloads: tuple[float, ...] | None
    ring_seconds: float | None
    ring_kernel_cpu: float | None
    ring_timing_error: float | None
    backend: BackendMeasurement | None = None
    beside_bits_per_s: float = 0.0  # what other emulated links carried meanwhile (:func:`beside_load`)

    @property
    def worst(self) -> float:
        """The direction further below its asked rate (tbf's bytes) under the loads made, or the backend's figure."""
        backend = () if self.backend is None else (self.backend.efficiency,)
        ring = () if self.ring_upload is None or self.ring_download is None else (self.ring_upload, self.ring_download)
        return min(self.upload, self.download, *ring, *backend)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record, with ``worst``."""
        return asdict(self) | {
            "ring_uploads": None if self.ring_uploads is None else list(self.ring_uploads),
            "ring_downloads": None if self.ring_downloads is None else list(self.ring_downloads),
            "worst": self.worst,
        }


# the ring load's figures (None where a star's check did not make it)
_RING_FIELDS = [name for name in LinkMeasurement.__dataclass_fields__ if name.startswith("ring_")]


@dataclass(frozen=True)
class FactorChoice:
    """The chosen factor and every measurement that led to it, in the order taken (a factor read again after a
    near miss appears once a reading; none for an unlimited rate); `backend` is the pattern of the training
    backend's traffic that was also checked (None: the streams alone)."""

    rate: str
    hosts: int
    burst: str
    threshold: float
    factor: float
    measurements: tuple[LinkMeasurement, ...]
    backend: str | None = None
    budget: str | None = None  # the side-by-side budget it was certified under (module doc); None: alone

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (for metrics.json and ``ralp-pipe check-links``)."""
        return asdict(self) | {"measurements": [m.to_dict() for m in self.measurements]}


def accurate_factor(
    hosts: int,
    rate: str,
    burst: str = "1mb",
    candidates: Sequence[float] = CANDIDATES,
    threshold: float = THRESHOLD,
    seconds: float = WINDOW_S,
    backend: str | None = None,
    budget: str | None = None,
) -> FactorChoice:
    """The smallest factor D in `candidates` (tried as :func:`search_order` says) at which `hosts` emulated hosts'
    links, shaped to `rate` / D with `burst`, deliver at least `threshold` of that rate in both directions of host 0's link under the
    parameter server's load and of every host's link under the ring's, and (with `backend`, a pattern) the
    training backend's traffic in that pattern reaches `threshold` of the payload rate at
    :data:`BACKEND_HEADROOM` times that rate (a near miss read again, see the module doc). One host (a single-device run)
    has no link and an unlimited rate shapes none: either takes the first candidate tried (D = 1), unmeasured.
    With `budget` (a rate), each D is measured beside the rest of it (:func:`beside_load`, module doc)."""
    if hosts < 1:
        raise ConfigError(f"the link check needs at least 1 host, got {hosts}")
    if not 0 < threshold <= 1:
        raise ConfigError(f"the link check's threshold must be in (0, 1], got {threshold}")
    if not candidates or min(candidates) <= 0:
        raise ConfigError(f"the link check needs positive candidate factors, got {list(candidates)}")
    if seconds <= 0:
        raise ConfigError(f"the link check's window must be positive, got {seconds} s")
    upward, downward = search_order(candidates)
    if rate_bits_per_s(rate) is None or hosts == 1:
        return FactorChoice(rate, hosts, burst, threshold, upward[0], (), backend, budget)
    measured: list[LinkMeasurement] = []

    def accurate(factor: float) -> bool:
        beside = beside_bits_per_s(budget, hosts, rate, factor)
        for _ in range(ATTEMPTS):
            with beside_load(beside, burst):
                measurement = measure_link(hosts, rate, burst, factor, seconds, every_link=backend != STAR)
                if backend and measurement.worst >= threshold:  # the streams pass: does the backend?
                    checked = measure_backend(hosts, rate, burst, factor / BACKEND_HEADROOM, backend)
                    measurement = replace(measurement, backend=checked)
            measurement = replace(measurement, beside_bits_per_s=beside)
            measured.append(measurement)
            if measurement.worst >= threshold:
                return True
            if measurement.worst < threshold - NEAR_MISS:  # the cores bind: reading it again will not help
                return False
        return False

    chosen = next((factor for factor in upward if accurate(factor)), None)
    if chosen == upward[0]:  # the first tried (D = 1) is accurate: compress time while the links keep up
        for factor in downward:
            if not accurate(factor):
                break
            chosen = factor
    if chosen is not None:
        return FactorChoice(rate, hosts, burst, threshold, chosen, tuple(measured), backend, budget)
    best = max(measured, key=lambda m: m.worst)
    raise ConfigError(
        f"emulated links of {hosts} hosts at {rate} / D deliver at best {best.worst:.2f} of their rate "
        f"(D={best.factor:g}; parameter server {min(best.upload, best.download):.2f}"
        f"{_ring_words(best)}{_backend_words(best)}), below {threshold:g} at every D tried "
        f"({', '.join(f'{factor:g}' for factor in dict.fromkeys(m.factor for m in measured))}); try larger factors or "
        "fewer hosts"
    )


def search_order(candidates: Sequence[float]) -> tuple[list[float], list[float]]:
    """The order the check tries `candidates` in: upward from the smallest D >= 1 (the largest candidate where none
    is), then, only where that first one is accurate, downward through the smaller ones (time compression): the
    smallest accurate D where the links deliver less the faster they run, without loading them at rates far
    beyond what they pass (80 Gbit/s for 10 Gbit/s at D = 1/8) where D >= 1 is needed."""
    factors = sorted({float(c) for c in candidates})
    start = next((i for i, factor in enumerate(factors) if factor >= 1.0), len(factors) - 1)
    return factors[start:], factors[:start][::-1]


def run_check(cfg: Config, hosts: int, pattern: str | None, budget: str | None = None) -> FactorChoice:
    """The factor choice for `hosts` hosts whose links carry `pattern` (the training backend's traffic the
    check also loads, :func:`ralp_pipe.contract.topology.link_pattern`) on `cfg`'s network (beside the rest of a
    side-by-side `budget`, where given)."""
    return accurate_factor(
        hosts,
        cfg.network.rate,
        cfg.network.burst,
        threshold=cfg.dilation.link_accuracy,
        backend=pattern,
        budget=budget,
    )


def beside_bits_per_s(budget: str | None, hosts: int, rate: str, factor: float) -> float:
    """What may run beside `hosts` links at `rate` / `factor` under a side-by-side `budget`: the budget less their
    own shaped rate (0 without a budget, an unlimited rate or where they take it all)."""
    total, own = rate_bits_per_s(budget or "unlimited"), rate_bits_per_s(shaped_rate(rate, factor))
    return 0.0 if total is None or own is None else max(0.0, total - hosts * own)


@contextmanager
def beside_load(bits_per_s: float, burst: str) -> Iterator[None]:
    """Other runs' traffic meanwhile: two emulated hosts sending to each other at once, their links shaped to half
    of `bits_per_s` each (both hosts' links then carry `bits_per_s` in all, as runs count theirs); nothing for 0."""
    if bits_per_s <= 0:
        yield
        return
    per_link = bits_per_s / 2
    procs: list[tuple[int, Process]] = []
    with EmulatedCluster(2, f"{per_link:.0f}bit", burst) as cluster:
        try:
            procs = [
                (h, _start_traffic(cluster, h, a)) for h, a in _ring_traffic(cluster, _receive_buffer(per_link, 1))
            ]
            for line in ("ready", "sending"):
                for host, proc in procs:
                    _expect(host, proc, line)
            yield
        finally:
            _stop_traffic(procs)


def recorded_choice(path: Path, cfg: Config) -> dict[str, Any]:
    """The choice ``ralp-pipe check-links`` wrote to `path`, checked against the run configured as `cfg`
    (its hosts, rate, burst, threshold and pattern): a record made for another run is refused."""
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("factor"), (int, float)):
            raise ValueError("no factor")
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--link-check {path} is not a link check's record ({exc}); rerun `ralp-pipe check-links --out {path}`"
        ) from None
    hosts, pattern = links_of(cfg)
    expected = {
        "hosts": hosts,
        "rate": cfg.network.rate,
        "burst": cfg.network.burst,
        "threshold": cfg.dilation.link_accuracy,
        "backend": pattern,
    }
    wrong = {key: value for key, value in expected.items() if record.get(key) != value}
    if wrong:
        found = ", ".join(f"{key}={record.get(key)!r}" for key in wrong)
        wanted = ", ".join(f"{key}={value!r}" for key, value in wrong.items())
        raise ConfigError(
            f"--link-check {path} was made for {found}, but this run needs {wanted}: rerun `ralp-pipe check-links "
            f"--hosts {hosts} --pattern {pattern}` with the run's network overrides, or leave --link-check out to "
            f"measure the links before the run"
        )
    return record


def _hosts(text: str) -> int:
    """--hosts: two or more (one host has no link to check)."""
    try:
        hosts = int(text)
    except ValueError:
        hosts = 0
    if hosts < 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hosts of 2 or more (one host has no link)")
    return hosts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe check-links`."""
    parser.add_argument("--out", required=True, type=Path, help="JSON file for the chosen factor and every measurement")
    parser.add_argument(
        "--hosts", required=True, type=_hosts, help="emulated hosts of the runs to check for (a run's ranks' hosts)"
    )
    parser.add_argument(
        "--pattern",
        required=True,
        choices=LINK_PATTERNS,
        help="the traffic their links carry: star (workers and servers on one host: ps with one PS, ralp_h, ralp_n; "
        "loads host 0's link), ring (every link at once: allreduce, servers on several hosts; loads host 0's link "
        "and every link)",
    )
    parser.add_argument(
        "--budget",
        help="certify D for runs side by side: the shaped rate all runs going at once may carry, summed "
        "(e.g. 6gbit); each D is measured beside the rest of it",
    )


def main(args: argparse.Namespace) -> int:
    """Choose the dilation factor of `--hosts` emulated hosts in `--pattern` on the configured network; write it to --out."""
    cfg = load(args.overrides)
    print(f"ralp-pipe check-links: {args.hosts} hosts in a {args.pattern} at {cfg.network.rate} / D", flush=True)
    began = time.monotonic()
    choice = run_check(cfg, args.hosts, args.pattern, args.budget)
    write_json_atomic(args.out, choice.to_dict() | {"seconds": time.monotonic() - began})
    print(f"ralp-pipe check-links: D = {choice.factor:g} ({time.monotonic() - began:.0f} s) -> {args.out}")
    return 0


def _ring_words(measurement: LinkMeasurement) -> str:
    """The streams' ring figure, where it was loaded."""
    up, down = measurement.ring_upload, measurement.ring_download
    return "" if up is None or down is None else f", ring {min(up, down):.2f}"


def _backend_words(measurement: LinkMeasurement) -> str:
    """The backend's figure, where it was measured."""
    backend = measurement.backend
    return "" if backend is None else f", gloo's {backend.pattern} {backend.efficiency:.2f}"


def measure_backend(hosts: int, rate: str, burst: str, factor: float, pattern: str) -> BackendMeasurement:
    """The training backend's traffic in `pattern` across a fresh cluster of `hosts` shaped to `rate` / `factor`."""
    shaped = shaped_rate(rate, factor)
    payload = payload_bytes_per_s(shaped)
    assert payload is not None  # a limited rate stays limited
    with EmulatedCluster(hosts, shaped, burst) as cluster:
        return backend_efficiency(cluster, payload, pattern)


def measure_link(
    hosts: int, rate: str, burst: str, factor: float, seconds: float = WINDOW_S, every_link: bool = True
) -> LinkMeasurement:
    """Load a fresh cluster shaped to `rate` / `factor` the parameter server's way, then (`every_link`) the ring's, and
    measure each load made (a star's check, `every_link` False, leaves the ring's fields None)."""
    shaped = shaped_rate(rate, factor)
    asked = rate_bits_per_s(shaped)
    assert asked is not None  # a limited rate stays limited
    switch_ports = ",".join(f"s{i}" for i in range(hosts))
    with EmulatedCluster(hosts, shaped, burst) as cluster:
        limit = seconds + 30

        def on_host(host: int) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
            return lambda argv: cluster.run(host, argv, limit)

        def on_switch(argv: list[str]) -> subprocess.CompletedProcess[str]:
            return cluster.switch_run(argv, limit)

        ps_up, ps_down = _load(
            _ps_traffic(cluster, _receive_buffer(asked, hosts - 1)),
            [(on_host(0), INTERFACE), (on_switch, "s0")],
            cluster,
            seconds,
        )
        ring = (
            _load(
                _ring_traffic(cluster, _receive_buffer(asked, 1)),
                [*[(on_host(i), INTERFACE) for i in range(hosts)], (on_switch, switch_ports)],
                cluster,
                seconds,
            )
            if every_link
            else None
        )
    upload, download = ps_up[INTERFACE], ps_down["s0"]
    rings: dict[str, Any] = dict.fromkeys(_RING_FIELDS)  # None each: the ring's load was not made
    if ring is not None:
        ring_up = [ring[i][INTERFACE] for i in range(hosts)]
        ring_down = [ring[hosts][f"s{i}"] for i in range(hosts)]
        rings = {
            "ring_upload": min(d.released_bits_per_s for d in ring_up) / asked,
            "ring_download": min(d.released_bits_per_s for d in ring_down) / asked,
            "ring_wire_upload": min(d.wire_bits_per_s for d in ring_up) / asked,
            "ring_wire_download": min(d.wire_bits_per_s for d in ring_down) / asked,
            "ring_uploads": tuple(d.released_bits_per_s / asked for d in ring_up),
            "ring_downloads": tuple(d.released_bits_per_s / asked for d in ring_down),
            "ring_seconds": ring_up[0].seconds,
            "ring_kernel_cpu": ring_up[0].kernel_cpu,
            "ring_timing_error": max(d.timing_error for d in [*ring_up, *ring_down]),
        }
    return LinkMeasurement(
        factor=factor,
        shaped_rate=shaped,
        upload=upload.released_bits_per_s / asked,
        download=download.released_bits_per_s / asked,
        wire_upload=upload.wire_bits_per_s / asked,
        wire_download=download.wire_bits_per_s / asked,
        seconds=upload.seconds,
        kernel_cpu=upload.kernel_cpu,
        timing_error=max(upload.timing_error, download.timing_error),
        **rings,
    )


_Run = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _load(
    traffic: list[tuple[int, list[str]]], reads: list[tuple[_Run, str]], cluster: EmulatedCluster, seconds: float
) -> list[dict[str, "_Direction"]]:
    """Run `traffic` ((host, argv) of each process) and, once it flows, read each (run, devices) of `reads`
    over the same window of `seconds`, :data:`WARMUP_S` later; the traffic then stops."""
    procs: list[tuple[int, Process]] = []
    try:
        procs = [(host, _start_traffic(cluster, host, argv)) for host, argv in traffic]
        for host, proc in procs:
            _expect(host, proc, "ready")
        for host, proc in procs:
            _expect(host, proc, "sending")
        at = time.monotonic() + WARMUP_S  # the readers start meanwhile; the window opens for all at once
        with ThreadPoolExecutor(len(reads)) as pool:
            readings = [pool.submit(_read, run, devices, seconds, at) for run, devices in reads]
            found = [reading.result() for reading in readings]
        for host, proc in procs:
            if proc.poll() is not None:
                raise RunFailure(f"the link check's traffic on host {host} stopped: {_stderr(proc)}")
        return found
    finally:
        _stop_traffic(procs)


def _stop_traffic(procs: list[tuple[int, Process]]) -> None:
    """Stop traffic processes ((host, process) pairs) and close their pipes."""
    stop([proc for _, proc in procs])
    for _, proc in procs:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _receive_buffer(asked_bits_per_s: float, streams: int) -> int:
    """Receive buffer per stream: `streams` of them hold :data:`IN_FLIGHT_S` of the rate, within :data:`BUFFER_BYTES`.

    Both directions then queue about half of that at their tbf, well within what it holds (100 ms of
    the rate plus the burst), so nothing is dropped and each direction's acknowledgements wait only
    briefly behind the other's data.
    """
    low, high = BUFFER_BYTES
    return int(min(high, max(low, asked_bits_per_s / 8 * IN_FLIGHT_S / streams)))


def _ps_traffic(cluster: EmulatedCluster, buffer: int) -> list[tuple[int, list[str]]]:
    """(host, argv) of every traffic process: host 0 receives from all and sends to each, one process a stream."""
    server = cluster.address(0)
    others = range(1, cluster.hosts)
    traffic = [*_PROBE, "traffic", "--rcvbuf", str(buffer)]
    return [
        (0, [*traffic, "--listen", f"{server}:{PORT}:{cluster.hosts - 1}"]),
        *[(0, [*traffic, "--send", f"{cluster.address(i)}:{PORT}"]) for i in others],
        *[(i, [*traffic, "--listen", f"{cluster.address(i)}:{PORT}:1", "--send", f"{server}:{PORT}"]) for i in others],
    ]


def _ring_traffic(cluster: EmulatedCluster, buffer: int) -> list[tuple[int, list[str]]]:
    """(host, argv) of every traffic process: host i sends to host (i + 1) mod n and receives from (i - 1) mod n."""
    n = cluster.hosts
    traffic = [*_PROBE, "traffic", "--rcvbuf", str(buffer)]
    return [
        (
            i,
            [
                *traffic,
                "--listen",
                f"{cluster.address(i)}:{RING_PORT}:1",
                "--send",
                f"{cluster.address((i + 1) % n)}:{RING_PORT}",
            ],
        )
        for i in range(n)
    ]


def _start_traffic(cluster: EmulatedCluster, host: int, argv: list[str]) -> Process:
    """Start `argv` inside `host`, its stdout and stderr piped back."""
    return start([*cluster.prefix(host), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _expect(host: int, proc: Process, line: str) -> None:
    """Wait for `proc`'s next line to be `line`; a traffic process that exited instead is named."""
    assert proc.stdout is not None
    if proc.stdout.readline().decode(errors="replace").strip() != line:
        proc.wait(timeout=5)
        raise RunFailure(f"the link check's traffic on host {host} did not start: {_stderr(proc)}")


def _stderr(proc: Process) -> str:
    """The last line a stopped traffic process wrote to stderr."""
    assert proc.stderr is not None
    lines = proc.stderr.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


@dataclass(frozen=True)
class _Direction:
    """What one direction's shaping device (host 0's ``eth0``, or the switch's port to it) sent in a window."""

    released_bits_per_s: float  # by its tbf
    wire_bits_per_s: float  # as its interface counted
    seconds: float
    timing_error: float  # the most the window's length may be off, relative to it
    kernel_cpu: float  # share of the machine's CPU time in the kernel


def _read(run: _Run, devices: str, seconds: float, at: float) -> dict[str, _Direction]:
    """The rates of `devices` (comma-separated) over about `seconds` from `at` (``time.monotonic()``), read
    inside their namespace by `run` (two readings of :mod:`ralp_pipe.runtime.link_traffic`; the window runs
    between their clock brackets' midpoints)."""
    shown = run([*_PROBE, "read", devices, str(seconds), "--at", repr(at)])
    try:
        first, second = json.loads(shown.stdout)
        window = (sum(second["clock"]) - sum(first["clock"])) / 2
        spread = (second["clock"][1] - second["clock"][0] + first["clock"][1] - first["clock"][0]) / 2
        ticks = [b - a for a, b in zip(first["cpu"], second["cpu"])]
        user, nice, system, idle, iowait, irq, softirq, steal = ticks
        return {
            device: _Direction(
                released_bits_per_s=(second["qdisc"][device] - first["qdisc"][device]) * 8 / window,
                wire_bits_per_s=(second["interface"][device] - first["interface"][device]) * 8 / window,
                seconds=window,
                timing_error=spread / window,
                kernel_cpu=(system + irq + softirq) / max(1, sum(ticks)),
            )
            for device in devices.split(",")
        }
    except (ValueError, KeyError, TypeError):
        said = (shown.stderr.strip() or shown.stdout.strip() or f"exit status {shown.returncode}").splitlines()[-1]
        raise RunFailure(f"reading the counters of {devices} failed: {said}") from None
