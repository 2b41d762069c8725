"""The workflow's compositions kept on disk: reused while config/ and the overrides are unchanged, never stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ralp_pipe.config import CONFIG_DIR, ConfigError, load
from ralp_pipe.workflow import compositions
from ralp_pipe.workflow.compositions import cache_dir, cached_load

OVERRIDES = ["experiment=smoke", "model=vgg11", "train.lr=0.05"]


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of config/ and an empty cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return Path(shutil.copytree(CONFIG_DIR, tmp_path / "config"))


def _no_hydra(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("composed again")

    monkeypatch.setattr(compositions, "load", refuse)


def test_a_stored_composition_equals_hydras_and_is_reused(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = cached_load(OVERRIDES, config_dir)
    assert first == load(OVERRIDES, config_dir) and first.train.lr == 0.05
    assert len(list(cache_dir().glob("*.json"))) == 1
    _no_hydra(monkeypatch)
    assert cached_load(OVERRIDES, config_dir) == first


@pytest.mark.slow
def test_an_edited_config_file_or_another_override_composes_afresh(config_dir: Path) -> None:
    cached_load(OVERRIDES, config_dir)
    model = config_dir / "model" / "vgg11.yaml"
    model.write_text(model.read_text().replace("dropout: 0.5", "dropout: 0.25"))
    assert "0.25" in model.read_text()
    assert cached_load(OVERRIDES, config_dir).model.dropout == 0.25
    assert cached_load([*OVERRIDES, "train.lr=0.1"], config_dir).train.lr == 0.1


def test_a_changed_schema_composes_afresh(config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached_load(OVERRIDES, config_dir)
    schema = tmp_path / "schema.py"
    schema.write_text(compositions.SCHEMA_SOURCE.read_text() + "\n# a default changed\n")
    monkeypatch.setattr(compositions, "SCHEMA_SOURCE", schema)
    cached_load(OVERRIDES, config_dir)
    assert len(list(cache_dir().glob("*.json"))) == 2


def test_a_damaged_or_unwritable_cache_is_only_skipped(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = cached_load(OVERRIDES, config_dir)
    [stored] = cache_dir().glob("*.json")
    stored.write_text('{"model": ')
    assert cached_load(OVERRIDES, config_dir) == expected
    _no_hydra(monkeypatch)
    assert cached_load(OVERRIDES, config_dir) == expected  # rewritten whole
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/ralp-pipe-cannot-write-here")
    assert cached_load(OVERRIDES, config_dir) == expected


@pytest.mark.slow
def test_a_bad_setting_is_refused_every_time_and_a_stored_config_is_validated_again(
    config_dir: Path, tmp_path: Path
) -> None:
    for _ in range(2):
        with pytest.raises(ConfigError, match="train.lr=-1.0"):
            cached_load([*OVERRIDES[:2], "train.lr=-1"], config_dir)
    assert list(cache_dir().glob("*.json")) == []
    source = tmp_path / "imagenet"
    source.mkdir()
    real = ["dataset=imagenet1k", f"dataset.source={source}"]
    assert cached_load(real, config_dir).dataset.source == str(source)
    source.rmdir()
    with pytest.raises(ConfigError, match="is not a readable folder"):
        cached_load(real, config_dir)
