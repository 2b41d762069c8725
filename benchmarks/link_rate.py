"""Achieved TCP rate of one emulated host link vs the configured tc rate (target: within 10%).

Traffic: one plain Python TCP socket stream from host 0 to host 1 of a fresh emulated cluster
(payload bytes counted by the receiver from its first byte to end of stream); the kernel's
interface counters are printed next to it. Run: `python benchmarks/link_rate.py [--seconds 3]`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ralp_pipe.config.units import rate_bits_per_s
from ralp_pipe.runtime.emulated import EmulatedCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the harness shared with the tests
from support.emulated_hosts import counter_delta, measure_link_rate, read_counters  # noqa: E402


def main() -> int:
    """Measure each rate and print configured, achieved and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    parser.add_argument("--seconds", type=float, default=3.0, help="approximate length of each transfer")
    args = parser.parse_args()
    print(f"{'configured':>11} {'achieved Mbit/s':>16} {'ratio':>6} {'wire/payload':>13}  within 10%")
    worst = 0.0
    for rate in args.rates:
        target = rate_bits_per_s(rate)
        nbytes = int(target / 8 * args.seconds)
        with EmulatedCluster(hosts=2, rate=rate, burst="1mb") as cluster:
            before = read_counters(cluster)
            achieved = measure_link_rate(cluster, src=0, dst=1, nbytes=nbytes)
            wire = counter_delta(before, read_counters(cluster))[0].tx_bytes
        ratio = achieved / target
        worst = max(worst, abs(1 - ratio))
        print(f"{rate:>11} {achieved / 1e6:16.1f} {ratio:6.3f} {wire / nbytes:13.4f}  {abs(1 - ratio) <= 0.10}")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
