"""dvc.yaml's generated parts: what each stage depends on, drawn from the code and params.yaml.

- Code deps: the component modules a stage's entry in pipeline/stages.py imports, and everything
  those import, transitively (imports inside functions included): an edit reruns exactly the
  stages that run the edited code. Package `__init__.py` files hold only a docstring and are
  left out.
- Source deps: the files of yours a stage reads (ingest's sources, a checkpoint folder, each
  task's file): adding one task's file reruns that task's stages, and only those.
- Params lists: the keys each stage reads, from the stage table (pipeline/stages.py).

    python -m pipeline.deps           print them
    python -m pipeline.deps --write   rewrite them in dvc.yaml (every pipeline run does it first)

tests/test_layers.py fails when dvc.yaml is not what this writes.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from components.core.imports import PACKAGES, ROOT, code_files, imported_names, module_file

if TYPE_CHECKING:
    from components.core.config import Params

DVC_YAML = ROOT / "dvc.yaml"
BUILTIN_SOURCE = "components/data/tasks/builtin.py"  # a built-in task's "source": what reads it


def module_name(path: Path) -> str:
    """`components/core/io.py` -> `components.core.io` (a package's __init__.py: the package)."""
    parts = Path(path).resolve().relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> list[str]:
    """Every module of the project's packages, sorted."""
    return sorted(module_name(p) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def stage_entries(stage_name: str) -> list[str]:
    """The component modules a stage's entry function in pipeline/stages.py imports."""
    from pipeline.stages import STAGES

    tree = ast.parse(inspect.getsource(STAGES[stage_name].call))
    return sorted({n for n in imported_names(tree) if n.startswith("components.") and module_file(n)})


def code_deps(stage_name: str) -> list[str]:
    """The component files a stage runs, as dvc.yaml lists them (package __init__s left out)."""
    return [f.relative_to(ROOT).as_posix() for f in code_files(stage_entries(stage_name))]


def source_deps(p: Params) -> dict[str, list[str]]:
    """The files and folders of yours a stage reads, as dvc.yaml lists them: ingest's sources,
    checkpoint's pretrain.init_from, and with the distilled start the teacher folder, which the
    teacher stage fine-tunes and the finetune stage cuts its student from (a packaged corpus or
    checkpoint is pinned in the code)."""
    from components.core.packages import CHECKPOINTS

    init_from, teacher = p.pretrain.init_from, p.distill.teacher
    teacher_folder = [teacher] if "distilled" in p.finetune.init and teacher not in CHECKPOINTS else []
    return {"ingest": [s.path for s in p.ingest.sources if s.kind != "package"],
            "checkpoint": [init_from] if init_from and init_from not in CHECKPOINTS else [],
            "teacher": teacher_folder, "finetune": teacher_folder}


def task_sources(p: Params) -> dict[str, str]:
    """What each task's task_data stage reads: your file or folder, or for a built-in dataset
    the code that reads its pinned package."""
    from components.data.tasks.builtin import BUILTINS

    return {name: BUILTIN_SOURCE if t.source in BUILTINS else t.source
            for name, t in p.finetune.tasks.items()}


def generated(p: Params) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, str]]:
    """dvc.yaml's generated parts: each stage's literal deps (sources, then code), its params
    list, and the task sources its task_data foreach runs over."""
    from pipeline.stages import STAGES

    sources = source_deps(p)
    deps = {name: sources.get(name, []) + code_deps(name) for name in STAGES}
    params = {name: [k.replace("{task}", "${key}") for k in stage.params] for name, stage in STAGES.items()}
    return deps, params, task_sources(p)


def rewrite(text: str, deps: dict[str, list[str]], params: dict[str, list[str]],
            sources: dict[str, str]) -> str:
    """dvc.yaml's text with its generated parts replaced: the `vars:` block (the task sources),
    each stage's literal deps (its `${...}` ones, outputs of other stages, stay first) and its
    `params:` list; comments, outs and all else stay as they are."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line in ("vars:", "stages:"))
    out = [*lines[:start], "vars:", "  - task_sources:", *(f"      {n}: {s}" for n, s in sources.items())]
    stage, item, field = None, None, None

    def close() -> None:
        nonlocal item
        if item is not None:
            out.extend(f"{item}- {d}" for d in (deps if field == "deps" else params)[stage])
            item = None

    for line in lines[lines.index("stages:"):]:
        if item is not None and not line.startswith(f"{item}- "):
            close()
        if m := re.match(r"^  ([\w-]+):\s*$", line):
            stage = m.group(1)
        elif m := re.match(r"^(\s+)(deps|params):\s*$", line):
            out.append(line)
            item, field = m.group(1) + "  ", m.group(2)
            continue
        if item is not None and (field == "params" or "${" not in line):
            continue
        out.append(line)
    close()
    return "\n".join(out) + "\n"


def write(params_path: Path = ROOT / "params.yaml", dvc_yaml: Path = DVC_YAML) -> bool:
    """Rewrite dvc.yaml's generated parts from the stage table, the imports and params_path;
    True if it changed."""
    from components.core.io import atomic_file
    from components.core.params import load_params

    text = dvc_yaml.read_text()
    new = rewrite(text, *generated(load_params(params_path)))
    if new != text:
        with atomic_file(dvc_yaml) as tmp:
            tmp.write_text(new)
    return new != text


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        changed = write()
        sys.stdout.write(f"{DVC_YAML}: {'rewritten' if changed else 'already current'}\n")
        return 0
    from components.core.params import load_params

    deps, params, sources = generated(load_params(ROOT / "params.yaml"))
    for name in deps:
        sys.stdout.write(f"{name}:\n  deps:\n" + "".join(f"    - {f}\n" for f in deps[name])
                         + "  params:\n" + "".join(f"    - {k}\n" for k in params[name]))
    sys.stdout.write("task sources:\n" + "".join(f"  {n}: {s}\n" for n, s in sources.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
