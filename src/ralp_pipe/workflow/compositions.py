"""Hydra compositions the workflow makes while it parses, kept on disk between invocations.

Composing ``config/`` takes Hydra a few tenths of a second, and the matrix composes once per
experiment and per option of every matrix group, so a rerun with nothing to do spent most of its
time composing what it had composed before. A composition is a function of the overrides, the
files of ``config/`` and the Hydra and OmegaConf versions; the resolved tree is stored under a
digest of all of them (``$XDG_CACHE_HOME/ralp-pipe/compose/``, default ``~/.cache``), so an edited
config file or another override is composed afresh. The tree is type-checked and validated on
every use (:func:`ralp_pipe.config.from_dict`); a cache that cannot be read or written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any, Sequence

from ralp_pipe.atomic import write_json_atomic
from ralp_pipe.config import CONFIG_DIR, Config, digest, from_dict
from ralp_pipe.config.compose import compose_tree


def cache_dir() -> Path:
    """Where compositions are kept."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ralp-pipe" / "compose"


def _tree_digest(config_dir: Path) -> str:
    files = sorted(p for p in config_dir.rglob("*") if p.is_file())
    sums = {p.relative_to(config_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    return digest({"files": sums, "hydra": version("hydra-core"), "omegaconf": version("omegaconf")})


def cached_load(overrides: Sequence[str], config_dir: Path = CONFIG_DIR) -> Config:
    """:func:`ralp_pipe.config.load`, composing with Hydra only what no earlier call stored."""
    path = cache_dir() / f"{digest({'overrides': list(overrides), 'config': _tree_digest(config_dir)})}.json"
    tree: Any = None
    try:
        tree = json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    if not isinstance(tree, dict):
        tree = compose_tree(overrides, config_dir)
        try:
            write_json_atomic(path, tree)
        except OSError:
            pass
    return from_dict(tree)
