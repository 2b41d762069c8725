"""The strategy table decides what a strategy is: a strategy added there flows through config, topology,
volume and plan without any other module knowing its name."""

from __future__ import annotations

from functools import lru_cache

import pytest

from ralp_pipe.config import STRATEGY_KINDS, ConfigError, StrategyKind, from_dict, load, strategy_kind
from ralp_pipe.contract.records import Profile
from ralp_pipe.contract.topology import PS_DEVICE, WORKER, largest_world, topology
from ralp_pipe.engine import models
from ralp_pipe.engine.strategies.ralp import LayerPlacementStrategy
from ralp_pipe.engine.volume import step_bytes
from ralp_pipe.planning.planner import build_plan
from ralp_pipe.planning.profiling import worker_and_ps_batches
from support.profiles import analytic_profile

# layer placement with two devices fewer than N as workers: its own counts, RALP's step and volume
TOY = StrategyKind(
    "ralp_q",
    has_ps=False,
    places_layers=True,
    min_gpus=3,
    workers=lambda n: n - 2,
    servers=lambda n, num_ps: 1,
    per_worker_volume=True,
    step="ralp_pipe.engine.strategies.ralp:LayerPlacementStrategy",
    volume="ralp_pipe.engine.volume:placement_bytes",
    ranks="N-2 workers + 1 PS device",
    link_pattern="star",
)
MODEL, CLASSES, IMAGE, BATCH = "resnet18", 10, 32, 2


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> StrategyKind:
    """TOY registered in the table for one test, removed afterwards."""
    monkeypatch.setitem(STRATEGY_KINDS, TOY.name, TOY)
    return TOY


@lru_cache(maxsize=None)
def _units() -> list[models.Unit]:
    return models.placement_units(models.build(MODEL, CLASSES))


def test_an_unknown_strategy_is_refused_naming_the_table(toy: StrategyKind) -> None:
    with pytest.raises(ConfigError, match=r"strategy.name='ralp_z' is not allowed; choose one of: ps, .*ralp_q"):
        strategy_kind("ralp_z")
    assert strategy_kind("ralp_q").step_class is LayerPlacementStrategy


def test_a_registered_strategy_is_configurable_with_its_own_minimum(toy: StrategyKind) -> None:
    assert from_dict({"strategy": {"name": "ralp_q"}, "cluster": {"gpus": 3}}).strategy.name == "ralp_q"
    with pytest.raises(ConfigError, match=r"cluster.gpus=2 is too few for ralp_q: it needs at least 3 \(N-2 workers"):
        load(["strategy.name=ralp_q", "cluster.gpus=2"])


def test_a_registered_strategy_gets_its_topology_and_profile_batches(toy: StrategyKind) -> None:
    topo = topology("ralp_q", 5)
    assert topo.roles == [WORKER] * 3 + [PS_DEVICE] and topo.hosts == list(range(4))
    with pytest.raises(ValueError, match="too few for ralp_q"):
        topology("ralp_q", 2)
    assert worker_and_ps_batches(BATCH, 5)["ps_ralp_q"] == 3 * BATCH
    assert "ps_ralp_q" not in worker_and_ps_batches(BATCH, 2)
    # ralp_q cannot run on 2 devices: not counted; dtf's PS task per worker host makes the largest run of all
    assert largest_world(2, strategies=["ps", "ralp_q"]) == topology("ps", 2).world_size
    assert largest_world(2) == topology("dtf", 2).world_size == 4


@pytest.mark.slow
def test_a_registered_strategy_moves_what_its_volume_function_says(toy: StrategyKind) -> None:
    units, split = _units(), 4
    mine = step_bytes("ralp_q", units, split, topology("ralp_q", 5), BATCH, IMAGE)
    same_workers = step_bytes("ralp_n", units, split, topology("ralp_n", 4), BATCH, IMAGE)  # 3 workers as well
    assert mine == same_workers and mine["activations"] > 0 and mine["labels"] == 3 * BATCH * 8


@pytest.mark.slow
def test_a_registered_strategy_is_planned_at_every_split_and_only_where_it_fits(toy: StrategyKind) -> None:
    units = _units()
    batches = sorted({BATCH, *(BATCH * w for w in (1, 2, 3, 4))})
    profile = analytic_profile(MODEL, CLASSES, IMAGE, batches, 5e10, 1e9, 5e11)
    cfg = load([f"model={MODEL}", "dataset.num_classes=10", f"train.image_size={IMAGE}", f"train.batch_size={BATCH}"])
    plan = build_plan(Profile.from_dict(profile, "analytic"), "analytic", cfg, [5, 2])
    entry = plan.by_gpus["5"]["ralp_q"]
    assert entry["roles"] == [WORKER] * 3 + [PS_DEVICE] and entry["num_workers"] == 3
    assert [row["split"] for row in entry["table"]] == list(range(1, len(units)))
    assert entry["split_after_unit"] == units[entry["split"] - 1].name
    expected = step_bytes("ralp_q", units, entry["split"], topology("ralp_q", 5), BATCH, IMAGE)
    assert entry["predicted_bytes_per_step"] == expected
    assert "ralp_q" not in plan.by_gpus["2"] and "ralp_n" in plan.by_gpus["2"]
