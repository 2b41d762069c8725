"""MkDocs hook: fills a page's ``<!-- generated: NAME -->`` markers with the reference the code generates."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from ralp_pipe.config import reference

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_markdown() -> str:
    """The README as the site's home page: its links into ``docs/`` made relative to the site."""
    text = re.sub(r"\]\(docs/", "](", README.read_text())
    return text.replace("[`docs/`](index.md)", "these pages")


GENERATED: dict[str, Callable[[], str]] = {
    "readme": readme_markdown,
    "schema": reference.schema_markdown,
    "groups": reference.groups_markdown,
    "exit-codes": reference.exit_codes_markdown,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page's Markdown with every marker replaced by the generated text it names."""
    for name, make in GENERATED.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
