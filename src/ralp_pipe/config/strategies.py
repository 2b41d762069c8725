"""What each training strategy is, decided once: its ranks at N devices, what its servers do, its step and volume.

Every stage asks :func:`strategy_kind` for a property instead of comparing names. A new strategy
is an entry of :data:`STRATEGY_KINDS` plus its own step class (``engine/strategies/``), volume
function (``engine/volume.py``) and ``config/strategy/<name>.yaml``. The step class and the volume
function are named as ``module:attribute`` and imported on first use, so reading the table
imports neither torch nor the engine. A strategy without a step class (``step=None``) would be
priced by the planner and the simulator but not trained; :attr:`StrategyKind.baseline` marks the
strategies RALP is measured against and :attr:`StrategyKind.reference` the one of them a plan's ``pays`` verdict
is against; :attr:`StrategyKind.ps_per_host` the parameter servers deployed one per worker host.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any, Callable, cast

from ralp_pipe.errors import ConfigError

STAR, RING = "star", "ring"  # the link patterns (StrategyKind.link_pattern)


@dataclass(frozen=True)
class StrategyKind:
    """The properties of one strategy that stages decide on."""

    name: str
    has_ps: bool  # `strategy.num_ps` parameter-server ranks that hold parameters and apply SGD (placeable)
    places_layers: bool  # one PS device runs the units above a split point on the workers' concatenated batch
    min_gpus: int  # fewest devices it runs on
    workers: Callable[[int], int]  # data-parallel workers at N devices
    servers: Callable[[int, int], int]  # server ranks (PS processes or the PS device) at N devices and `num_ps`
    per_worker_volume: bool  # bytes per step are the workers x one worker's (the planner scales one figure)
    step: str | None  # "module:Class" of its step (engine.strategies.base.Strategy), imported on use; None: not trained
    volume: str  # "module:function" giving its bytes per step by category (engine.volume), imported on use
    ranks: str  # its ranks with N devices, in words
    # the traffic its links carry: STAR, workers pushing to and pulling from its servers (a star through each server's
    # host; contract.topology.link_pattern counts the hubs), or RING, every worker's link at once (an all-reduce ring)
    link_pattern: str
    baseline: bool = False  # a baseline RALP's speedups are reported over (plans give it no `pays` verdict)
    whole_variables: bool = False  # each parameter tensor whole on one PS (Distributed TensorFlow), not partitioned
    # one PS task per worker host beside its workers (strategy.num_ps does not apply): N at one GPU per host, trimmed
    # to the hosts where hosts hold several (contract/topology.py on_hosts, planning/planner.py strategy_pricing)
    ps_per_host: bool = False
    reference: bool = False  # the baseline plans' `speedup_over_<name>` ranks first and `pays` is judged against

    @property
    def trainable(self) -> bool:
        """Whether `train` can run this strategy (it has a step class)."""
        return self.step is not None

    def check_trainable(self) -> None:
        """Refuse, naming what is missing, a strategy `train` cannot run."""
        if self.step is None:
            raise ConfigError(
                f"strategy {self.name!r} is priced by `ralp-pipe plan` and `simulate` only: the engine has no step "
                f"class for it yet (engine/strategies/), so `train` cannot run it; drop it from experiment.strategies"
            )

    @property
    def step_class(self) -> Any:
        """The class whose instance runs this strategy's step on one rank; refused where it has none."""
        self.check_trainable()
        return _resolve(cast(str, self.step))

    @property
    def volume_function(self) -> Callable[..., dict[str, int]]:
        """``(units, split, topology, batch_size, image_size, bytes_per_element) -> bytes by category``."""
        return _resolve(self.volume)


