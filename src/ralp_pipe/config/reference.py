"""The configuration reference, generated from the code: every key of the typed schema and every Hydra group option.

The documentation's cog blocks (``docs/records.py``, ``make docs``) write :func:`schema_markdown`, :func:`groups_markdown` and
:func:`exit_codes_markdown` into its pages, and ``make lint`` checks them, so the reference cannot drift from
:mod:`ralp_pipe.config.schema`, ``config/`` and :mod:`ralp_pipe.errors`. A key's text is the comment on its
line or the comment lines directly above it in ``schema.py``; its allowed values are those the value checks of
:mod:`ralp_pipe.config.compose` pass to their ``_choice`` calls with a fixed tuple.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import re
import signal
import tokenize
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from ralp_pipe import errors
from ralp_pipe.config import compose, schema


@dataclass(frozen=True)
class KeyDoc:
    """One leaf key of the schema: its dotted name, annotation, default and the comment that explains it."""

    key: str
    type: str
    default: str
    comment: str
    allowed: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupOption:
    """One option of a Hydra group: its file's stem, whether the root config chooses it, its leading comment."""

    group: str
    name: str
    default: bool
    comment: str


def _field_comments(source: str) -> dict[tuple[str, str], str]:
    """(class, field) -> the comment on the field's own lines, after the comment lines directly above it."""
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    found: dict[tuple[str, str], str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above: list[str] = []
            line = item.lineno - 1
            while line in comments and line not in code_lines:
                above.insert(0, comments[line])
                line -= 1
            own = [comments[n] for n in range(item.lineno, (item.end_lineno or item.lineno) + 1) if n in comments]
            found[(node.name, item.target.id)] = "; ".join(part for part in (" ".join(above), " ".join(own)) if part)
    return found


def _yaml_comments(path: Path, prefix: str = "") -> dict[str, str]:
    """dotted key -> the comment on its line, for every ``key: value  # comment`` line of a YAML file."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in path.read_text().splitlines():
        match = re.match(r"^( *)([A-Za-z_][\w]*):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match[1]), match[2], match[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if "#" in rest:
            found[prefix + ".".join(k for _, k in stack)] = rest.split("#", 1)[1].strip()
    return found


def _config_comments(config_dir: Path = schema.CONFIG_DIR) -> dict[str, str]:
    """Comments of the root config and of each group's default option, by dotted key (the root's win)."""
    root = config_dir / "config.yaml"
    found: dict[str, str] = {}
    for group, option in _root_defaults(config_dir).items():
        path = config_dir / group / f"{option}.yaml"
        if path.is_file():
            is_global = path.read_text().startswith("# @package _global_")
            found.update(_yaml_comments(path, "" if is_global else f"{group.replace('/', '.')}."))
    found.update(_yaml_comments(root))
    return found


def _choices() -> dict[str, tuple[str, ...]]:
    """key -> allowed values, from compose's ``_choice("key", value, CONSTANT)`` calls naming a schema tuple."""
    allowed: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(ast.parse(inspect.getsource(compose))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_choice"):
            continue
        key, _, values = node.args
        if isinstance(key, ast.Constant) and isinstance(values, ast.Name):
            constant = getattr(schema, values.id, None)
            if isinstance(constant, tuple):
                allowed[str(key.value).removesuffix("[]")] = tuple(str(v) for v in constant)
    allowed.setdefault("strategy.name", schema.STRATEGIES)  # checked against the strategy table itself
    return allowed


def _default(item: Field[Any]) -> str:
    """A field's default as YAML writes it (``null``, ``true``, ``[a, b]``)."""
    if item.default is not MISSING:
        value = item.default
    elif item.default_factory is not MISSING:
        value = item.default_factory()
    else:
        return "(required)"
    return json.dumps(value).replace('"', "") if not isinstance(value, str) else value


def schema_keys(root: type = schema.Config, prefix: str = "") -> Iterator[KeyDoc]:
    """Every leaf key below `root`, depth first in declaration order (a nested dataclass contributes its keys)."""
    comments = _field_comments(inspect.getsource(schema))
    from_config = _config_comments()
    allowed = _choices()
    annotations = {
        (node.name, item.target.id): ast.unparse(item.annotation)
        for node in ast.parse(inspect.getsource(schema)).body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }
    for item in fields(root):
        key = f"{prefix}{item.name}"
        nested = item.default_factory() if item.default_factory is not MISSING else None
        if is_dataclass(nested):
            yield from schema_keys(type(nested), f"{key}.")
            continue
        yield KeyDoc(
            key,
            schema.UNION_TYPES.get(key) or annotations.get((root.__name__, item.name), str(item.type)),
            _default(item),
            comments.get((root.__name__, item.name)) or from_config.get(key, ""),
            allowed.get(key, ()),
        )


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def schema_markdown() -> str:
    """One table per top-level section of the schema: key, type, default, allowed values and meaning."""
    parts = []
    for section in fields(schema.Config):
        kind = type(section.default_factory()) if section.default_factory is not MISSING else None
        if kind is None:
            continue
        doc = inspect.getdoc(kind) or ""
        rows = [
            f"| `{k.key}` | `{_cell(k.type)}` | `{_cell(k.default)}` | "
            f"{', '.join(f'`{v}`' for v in k.allowed)} | {_cell(k.comment)} |"
            for k in schema_keys(kind, f"{section.name}.")
        ]
        parts.append(
            f"### `{section.name}`\n\n{doc}\n\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n"
            + "\n".join(rows)
        )
    return "\n\n".join(parts) + "\n"


def _leading_comment(path: Path) -> str:
    """The comment lines a YAML file starts with, less Hydra's ``@package`` directive, as one paragraph."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text.startswith("@package"):
            lines.append(("\n" if text.startswith("- ") else "") + text)
    return " ".join(lines).replace(" \n- ", "\n- ")


def _root_defaults(config_dir: Path = schema.CONFIG_DIR) -> dict[str, str]:
    """group -> the option the root config's defaults list chooses."""
    root = yaml.safe_load((config_dir / "config.yaml").read_text()) or {}
    return {k: str(v) for entry in root.get("defaults", []) if isinstance(entry, dict) for k, v in entry.items()}


def group_options(config_dir: Path = schema.CONFIG_DIR) -> list[GroupOption]:
    """Every option of every group folder below `config_dir` (nested folders by their path), defaults marked."""
    chosen = _root_defaults(config_dir)
    return [
        GroupOption(group, path.stem, chosen.get(group) == path.stem, _leading_comment(path))
        for path in sorted(config_dir.rglob("*.yaml"))
        if path.parent != config_dir
        for group in [path.parent.relative_to(config_dir).as_posix()]
    ]


def _flat(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a YAML mapping; lists are leaves."""
    for key, item in tree.items():
        if isinstance(item, dict) and item:
            yield from _flat(item, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", item


def _experiment_section(option: GroupOption, config_dir: Path) -> str:
    """One experiment as a section of its own: its file's comment, the groups it chooses, every key it sets."""
    tree = yaml.safe_load((config_dir / option.group / f"{option.name}.yaml").read_text()) or {}
    chosen = [
        f"`{key.removeprefix('override ').lstrip('/')}={value}`"
        for entry in tree.pop("defaults", [])
        if isinstance(entry, dict)
        for key, value in entry.items()
    ]
    rows = [f"| `{key}` | `{_cell(json.dumps(value).replace(chr(34), ''))}` |" for key, value in _flat(tree)]
    groups = f"It chooses {', '.join(chosen)}.\n\n" if chosen else ""
    return (
        f"#### `experiment={option.name}`\n\n{option.comment.replace(chr(10) + '- ', chr(10) * 2 + '- ', 1)}\n\n{groups}"
        "| key | value |\n|---|---|\n" + "\n".join(rows)
    )


def groups_markdown(config_dir: Path = schema.CONFIG_DIR) -> str:
    """One table per group folder of `config_dir`: each option, whether it is the default, its file's comment;
    the experiments, whose comments are long and which set keys of every group, as a section each."""
    options = group_options(config_dir)
    parts = []
    for group in sorted({o.group for o in options}):
        mine = [o for o in options if o.group == group]
        head = f"### `{group}`\n\nChoose with `{group.replace('/', '.')}=NAME` (files in `config/{group}/`)."
        if "/" in group:  # a nested group is included by its parent's files, not chosen on the command line
            parent = group.split("/")[0]
            head = (
                f"### `{group}`\n\nIncluded by the files of `config/{parent}/` (their defaults list), not chosen on "
                f"the command line: override the keys it sets (`{parent}.KEY=VALUE`)."
            )
        if group == "experiment":
            parts.append(head + "\n\n" + "\n\n".join(_experiment_section(o, config_dir) for o in mine))
            continue
        rows = [f"| `{o.name}` | {'default' if o.default else ''} | {_cell(o.comment)} |" for o in mine]
        parts.append(head + "\n\n| option | | what it is |\n|---|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def _failure_types() -> list[type[errors.RalpError]]:
    """The foreseeable failure types of :mod:`ralp_pipe.errors`, in the order they are declared."""
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.RalpError) and value is not errors.RalpError
    ]


def exit_codes_markdown() -> str:
    """A table of every failure type: its exit status, the word stderr names it by and what it means."""
    rows = []
    for kind in _failure_types():
        status = str(kind.exit_code)
        if issubclass(kind, errors.Interrupted):  # set from the signal that stopped the command
            status = ", ".join(f"{kind(s).exit_code} ({s.name})" for s in (signal.SIGINT, signal.SIGTERM))
        rows.append(f"| {status} | `{kind.__name__}` | {kind.kind} | {_cell(inspect.getdoc(kind) or '')} |")
    return "| exit status | type | stderr says | what failed |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"
