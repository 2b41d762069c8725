"""A model's unit table (sizes only) prices exactly what its torch units do, and comes from a cached trace."""

from __future__ import annotations

import pytest

from ralp_pipe.config import STRATEGY_KINDS, ConfigError, load
from ralp_pipe.config.schema import StrategyConfig
from ralp_pipe.contract import unit_table
from ralp_pipe.contract.topology import topology
from ralp_pipe.engine import devicemodel, models, volume
from ralp_pipe.planning.planner import whole_variables

CASES = [("resnet18", 32), ("alexnet", 64)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty trace cache of its own, and no trace of this process's memory."""
    monkeypatch.setenv(devicemodel.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(devicemodel, "_TRACES", {})
    return tmp_path / "cache"


def tables(name: str, size: int) -> tuple[list[models.Unit], unit_table.UnitTable]:
    """The meta units of `name` and the unit table of its (cached) trace."""
    cfg = load([f"model={name}", f"train.image_size={size}"])
    devicemodel.model_trace(name, cfg.dataset.num_classes, size, cfg.model.dropout, cfg.train)
    table = devicemodel.unit_table(name, cfg.dataset.num_classes, size, cfg.model.dropout, cfg.train)
    return models.model_units(name, cfg.dataset.num_classes, cfg.model.dropout, "meta"), table


@pytest.mark.parametrize("name,size", CASES)
def test_a_traced_table_is_the_table_of_the_built_units(cache, name, size) -> None:
    units, table = tables(name, size)
    assert table == devicemodel.models_table(units, size)
    assert table.names == [u.name for u in units]
    assert [u.is_dense for u in table] == [u.is_dense for u in units]


@pytest.mark.parametrize("name,size", CASES)
def test_a_table_prices_the_bytes_and_variables_of_its_units(cache, name, size) -> None:
    units, table = tables(name, size)
    for strategy, kind in STRATEGY_KINDS.items():
        for gpus in sorted({kind.min_gpus, 5}):
            topo = topology(strategy, gpus, 2)
            for split in (1, len(units) // 2, len(units) - 1) if kind.places_layers else (None,):
                want = volume.step_bytes(strategy, units, split, topo, 4, size)
                assert volume.step_bytes(strategy, table, split, topo, 4, size) == want, (strategy, gpus, split)
    dtf = StrategyConfig(name="dtf")
    assert whole_variables(table, dtf) == whole_variables(units, dtf)


def test_a_table_is_priced_at_its_own_image_size_and_splits_only(cache) -> None:
    _, table = tables(*CASES[0])
    with pytest.raises(ValueError, match="32 px priced at 64 px"):
        table.split_activation_elements(2, 64)
    with pytest.raises(ConfigError, match="out of range"):
        table.split_activation_elements(len(table), 32)


def test_without_a_cached_trace_the_table_is_built_and_nothing_traced(cache, monkeypatch) -> None:
    monkeypatch.setattr(devicemodel, "_trace", lambda *args: pytest.fail("traced for a unit table"))
    cfg = load(["model=resnet18", "train.image_size=32"])
    table = devicemodel.unit_table("resnet18", cfg.dataset.num_classes, 32, cfg.model.dropout, cfg.train)
    units = models.model_units("resnet18", cfg.dataset.num_classes, cfg.model.dropout, "meta")
    assert table == devicemodel.models_table(units, 32)
    assert not list(cache.glob("*.npz"))


def test_the_moved_rules_keep_their_old_names() -> None:
    assert volume.variable_owners is unit_table.variable_owners
    assert models.check_split(3, 5) == unit_table.check_split(3, 5) == 3
