"""The project's import graph, and each stage's code dependencies for dvc.yaml drawn from it.

A stage's code deps are the component modules its entry in pipeline/stages.py imports, and
everything those import, transitively (imports inside functions included): an edit reruns
exactly the stages that run the edited code. Package `__init__.py` files hold only a docstring
(tests/test_layers.py) and are left out.

    python -m pipeline.deps           print each stage's code deps
    python -m pipeline.deps --write   rewrite them in dvc.yaml (the other deps stay as they are)

tests/test_layers.py fails when dvc.yaml and the imports disagree.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "pipeline")
DVC_YAML = ROOT / "dvc.yaml"
_CODE_DEP = re.compile(r"^\s+- components/\S+\.py\s*$")


def module_file(name: str) -> Path | None:
    """The file of project module `name` (`components.core.io`), or None if it is not one."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def module_name(path: Path) -> str:
    """`components/core/io.py` -> `components.core.io` (a package's __init__.py: the package)."""
    parts = Path(path).resolve().relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> list[str]:
    """Every module of the project's packages, sorted."""
    return sorted(module_name(p) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


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


def closure(names: list[str]) -> set[str]:
    """`names` and every project module they import, transitively."""
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(imports_of(name))
    return seen


def stage_entries(stage_name: str) -> list[str]:
    """The component modules a stage's entry function in pipeline/stages.py imports."""
    from pipeline.stages import STAGES

    tree = ast.parse(inspect.getsource(STAGES[stage_name].call))
    return sorted({n for n in imported_names(tree) if n.startswith("components.") and module_file(n)})


def code_deps(stage_name: str) -> list[str]:
    """The component files a stage runs, as dvc.yaml lists them (package __init__s left out)."""
    files = (module_file(n) for n in closure(stage_entries(stage_name)))
    return sorted(f.relative_to(ROOT).as_posix() for f in files if f.name != "__init__.py")


def with_code_deps(text: str, deps: dict[str, list[str]]) -> str:
    """dvc.yaml's text with each stage's code deps (its `- components/...py` items) replaced by
    `deps[stage]`, written at the end of the stage's `deps:` list; all else stays as it is."""
    out: list[str] = []
    stage, item = None, None  # the stage being read; the indent of its deps' items, while in them

    def close() -> None:
        nonlocal item
        if item is not None:
            out.extend(f"{item}- {d}" for d in deps[stage])
            item = None

    for line in text.splitlines():
        if item is not None and not line.startswith(f"{item}- "):
            close()
        if m := re.match(r"^  ([\w-]+):\s*$", line):
            stage = m.group(1)
        elif m := re.match(r"^(\s+)deps:\s*$", line):
            out.append(line)
            item = m.group(1) + "  "
            continue
        if item is not None and _CODE_DEP.match(line):
            continue
        out.append(line)
    close()
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    from pipeline.stages import STAGES

    deps = {name: code_deps(name) for name in STAGES}
    if argv == ["--write"]:
        DVC_YAML.write_text(with_code_deps(DVC_YAML.read_text(), deps))
        sys.stdout.write(f"{DVC_YAML}: code deps rewritten\n")
        return 0
    for name, files in deps.items():
        sys.stdout.write(f"{name}:\n" + "".join(f"  - {f}\n" for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
