"""Config composition and validation: bad values are refused with the key, value and choices."""

from __future__ import annotations

import pytest

from ralp_pipe.config import MODELS, ConfigError, digest, from_dict, load, to_dict
from ralp_pipe.config.strategies import trainable_strategies


def test_default_composition_is_the_local_experiment() -> None:
    cfg = load()
    assert cfg.experiment.name == "local"
    assert cfg.dataset.layout == "synthetic"
    # the paper's four; `dtf` and `byteps` train where an experiment names them (paper-dilated)
    assert set(cfg.experiment.strategies) == set(trainable_strategies()) - {"dtf", "byteps"}


@pytest.mark.slow
def test_experiment_overrides_and_command_line_overrides_compose() -> None:
    cfg = load(["experiment=smoke", "train.batch_size=3", "model=resnet50", "dataset=synthetic22k"])
    assert cfg.experiment.name == "smoke"
    assert cfg.train.batch_size == 3
    assert cfg.model.name == "resnet50"
    assert cfg.dataset.num_classes == 21841


def test_unknown_model_group_names_the_available_options() -> None:
    with pytest.raises(ConfigError, match=r"^model='foo' is not allowed; choose one of: alexnet, .*vgg11"):
        load(["model=foo"])


def test_unknown_model_name_names_key_value_and_choices() -> None:
    with pytest.raises(ConfigError) as err:
        load(["model.name=lenet"])
    message = str(err.value)
    assert "model.name" in message and "'lenet'" in message
    assert all(name in message for name in MODELS)


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"strategy.name='gossip'.*ps, allreduce, ralp_h, ralp_n"):
        load(["strategy.name=gossip"])


def test_negative_batch_size_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"train.batch_size=-1 must be at least 1"):
        load(["train.batch_size=-1"])


def test_wrong_type_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"train.batch_size"):
        load(["train.batch_size=many"])


def test_missing_dataset_path_is_refused_with_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"dataset.source is missing for dataset 'imagenet1k'.*dataset.source="):
        load(["dataset=imagenet1k"])


def test_nonexistent_dataset_path_is_named(tmp_path) -> None:
    missing = tmp_path / "no-such-imagenet"
    with pytest.raises(ConfigError, match=str(missing)):
        load(["dataset=imagenet22k", f"dataset.source={missing}"])


def test_shell_metacharacters_in_names_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"model.name='vgg11; touch /tmp/x'"):
        from_dict({"model": {"name": "vgg11; touch /tmp/x"}})
    with pytest.raises(ConfigError, match=r"network.name"):
        from_dict({"network": {"name": "$(reboot)"}})


def test_bad_network_rate_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"network.rate='fast'"):
        load(["network.rate=fast"])


def test_ralp_needs_two_devices() -> None:
    with pytest.raises(ConfigError, match=r"cluster.gpus=1 is too few for ralp_n"):
        load(["strategy=ralp_n", "cluster.gpus=1"])


@pytest.mark.slow
def test_resolved_config_round_trips_and_hashes_stably() -> None:
    cfg = load(["model=vgg16"])
    again = from_dict(to_dict(cfg))
    assert again == cfg
    assert digest(to_dict(cfg)) == digest(to_dict(again))
    assert digest(to_dict(cfg)) != digest(to_dict(load(["model=vgg19"])))


def test_image_too_small_for_the_model_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"train.image_size=32 must be at least 64"):
        load(["model=alexnet", "train.image_size=32"])
