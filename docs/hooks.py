"""MkDocs hook: fills a page's ``<!-- generated: NAME -->`` markers with the reference the code generates."""

from __future__ import annotations

from typing import Any, Callable

from ralp_pipe.config import reference

GENERATED: dict[str, Callable[[], str]] = {
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
