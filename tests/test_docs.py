"""The documentation's generated pages list every key of the schema, every group option and every exit code."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Iterator

from ralp_pipe import errors
from ralp_pipe.config import schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def rendered(page: str) -> str:
    """A docs page's Markdown as the site's hook fills it in at build time."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.on_page_markdown((DOCS / page).read_text())


def leaf_keys(root: type, prefix: str = "") -> Iterator[str]:
    """Every dotted leaf key of a schema dataclass, walked independently of the generator."""
    for item in fields(root):
        nested = item.default_factory() if item.default_factory is not MISSING else None
        if is_dataclass(nested):
            yield from leaf_keys(type(nested), f"{prefix}{item.name}.")
        else:
            yield f"{prefix}{item.name}"


def test_the_reference_page_lists_every_key_of_the_schema() -> None:
    page = rendered("reference/configuration.md")
    listed = set(re.findall(r"^\| `([\w.]+)` \|", page, flags=re.M))
    missing = sorted(set(leaf_keys(schema.Config)) - listed)
    assert not missing, f"docs/reference/configuration.md does not list {missing}"
    assert "<!-- generated:" not in page


def test_the_reference_page_lists_every_group_option() -> None:
    page = rendered("reference/configuration.md")
    for path in (ROOT / "config").rglob("*.yaml"):
        if path.parent.name != "config":
            assert f"| `{path.stem}` |" in page, f"config option {path} is not in the reference"


def test_the_failures_page_lists_every_exit_code() -> None:
    page = rendered("failures.md")
    for name in ("BundleRefused", "ConfigError", "DataError", "RunFailure", "Interrupted"):
        kind = getattr(errors, name)
        assert f"`{name}`" in page
        if name != "Interrupted":
            assert f"| {kind.exit_code} | `{name}` |" in page
    assert "130 (SIGINT), 143 (SIGTERM)" in page


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"