def _resolve(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


_ENGINE = "ralp_pipe.engine"
_PS = StrategyKind(
    "ps",
    has_ps=True,
    places_layers=False,
    min_gpus=1,
    workers=lambda n: n,
    servers=lambda n, num_ps: num_ps,
    per_worker_volume=True,
    step=f"{_ENGINE}.strategies.ps:ParameterServerStrategy",
    volume=f"{_ENGINE}.volume:push_pull_bytes",
    ranks="N workers + `num_ps` parameter servers",
    link_pattern=STAR,
    baseline=True,
    reference=True,
)
STRATEGY_KINDS: dict[str, StrategyKind] = {
    kind.name: kind
    for kind in (
        _PS,
        StrategyKind(
            "allreduce",
            has_ps=False,
            places_layers=False,
            min_gpus=1,
            workers=lambda n: n,
            servers=lambda n, num_ps: 0,
            per_worker_volume=False,
            step=f"{_ENGINE}.strategies.allreduce:AllReduceStrategy",
            volume=f"{_ENGINE}.volume:ring_bytes",
            ranks="N workers",
            link_pattern=RING,
            baseline=True,
        ),
        StrategyKind(
            "ralp_h",
            has_ps=False,
            places_layers=True,
            min_gpus=2,
            workers=lambda n: (n + 1) // 2,
            servers=lambda n, num_ps: 1,
            per_worker_volume=True,
            step=f"{_ENGINE}.strategies.ralp:LayerPlacementStrategy",
            volume=f"{_ENGINE}.volume:placement_bytes",
            ranks="⌈N/2⌉ workers + 1 PS device",
            link_pattern=STAR,
        ),
        StrategyKind(
            "ralp_n",
            has_ps=False,
            places_layers=True,
            min_gpus=2,
            workers=lambda n: n - 1,
            servers=lambda n, num_ps: 1,
            per_worker_volume=True,
            step=f"{_ENGINE}.strategies.ralp:LayerPlacementStrategy",
            volume=f"{_ENGINE}.volume:placement_bytes",
            ranks="N-1 workers + 1 PS device",
            link_pattern=STAR,
        ),
        StrategyKind(
            "dtf",
            has_ps=True,
            places_layers=False,
            min_gpus=1,
            workers=lambda n: n,
            # one PS task per worker host, as Distributed TensorFlow was deployed and the planner prices it
            # (planning/planner.py strategy_pricing); strategy.num_ps does not apply. Hosts of one GPU: N tasks
            servers=lambda n, num_ps: n,
            per_worker_volume=True,
            step=f"{_ENGINE}.strategies.dtf:WholeVariableStrategy",
            volume=f"{_ENGINE}.volume:whole_variable_bytes",
            ranks="N workers + N parameter-server tasks (one per worker host)",
            link_pattern=STAR,
            baseline=True,
            whole_variables=True,
            ps_per_host=True,
        ),
        # BytePS's deployment of `ps`: a server on every worker host, every tensor partitioned over all of them, a
        # host's GPUs summed before its one push (ps's step and volume); strategy.num_ps does not apply
        replace(
            _PS,
            name="byteps",
            servers=lambda n, num_ps: n,
            ranks="N workers + N parameter servers (one per worker host, partitioned)",
            reference=False,
            ps_per_host=True,
        ),
    )
}


def strategy_kind(name: str) -> StrategyKind:
    """The description of strategy `name`; an unknown one raises naming the choices."""
    try:
        return STRATEGY_KINDS[name]
    except KeyError:
        raise ConfigError(
            f"strategy.name={name!r} is not allowed; choose one of: {', '.join(STRATEGY_KINDS)}"
        ) from None


def reference_baseline() -> str:
    """The baseline plans judge `pays` against: the table's one :attr:`StrategyKind.reference` entry."""
    (name,) = (name for name, kind in STRATEGY_KINDS.items() if kind.reference)
    return name


def baselines() -> list[str]:
    """The strategies RALP's speedups are reported over: the parameter servers in table order, then the others."""
    marked = [name for name, kind in STRATEGY_KINDS.items() if kind.baseline]
    return sorted(marked, key=lambda name: not STRATEGY_KINDS[name].has_ps)


def trainable_strategies() -> list[str]:
    """Names of the strategies `train` can run, in table order (the default of experiment.strategies)."""
    return [name for name, kind in STRATEGY_KINDS.items() if kind.trainable]
