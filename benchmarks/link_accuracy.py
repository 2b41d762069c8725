"""How far emulated links must be slowed to stay accurate, or may be sped up: the link check at 5 and 9 hosts,
1-25 Gbit/s.

For each host count and target rate R, :func:`ralp_pipe.runtime.linkcheck.accurate_factor` tries
D = 1, 2, 4, ... in turn, and where D = 1 is accurate, 1/2, 1/4, 1/8 (time compression): links shaped to R / D, loaded twice, both ways at once: host 0's link as a
parameter server's (every other host sends to it, it sends to every other host), then every
link as an all-reduce ring's (host i sends to host i + 1 and receives from host i - 1, all at
once). It stops at the first D upward where every measured direction under both loads delivers at least
0.95 of R / D, or downward at the last such D before one falls short. Printed per D tried, for the parameter server's load: what tbf released per
direction over R / D, the relative error the counters' read times may put on both (+-), the same
ratios from the interface counters (TCP payload plus one header per offloaded packet, ~0.96 where
tbf is exact), the kernel's share of the machine's CPU (all processes); for the ring's: the worst
host's upload and download (tbf's bytes), their +-, the worst host's interface ratios and the
kernel's share; then the chosen D. With `--backend ring` (what an `allreduce` run's check adds) or
`--backend star` (a `ps` or RALP run's, whose check loads host 0's link alone, not the ring), a D the streams pass must also let gloo's own traffic across
the hosts in that pattern (an all-reduce; every other host pushing to host 0 while it sends to each)
reach 0.95 of the payload rate at twice the link rate; printed: its links' rate, message size and
that ratio ("gloo").
With `--factors F ...` it measures each factor F once instead (no search, no choice: which D deliver).
Run: `python benchmarks/link_accuracy.py [--hosts 5 9] [--rates 1gbit 10gbit 25gbit] [--seconds 0.5]
[--backend ring|star] [--factors 0.125 0.25 0.5 1]`.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from ralp_pipe.contract.topology import STAR
from ralp_pipe.errors import ConfigError
from ralp_pipe.runtime.backendcheck import PATTERNS
from ralp_pipe.runtime.linkcheck import (
    BACKEND_HEADROOM,
    THRESHOLD,
    WINDOW_S,
    LinkMeasurement,
    accurate_factor,
    measure_backend,
    measure_link,
)


def _ring_cells(m: LinkMeasurement) -> str:
    """The ring's columns; blank where a star's check did not load every link."""
    ring = (m.ring_upload, m.ring_download, m.ring_timing_error, m.ring_wire_upload, m.ring_wire_download)
    if m.ring_kernel_cpu is None or any(figure is None for figure in ring):
        return f"{'(star: not loaded)':<55}"
    up, down, error, wire_up, wire_down = (float(figure or 0) for figure in ring)
    return f"{up:7.3f} {down:9.3f} {error:7.3f} {wire_up:8.3f} {wire_down:10.3f} {m.ring_kernel_cpu:11.2f}"


def _row(hosts: int, rate: str, m: LinkMeasurement) -> str:
    return (
        f"{hosts:>5} {rate:>7} {m.factor:>4g} {m.shaped_rate:>15} {m.upload:7.3f} {m.download:9.3f} "
        f"{m.timing_error:7.3f} {m.wire_upload:8.3f} {m.wire_download:10.3f} {m.kernel_cpu:11.2f} | "
        + _ring_cells(m)
        + (
            ""
            if m.backend is None
            else f" | {m.backend.rate:>15} {m.backend.message_bytes:>9} {m.backend.efficiency:10.3f}"
        )
    )


def main() -> int:
    """Run the check for every host count and rate; print each measurement and the chosen factor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", nargs="+", type=int, default=[5, 9])
    parser.add_argument("--rates", nargs="+", default=["1gbit", "10gbit", "25gbit"])
    parser.add_argument("--seconds", type=float, default=WINDOW_S, help="measured window per factor")
    parser.add_argument("--backend", choices=PATTERNS, help="also gloo's traffic in this pattern, as the runs check")
    parser.add_argument("--factors", nargs="+", type=float, help="measure each of these D once (no search)")
    args = parser.parse_args()
    print(
        f"threshold {THRESHOLD}: both directions of host 0's link (parameter server) and of every host's link "
        f"(ring, worst host; not loaded for a star) deliver >= {THRESHOLD} of R / D (tbf's bytes)"
    )
    figures = f"{'upload':>7} {'download':>9} {'+-':>7} {'wire up':>8} {'wire down':>10} {'kernel cpu':>11}"
    print(f"{'':>34} {'parameter server':<55}   {'ring (worst host)':<55}")
    backend = f" | {'gloo tc rate':>15} {'bytes':>9} {'gloo':>10}" if args.backend else ""
    print(f"{'hosts':>5} {'rate':>7} {'D':>4} {'tc rate':>15} {figures} | {figures}{backend}")
    chosen = []
    for hosts in args.hosts:
        for rate in args.rates:
            if args.factors:
                for factor in args.factors:
                    m = measure_link(hosts, rate, "1mb", factor, args.seconds, every_link=args.backend != STAR)
                    if args.backend and m.worst >= THRESHOLD:  # as the check: the backend only where the streams pass
                        checked = measure_backend(hosts, rate, "1mb", factor / BACKEND_HEADROOM, args.backend)
                        m = replace(m, backend=checked)
                    print(_row(hosts, rate, m), flush=True)
                    chosen.append(f"{hosts} hosts at {rate}, D = {factor:g}: worst {m.worst:.3f}")
                continue
            try:
                choice = accurate_factor(hosts, rate, seconds=args.seconds, backend=args.backend)
            except ConfigError as exc:
                chosen.append(f"{hosts} hosts at {rate}: none ({exc})")
                continue
            for measurement in choice.measurements:
                print(_row(hosts, rate, measurement))
            chosen.append(f"{hosts} hosts at {rate}: D = {choice.factor:g}")
    print("chosen:", *chosen, sep="\n  ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
