"""The package's layers: a module imports only from its own layer or lower ones, and no modules import each other.

Every import statement counts, at the top of a module or inside a function alike: an import moved into a
function to dodge a cycle or a layer is still the dependency it was. (Imports of heavy optional packages
inside functions, for start-up speed, are outside the package and not checked.)
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Mapping

import pytest

PACKAGE = "ralp_pipe"
SOURCE = Path(__file__).resolve().parents[1] / "src"
# Lowest first; the parts of a layer (top-level modules or packages) may import each other.
LAYERS = (
    ("errors", "atomic", "locks"),  # failure types and file utilities: import nothing of the package above them
    ("config",),  # the schema, composition and what each strategy and cluster kind is
    ("contract",),  # what the stages hand each other: records, the results layout, the topology, the command table
    ("runtime",),  # where processes run: starting, supervising and placing ranks, the emulated network, hardware
    ("data",),
    ("engine",),
    ("planning",),
    ("results",),
    ("workflow",),
    ("cli",),
)
# Imports that break the layering or close a cycle, each to be removed by the work named beside it.
KNOWN: set[tuple[str, str]] = set()  # upward imports allowed for now, each with its reason: none

Graph = dict[str, dict[str, int]]  # importer -> imported module -> line of the first such import


def modules(source: Path = SOURCE) -> dict[str, Path]:
    """Every module of the package below `source`, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((source / PACKAGE).rglob("*.py")):
        parts = path.relative_to(source).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(
    node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, known: Mapping[str, Path]
) -> Iterator[str]:
    """The package's modules an import statement of module `importer` names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parent = importer.split(".")[: len(importer.split(".")) - node.level + is_package]
            base = ".".join([*parent, *([node.module] if node.module else [])])
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    for name in names:
        while name and name not in known:  # `import a.b.c`'s module, or the package a name comes from
            name = name.rpartition(".")[0]
        if name.split(".")[0] == PACKAGE and name != importer:
            yield name


def import_graph(source: Path = SOURCE) -> Graph:
    """Which of the package's modules each module imports, anywhere in its source."""
    known = modules(source)
    graph: Graph = {}
    for name, path in known.items():
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(node, name, path.name == "__init__.py", known):
                    edges.setdefault(target, node.lineno)
    return graph


def layer(module: str) -> int:
    """The index in LAYERS of `module`'s top-level part (the package itself is the lowest)."""
    part = module.split(".")[1] if "." in module else None
    if part is None:
        return 0
    return next(i for i, names in enumerate(LAYERS) if part in names)


def upward(graph: Graph) -> list[str]:
    """Imports of a module from a higher layer than its own, as ``importer:line -> imported``."""
    return [
        f"{importer}:{line} -> {target}"
        for importer, edges in sorted(graph.items())
        for target, line in sorted(edges.items())
        if layer(target) > layer(importer) and (importer, target) not in KNOWN
    ]


def cycles(graph: Graph) -> list[list[str]]:
    """The sets of modules that import each other, directly or through others (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if (node, target) in KNOWN:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> Graph:
    """The package's import graph, parsed once for the tests that read it."""
    return import_graph()


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {name.split(".")[1] for name in modules() if "." in name}
    assert parts == {part for names in LAYERS for part in names}


def test_a_module_imports_only_its_own_layer_or_lower_ones(graph: Graph) -> None:
    found = upward(graph)
    assert not found, "imports from a higher layer (see LAYERS):\n" + "\n".join(found)


def test_no_modules_import_each_other(graph: Graph) -> None:
    found = cycles(graph)
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_known_exception_is_still_an_import_of_the_package(graph: Graph) -> None:
    assert [edge for edge in sorted(KNOWN) if edge[1] not in graph.get(edge[0], {})] == []


def test_the_checks_find_an_upward_import_inside_a_function_and_a_cycle(tmp_path: Path) -> None:
    sources = {
        "__init__.py": "",
        "errors.py": "",
        "config/__init__.py": "",
        "config/a.py": "from ralp_pipe.config import b\n",
        "config/b.py": "def f():\n    from . import a\n\n\ndef g():\n    import ralp_pipe.engine.c\n",
        "engine/__init__.py": "",
        "engine/c.py": "from ralp_pipe.errors import *\n",
    }
    for name, text in sources.items():
        (tmp_path / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / name).write_text(text)
    graph = import_graph(tmp_path)
    assert upward(graph) == ["ralp_pipe.config.b:6 -> ralp_pipe.engine.c"]
    assert cycles(graph) == [["ralp_pipe.config.a", "ralp_pipe.config.b"]]
