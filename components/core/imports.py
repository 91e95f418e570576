"""The project's import graph, read from the source: which code a module runs.

dvc.yaml's code deps (pipeline/deps.py) are drawn from it, so an edit reruns exactly the stages
that run the edited code.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("components", "pipeline")


def module_file(name: str) -> Path | None:
    """The file of project module `name` (`components.core.io`), or None if it is not one."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_names(tree: ast.AST) -> list[str]:
    """Absolute names a syntax tree imports anywhere (functions included); for `from a import b`,
    `a.b` when that is a project module, else `a`."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found = [s for s in subs if module_file(s) is not None]
            names += found if found else [node.module]
    return names


@cache
def imports_of(name: str) -> frozenset[str]:
    """The project modules module `name` imports directly."""
    tree = ast.parse(module_file(name).read_text(encoding="utf-8"))
    return frozenset(n for n in imported_names(tree) if n.split(".")[0] in PACKAGES and module_file(n))


def closure(names: list[str], leave_out: tuple[str, ...] = ()) -> set[str]:
    """`names` and every project module they import, transitively; the modules of `leave_out`
    and what only they import left out."""
    seen: set[str] = set()
    stack = [n for n in names if n not in leave_out]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(i for i in imports_of(name) if i not in leave_out)
    return seen


def code_files(names: list[str], leave_out: tuple[str, ...] = ()) -> list[Path]:
    """The files `names` run (their closure but `leave_out`), sorted; package `__init__.py`
    files, which hold only a docstring, left out."""
    files = (module_file(n) for n in closure(names, leave_out))
    return sorted(f for f in files if f.name != "__init__.py")
