"""The documentation's generated pages list every key of the schema, every group option and every exit code."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Iterator

import pytest

from ralp_pipe import errors
from ralp_pipe.config import reference, schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def rendered(page: str) -> str:
    """A docs page's Markdown, its generated blocks written by cog (``make docs``; ``make lint`` checks them)."""
    return (DOCS / page).read_text()


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


@pytest.mark.slow
def test_every_key_of_the_reference_has_a_description() -> None:
    undescribed = [key.key for key in reference.schema_keys() if not key.comment.strip()]
    assert not undescribed, f"keys without a comment in config/schema.py or config/: {undescribed}"
    assert all(key.type != "Any" for key in reference.schema_keys()), "a key typed Any in the reference"


def _cog_check(folder: Path) -> subprocess.CompletedProcess[str]:
    """`make lint`'s check of the generated blocks, run on a copy of the docs' generator in `folder`."""
    return subprocess.run(
        [sys.executable, "-m", "cogapp", "--check", "-I", str(folder), str(folder / "page.md")],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.slow
def test_lint_fails_when_a_generated_figure_or_its_record_changes(tmp_path: Path) -> None:
    shutil.copy(DOCS / "records.py", tmp_path / "records.py")
    (tmp_path / "records").mkdir()
    measured = {"command": "python benchmarks/x.py", "revision": "abc1234", "date": "2026-12-07", "machine": "m"}
    record = tmp_path / "records" / "x.json"
    record.write_text(json.dumps({**measured, "figures": {"speedup": 2.345}}))
    page = tmp_path / "page.md"
    page.write_text(
        "RALP is <!-- [[[cog import records; cog.out(records.fig('x', 'speedup', '.2f') + 'x') ]]] -->\n"
        "<!-- [[[end]]] --> faster.\n"
    )
    written = subprocess.run([sys.executable, "-m", "cogapp", "-r", "-I", str(tmp_path), str(page)], check=False)
    assert written.returncode == 0 and "2.35x" in page.read_text()
    assert _cog_check(tmp_path).returncode == 0

    page.write_text(page.read_text().replace("2.35x", "2.50x"))  # a figure edited by hand
    assert _cog_check(tmp_path).returncode != 0
    page.write_text(page.read_text().replace("2.50x", "2.35x"))
    assert _cog_check(tmp_path).returncode == 0

    record.write_text(json.dumps({**measured, "figures": {"speedup": 2.1}}))  # measured again, not regenerated
    assert _cog_check(tmp_path).returncode != 0


@pytest.mark.slow
def test_the_generated_blocks_match_their_records() -> None:
    listed = (DOCS / "generated.txt").read_text().split()
    checked = subprocess.run(
        [sys.executable, "-m", "cogapp", "--check", "-I", str(DOCS), *listed],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    holding = {str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *DOCS.rglob("*.md")] if "[[[cog" in p.read_text()}
    assert holding <= set(listed), f"docs/generated.txt does not list {sorted(holding - set(listed))}"


def _github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but hyphens and underscores dropped, spaces
    to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page as GitHub renders it (repeats numbered -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"^#{1,6} (.+)$", line)
        if match:
            slug = _github_slug(match[1])
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def test_readme_links_resolve_as_github_renders_them() -> None:
    text = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(), flags=re.S)
    dead = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        if not file.exists():
            dead.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            dead.append(target)
    assert not dead, f"README.md links to what is not there: {dead}"
