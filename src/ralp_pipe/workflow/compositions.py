"""Hydra compositions the workflow makes while it parses, kept on disk between invocations.

Composing ``config/`` takes Hydra a few tenths of a second, and the matrix composes once per
experiment and per option of every matrix group, so a rerun with nothing to do spent most of its
time composing what it had composed before. A composition is a function of the overrides, the
files of ``config/``, the schema's source and the Hydra and OmegaConf versions; the typed config is stored under a
digest of all of them (``$XDG_CACHE_HOME/ralp-pipe/compose/``, default ``~/.cache``), so an edited
config file or another override is composed afresh. Its values are validated on every use
(:func:`ralp_pipe.config.validate`: a dataset folder may have gone); a cache that cannot be read
or written is skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any, Sequence, TypeVar, get_type_hints

from ralp_pipe.atomic import write_json_atomic
from ralp_pipe.config import CONFIG_DIR, Config, digest, load, schema, to_dict, validate

SCHEMA_SOURCE = Path(schema.__file__)  # its dataclasses' defaults are part of every composition
T = TypeVar("T")


def cache_dir() -> Path:
    """Where compositions are kept."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ralp-pipe" / "compose"


def _tree_digest(config_dir: Path) -> str:
    files = sorted(p for p in config_dir.rglob("*") if p.is_file())
    sums = {p.relative_to(config_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    schema = hashlib.sha256(SCHEMA_SOURCE.read_bytes()).hexdigest()
    return digest({"files": sums, "schema": schema, "hydra": version("hydra-core"), "omegaconf": version("omegaconf")})


def cached_load(overrides: Sequence[str], config_dir: Path = CONFIG_DIR) -> Config:
    """:func:`ralp_pipe.config.load`, composing with Hydra (and type-checking with OmegaConf) only what no
    earlier call stored; a stored config is rebuilt as the typed dataclasses it was and validated again."""
    path = cache_dir() / f"{digest({'overrides': list(overrides), 'config': _tree_digest(config_dir)})}.json"
    try:
        stored = json.loads(path.read_text())
        cfg = _typed(Config, stored)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        cfg = load(overrides, config_dir)
        try:
            write_json_atomic(path, to_dict(cfg))
        except OSError:
            pass
        return cfg
    validate(cfg)
    return cfg


def _typed(cls: type[T], data: Any) -> T:
    """`data` (a stored :func:`ralp_pipe.config.to_dict`) as dataclass `cls`, its dataclass fields recursively."""
    hints = get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind = hints[f.name]
        nested = isinstance(kind, type) and dataclasses.is_dataclass(kind)
        values[f.name] = _typed(kind, data[f.name]) if nested else data[f.name]
    return cls(**values)
