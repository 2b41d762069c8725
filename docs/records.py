"""The documentation's measured figures, read from the records the measurements left (``docs/records/*.json``).

README.md and the pages under ``docs/`` hold cog blocks (``<!-- [[[cog ... ]]] -->`` up to
``<!-- [[[end]]] -->``) whose text is written by these functions and by the configuration reference
(:mod:`ralp_pipe.config.reference`). ``make docs`` writes every block again; ``make lint`` runs the same
generator with ``--check`` and fails where a block differs from what its record gives, so a figure edited by
hand, or a record measured again without regenerating, is caught. The files holding blocks are listed in
``docs/generated.txt``.

A record is one JSON object: ``command`` (what produced it), ``revision`` (the commit it ran at), ``date``,
``machine``, optionally ``note`` (how it was obtained, e.g. transcribed from a run's printed output), and
``figures``: the measured values, nested by name.
"""

from __future__ import annotations

import json
import re
import textwrap
from functools import cache
from pathlib import Path
from typing import Any, Sequence

DOCS = Path(__file__).resolve().parent
RECORDS = DOCS / "records"
README = DOCS.parent / "README.md"
REQUIRED = ("command", "revision", "date", "machine", "figures")


class RecordError(ValueError):
    """A record that is missing, unreadable or lacks a figure a page asks for."""


@cache
def record(name: str) -> dict[str, Any]:
    """The record ``docs/records/<name>.json``, checked to hold every field of :data:`REQUIRED`."""
    path = RECORDS / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path}: cannot be read as a record ({exc})") from None
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise RecordError(f"{path}: lacks {', '.join(missing)}")
    return data


def value(name: str, key: str) -> Any:
    """The figure at dotted `key` (``a.b.0``: list items by index) of record `name`."""
    found: Any = record(name)["figures"]
    for part in key.split("."):
        try:
            found = found[int(part)] if isinstance(found, list) else found[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise RecordError(f"docs/records/{name}.json has no figure {key!r}") from None
    return found


def value_of(name: str, field: str) -> Any:
    """A field of record `name` beside its figures: ``command``, ``revision``, ``date``, ``machine``."""
    return record(name)[field]


def num(x: float) -> str:
    """A measured number as the record gives it, a float keeping one decimal where it is whole (``12.0``)."""
    return f"{x:.1f}" if isinstance(x, float) and x.is_integer() else f"{x:g}"


def wrap(text: str, width: int = 110) -> str:
    """`text` as one Markdown paragraph: its whitespace collapsed, wrapped at `width` (long links stay whole)."""
    return textwrap.fill(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


def fig(name: str, key: str, spec: str = "") -> str:
    """The figure at `key` of record `name`, formatted with `spec` (a format spec such as ``.1f``)."""
    found = value(name, key)
    return format(found, spec) if spec else num(found)


def figs(name: str, key: str, spec: str = "", sep: str = ", ", last: str | None = None) -> str:
    """The list at `key` of record `name`, each item formatted with `spec`, joined by `sep` (`last` before the
    final item where given: ``1, 2 and 3``)."""
    items = [format(item, spec) for item in value(name, key)]
    if last is None or len(items) < 2:
        return sep.join(items)
    return sep.join(items[:-1]) + last + items[-1]


def minutes(seconds: float) -> str:
    """``9 min 26 s`` from a number of seconds (under a minute: ``42 s``; whole hours: ``4 h 35 min``)."""
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    if whole >= 60:
        return f"{whole // 60} min" + (f" {whole % 60} s" if whole % 60 else "")
    return f"{whole} s"


def source(name: str) -> str:
    """Where record `name`'s figures come from: its command, revision and date, as a Markdown phrase."""
    data = record(name)
    return f"`{data['command']}` at revision {data['revision']}, {data['date']}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table of `rows` under `header` (cells already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def speedup_rows() -> list[list[str]]:
    """RALP-N's speedups at N = 8, one row per model / classes: measured over `ps` and `allreduce` (the
    paper-dilated matrix) beside the predicted over `dtf` (``make_headline.py --record``), each at 1 / 10 / 25 Gbit/s."""
    predicted = {row["row"]: row["ralp_n_over_dtf"] for row in value("headline-predicted", "speedups")}
    return [
        [
            row["row"],
            *(" / ".join(map(num, row[k])) + "x" for k in ("over_ps", "over_allreduce")),
            " / ".join(f"{x:.1f}" if x < 10 else f"{x:.0f}" for x in predicted[row["row"]]) + "x",
        ]
        for row in value("paper-dilated", "speedups_n8")
    ]


def readme_for_site() -> str:
    """README.md as the site's home page: its links into ``docs/`` made relative to the site, its cog blocks'
    markers dropped (their generated text stays)."""
    text = README.read_text()
    text = re.sub(r"^<!-- \[\[\[(cog|end)\b.*?-->\n", "", text, flags=re.M | re.S)
    text = re.sub(r"\]\(docs/", "](", text)
    return text.replace("[`docs/`](index.md)", "these pages").rstrip("\n")
