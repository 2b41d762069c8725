"""What a training job needs of this machine, so that the workflow runs independent jobs side by side where it keeps up.

Snakemake starts a job when the cores (``threads``) and every declared resource it needs are free. A training job
that may go beside others takes one thread (:func:`threads`: a run's D, and so its load, is known only once its link
check has run, while Snakemake needs its threads before) and declares two resources (:func:`train_demand`):

- **cores** (:data:`CPU_RESOURCE`, thousandths of a core, capped at every core): the CPU its ranks use over the whole
  command. A ``dilation.mode=modelled`` run computes nothing: its
  ranks start, then wait on the V100's modelled time and on shaped links, so they use a fraction of a core each,
  more the faster their links run (the kernel's TCP work and the ranks' copies): :data:`RANK_CORES` +
  :data:`RANK_CORES_PER_GBIT` x the links' shaped Gbit/s per rank, measured (``benchmarks/side_by_side.py``).
- **link load** (:data:`LINK_RESOURCE`, Mbit/s): the shaped rate of its emulated links summed, hosts x rate / D.
  The workflow caps the runs going at once at :data:`LINK_BUDGET` summed, and each run's D is certified by a link
  check that measured it beside the rest of that budget (``ralp-pipe check-links --budget``,
  :func:`ralp_pipe.runtime.linkcheck.beside_load`): whatever runs beside it, its links keep the accuracy its D
  was chosen for.

Everything else runs alone (every core, the whole budget): a run that computes (``dilation.mode=real``, or no
dilation: its throughput is this machine's), one not on emulated links, one whose D no check certified beside the
budget (a fixed ``dilation.factor``: nothing measured its links under a neighbour's load), and one whose own links
take the whole budget.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ralp_pipe.config import AUTO_FACTOR, Config, cluster_kind
from ralp_pipe.config.dilation import shaped_rate
from ralp_pipe.config.schema import MODELLED
from ralp_pipe.config.units import rate_bits_per_s
from ralp_pipe.contract.topology import links_of, of_strategy
from ralp_pipe.errors import ConfigError

LINK_RESOURCE = "emulated_link_mbps"  # the Snakemake resource of a training job's link load
CPU_RESOURCE = "cpu_millicores"  # and of its cores
# The shaped rate every emulated link of the runs going at once may carry, summed. Measured on 2 cores: 3 hosts in a
# star at 1 Gbit/s / 1 (3 Gbit/s) delivered 0.98 of their rate with 3 Gbit/s more beside them (docs/method/dilation.md).
LINK_BUDGET = "6gbit"
# A modelled run's CPU per rank over its whole command (start-up included), as cores: a constant and a part growing
# with its links' shaped rate, drawn above every run measured alone on 2 cores (benchmarks/side_by_side.py: ResNet-50
# ps and allreduce at N = 2-4, 0.03-0.23 of a core per rank at 0.625 and 1 Gbit/s per link; docs/method/dilation.md).
RANK_CORES = 0.05
RANK_CORES_PER_GBIT = 0.2


@dataclass(frozen=True)
class Demand:
    """What one training job needs: `cores` (None: every core, it runs alone), its link load in Mbit/s (None: the
    whole budget) and why."""

    cores: float | None
    link_mbps: int | None
    reason: str

    @property
    def alone(self) -> bool:
        """Whether the job runs by itself."""
        return self.cores is None


def budget_mbps(budget: str = LINK_BUDGET) -> int:
    """The side-by-side budget in Mbit/s (a limited rate)."""
    bits = rate_bits_per_s(budget)
    if bits is None or bits <= 0:
        raise ConfigError(f"the side-by-side link budget must be a limited rate, got {budget!r}")
    return math.ceil(bits / 1e6)


def alone_reason(cfg: Config) -> str | None:
    """Why the run configured as `cfg` goes alone whatever its link check finds (None: its check decides)."""
    d = cfg.dilation
    if d.factor is None or d.mode != MODELLED:
        return "it computes on this machine's cores"
    if cluster_kind(cfg.cluster.kind).launcher != "emulated":
        return "its links are not emulated here"
    if d.factor != AUTO_FACTOR:
        return "its D is fixed: no link check certified it beside other links"
    if links_of(cfg)[0] < 2:
        return "it has one host: no link check certified its D"
    return None


def train_demand(cfg: Config, check: Mapping[str, Any] | None, budget: str = LINK_BUDGET) -> Demand:
    """What the training run configured as `cfg` needs of this machine, its D taken from the link check's record
    `check` (``ralp-pipe check-links`` output; None where the run reads none). Module doc."""
    reason = alone_reason(cfg)
    if reason is not None:
        return Demand(None, None, reason)
    if check is None or check.get("budget") != budget:
        return Demand(None, None, f"no link check certified its D beside {budget} of other links")
    hosts, _ = links_of(cfg)
    shaped = rate_bits_per_s(shaped_rate(cfg.network.rate, float(check["factor"])))
    if shaped is None:
        return Demand(None, None, "its links are unshaped")
    own = hosts * shaped / 1e6
    if own >= budget_mbps(budget):
        return Demand(None, None, f"its links take the whole budget ({own:.0f} of {budget})")
    ranks = of_strategy(cfg.strategy, cfg.cluster.gpus).world_size
    cores = ranks * (RANK_CORES + RANK_CORES_PER_GBIT * shaped / 1e9)
    return Demand(cores, math.ceil(own), f"{ranks} modelled ranks on {hosts} links of {shaped / 1e6:.0f} Mbit/s")


def demand_of(cfg: Config, checks: Sequence[str | Path]) -> Demand:
    """:func:`train_demand` of the run configured as `cfg`, reading its link check's record (the one path in
    `checks`, or none). A record not written yet raises FileNotFoundError: Snakemake then asks again once it is."""
    if len(checks) > 1:
        raise ConfigError(f"a training run reads one link check, got {list(map(str, checks))}")
    record = None
    for path in checks:
        text = Path(path).read_text()
        try:
            record = json.loads(text)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise ConfigError(f"link check {path} cannot be read ({exc}): rerun `ralp-pipe check-links`") from None
    return train_demand(cfg, record)


def threads(cfg: Config, cores: int) -> int:
    """Snakemake threads of the training job of the run configured as `cfg` among `cores`: every core where it goes
    alone whatever its check finds, else one (its cores are :func:`cpu_units`)."""
    return cores if alone_reason(cfg) is not None else 1


def cpu_units(demand: Demand, cores: int) -> int:
    """The job's :data:`CPU_RESOURCE` among `cores`: its cores in thousandths, rounded up, at most every core (every
    core where it runs alone)."""
    return 1000 * cores if demand.cores is None else min(1000 * cores, math.ceil(demand.cores * 1000))


def link_units(demand: Demand, budget: str = LINK_BUDGET) -> int:
    """The job's :data:`LINK_RESOURCE` (the whole budget where it runs alone)."""
    return budget_mbps(budget) if demand.link_mbps is None else demand.link_mbps
