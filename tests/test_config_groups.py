"""Every option of every Hydra config group composes, alone and as the experiments combine them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ralp_pipe.config import CONFIG_DIR, Config, ConfigError, load
from ralp_pipe.config.schema import MIN_IMAGE_SIZE, StrategyConfig

GROUPS = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())
OPTIONS = [(group, option.stem) for group in GROUPS for option in sorted((CONFIG_DIR / group).glob("*.yaml"))]
REAL_DATA = {"imagenet1k", "imagenet22k"}


def _overrides(group: str, option: str, source: Path) -> list[str]:
    extra = [f"dataset.source={source}"] if group == "dataset" and option in REAL_DATA else []
    if group == "model" and option in MIN_IMAGE_SIZE:  # the default experiment's 32 px is too small for it
        extra.append(f"train.image_size={MIN_IMAGE_SIZE[option]}")
    return [f"{group}={option}", *extra]


def test_every_group_has_options() -> None:
    assert set(GROUPS) == {"cluster", "dataset", "device", "experiment", "interconnect", "model", "network", "strategy"}
    assert len(OPTIONS) >= 30


@pytest.mark.slow
@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_each_option_composes_and_selects_itself(group: str, option: str, tmp_path: Path) -> None:
    overrides = _overrides(group, option, tmp_path)
    if group == "experiment" and option == "paper":
        overrides += ["dataset=imagenet1k", f"dataset.source={tmp_path}"]
    cfg = load(overrides)
    assert isinstance(cfg, Config)
    section = getattr(cfg, group)
    selected = section.kind if group == "cluster" else section.name
    assert selected == option


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [o for g, o in OPTIONS if g == "strategy"])
def test_every_strategy_takes_the_schemas_transfer_defaults_and_their_overrides(strategy: str) -> None:
    """bucket_mb and credit come from one shared file, equal to the schema's defaults (but dtf's credit: TensorFlow
    has no scheduling credit), and override per run."""
    cfg = load([f"strategy={strategy}"])
    credit = 0 if strategy == "dtf" else StrategyConfig.credit
    assert (cfg.strategy.bucket_mb, cfg.strategy.credit) == (StrategyConfig.bucket_mb, credit)
    cfg = load([f"strategy={strategy}", "strategy.bucket_mb=4", "strategy.credit=2"])
    assert (cfg.strategy.name, cfg.strategy.bucket_mb, cfg.strategy.credit) == (strategy, 4.0, 2)


@pytest.mark.slow  # composes every dataset x model x network of the paper experiment (~6 s)
def test_the_paper_experiment_composes_with_every_dataset_model_and_network(tmp_path: Path) -> None:
    base = load(["experiment=paper", "dataset=imagenet1k", f"dataset.source={tmp_path}"])
    e = base.experiment
    for dataset in e.datasets:
        for model in e.models:
            for network in e.networks:
                cfg = load(
                    [
                        "experiment=paper",
                        f"dataset={dataset}",
                        f"dataset.source={tmp_path}",
                        f"model={model}",
                        f"network={network}",
                        "cluster.gpus=16",
                    ]
                )
                assert (cfg.dataset.name, cfg.model.name, cfg.network.name) == (dataset, model, network)
                assert cfg.train.image_size == 224 and cfg.train.loader == "dali"


@pytest.mark.slow  # 2 datasets x 4 strategies x 4 N compositions (~6 s)
def test_the_paper_experiment_composes_every_strategy_and_n_on_each_dataset_with_its_own_path(tmp_path: Path) -> None:
    sources = {"imagenet1k": tmp_path / "ILSVRC2012" / "train", "imagenet22k": tmp_path / "imagenet21k"}
    for source in sources.values():
        source.mkdir(parents=True)
    e = load(["experiment=paper"]).experiment
    assert sorted(e.datasets) == sorted(sources)
    for dataset in e.datasets:
        for strategy in e.strategies:
            for gpus in e.gpus:
                cfg = load(
                    [
                        "experiment=paper",
                        f"dataset={dataset}",
                        f"dataset.source={sources[dataset]}",
                        f"strategy={strategy}",
                        f"cluster.gpus={gpus}",
                    ]
                )
                assert (cfg.strategy.name, cfg.cluster.gpus) == (strategy, gpus)
                assert (cfg.dataset.name, cfg.dataset.source) == (dataset, str(sources[dataset]))
                assert cfg.dataset.layout == ("folders" if dataset == "imagenet1k" else "tars")


@pytest.mark.slow
@pytest.mark.parametrize("dataset", sorted(REAL_DATA))
def test_the_paper_experiment_refuses_a_real_dataset_without_its_path(dataset: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"dataset.source is missing for dataset '{dataset}'"):
        load(["experiment=paper", f"dataset={dataset}"])
    with pytest.raises(ConfigError, match=f"dataset.source='{tmp_path / 'absent'}'.*is not a readable folder"):
        load(["experiment=paper", f"dataset={dataset}", f"dataset.source={tmp_path / 'absent'}"])
