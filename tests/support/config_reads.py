"""Which configuration keys a stage reads, found in its source: every ``cfg.group.key`` chain reached from its entry.

Starting from a stage's entry functions, a name bound to the :class:`~ralp_pipe.config.Config` (assigned from
``load``/``from_dict``) or to part of it is followed through attribute chains, local aliases and calls into
the package's own functions (the callee's parameter is then bound; every callee is also read for a config
it loads itself, and one annotated to return a ``Config`` returns the whole config). Any other use of a bound value is a read of
its path: an attribute chain ending in a value, a config group handed to code outside the package, a
``getattr`` on a group. Serialising the whole config (``to_dict``, ``digest``) or copying it with some keys set
(``dataclasses.replace``) is not a read: what the ranks
read of the config they receive is followed from their own entry.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Sequence

PACKAGE = "ralp_pipe"
CONFIG_SOURCES = ("load", "from_dict")  # calls that return the whole Config
SERIALISERS = ("to_dict", "digest", "asdict")  # take the whole config as data, read nothing of it themselves
COPIES = ("replace",)  # dataclasses.replace: the same config with some keys set, read nothing of it
OPAQUE = "*"  # the whole config handed to code this reader cannot follow


@lru_cache(maxsize=None)
def _module(name: str) -> tuple[dict[str, ast.FunctionDef], dict[str, tuple[str, str | None]]]:
    """Functions of module `name` and what its names import: local -> (module, attribute or None)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, name
    tree = ast.parse(Path(spec.origin).read_text())
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    imports: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                is_module = importlib.util.find_spec(target) is not None if _is_package(node.module) else False
                imports[alias.asname or alias.name] = (target, None) if is_module else (node.module, alias.name)
    return functions, imports


def _function(module: str, name: str) -> tuple[str, ast.FunctionDef] | None:
    """The definition of `name` as seen from `module`: its own, or where it was imported (or re-exported) from."""
    functions, imports = _module(module)
    if name in functions:
        return module, functions[name]
    origin = imports.get(name)
    return _function(*origin) if origin and origin[1] else None


def _is_package(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.submodule_search_locations is not None


class _Reader:
    def __init__(self) -> None:
        self.reads: set[str] = set()
        self._seen: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()

    def function(self, module: str, name: str, bound: dict[str, str]) -> None:
        key = (module, name, tuple(sorted(bound.items())))
        functions, _ = _module(module)
        if key in self._seen or name not in functions:
            return
        self._seen.add(key)
        env = dict(bound)
        for statement in functions[name].body:
            self._visit(statement, module, env)

    def _resolve(self, func: ast.expr, module: str) -> tuple[str, ast.FunctionDef] | None:
        _, imports = _module(module)
        if isinstance(func, ast.Name):
            return _function(module, func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            origin = imports.get(func.value.id)
            if origin and origin[1] is None:
                return _function(origin[0], func.attr)
        return None

    def _path(self, node: ast.expr, env: dict[str, str], module: str = "") -> str | None:
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._path(node.value, env, module)
            return None if base is None else f"{base}.{node.attr}".lstrip(".")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CONFIG_SOURCES:
            return ""
        if isinstance(node, ast.Call) and _name(node.func) in COPIES and node.args:
            return self._path(node.args[0], env, module)
        if isinstance(node, ast.Call) and module and (callee := self._resolve(node.func, module)):
            returns = callee[1].returns
            return "" if isinstance(returns, ast.Name) and returns.id == "Config" else None
        return None

    def _bind(self, target: ast.expr, value: ast.expr, module: str, env: dict[str, str]) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts):
                self._bind(t, v, module, env)
            return
        path = self._path(value, env, module)
        if isinstance(target, ast.Name) and path is not None:
            env[target.id] = path
            if isinstance(value, ast.Call):
                self._visit_children(value, module, env)
            return
        if isinstance(target, ast.Name):
            env.pop(target.id, None)
        self._visit(value, module, env)

    def _visit(self, node: ast.AST, module: str, env: dict[str, str]) -> None:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            self._bind(node.targets[0], node.value, module, env)
            return
        if isinstance(node, ast.Call):
            self._call(node, module, env)
            return
        path = self._path(node, env, module) if isinstance(node, ast.expr) else None
        if path is not None and not isinstance(node, ast.Call):
            if path:
                self.reads.add(path)
            return
        self._visit_children(node, module, env)

    def _visit_children(self, node: ast.AST, module: str, env: dict[str, str]) -> None:
        for child in ast.iter_child_nodes(node):
            self._visit(child, module, env)

    def _call(self, node: ast.Call, module: str, env: dict[str, str]) -> None:
        callee = self._resolve(node.func, module)
        serialiser = _name(node.func) in (*SERIALISERS, *COPIES)
        params = [a.arg for a in (*callee[1].args.posonlyargs, *callee[1].args.args)] if callee else []
        func_path = self._path(node.func, env, module)
        if func_path is not None:  # a method of a config value
            self.reads.add(func_path.rsplit(".", 1)[0])
        else:
            self._visit(node.func, module, env)
        arguments = [(params[i] if i < len(params) else None, a) for i, a in enumerate(node.args)]
        arguments += [(k.arg, k.value) for k in node.keywords]
        if callee:  # what it reads of a config it loads itself
            self.function(callee[0], callee[1].name, {})
        for param, value in arguments:
            path = self._path(value, env, module)
            if path is None or isinstance(value, ast.Call):
                self._visit(value, module, env)
                if path is None:
                    continue
            if callee and param:
                self.function(callee[0], callee[1].name, {param: path})
            elif not serialiser:
                self.reads.add(path or OPAQUE)


def _name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def config_reads(entries: Sequence[tuple[str, str, str | None]]) -> set[str]:
    """Config key paths (``train.lr``, ``cluster`` for a whole group) read from the functions `entries`
    (``(module, function, the parameter holding the config or None)``) and everything they pass the
    config, or part of it, to."""
    reader = _Reader()
    for module, name, param in entries:
        reader.function(module, name, {param: ""} if param else {})
    return reader.reads
