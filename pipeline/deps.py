"""dvc.yaml, generated from the stage table (pipeline/stages.py), the code and params.yaml.

- Outputs and the folders a stage reads: the stage table's, each path declared there once.
- Code deps: the component modules a stage's entry in pipeline/stages.py imports, and everything
  those import, transitively (imports inside functions included): an edit reruns exactly the
  stages that run the edited code. Package `__init__.py` files hold only a docstring and are
  left out, and so is params.yaml's schema (`SCHEMA`).
- Source deps: the files of yours a stage reads (ingest's sources, a checkpoint folder, each
  task's file): adding one task's file reruns that task's stages, and only those.
- Params lists: the keys each stage reads, from the stage table (pipeline/stages.py).

    python -m pipeline.deps           print dvc.yaml as it should be
    python -m pipeline.deps --write   write it (every pipeline run does it first)

tests/test_layers.py fails when dvc.yaml is not what this writes.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

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


# params.yaml's schema and loader decide no value a stage uses: every value is in params.yaml,
# which DVC tracks key by key (entry defaults included, merged at load). An edit there (a
# docstring, a check) reruns nothing.
SCHEMA = ("components.core.config", "components.core.params")


def code_deps(stage_name: str) -> list[str]:
    """The component files a stage runs, as dvc.yaml lists them (package __init__s and the
    schema left out)."""
    return [f.relative_to(ROOT).as_posix() for f in code_files(stage_entries(stage_name), SCHEMA)]


def source_deps(p: Params) -> dict[str, list[str]]:
    """The files and folders of yours a stage reads, as dvc.yaml lists them: ingest's sources,
    checkpoint's pretrain.init_from, and with the distilled start the teacher folder, which the
    teacher stage fine-tunes and the distill stage cuts its student from (a packaged corpus or
    checkpoint is pinned in the code)."""
    from components.core.packages import CHECKPOINTS

    init_from, teacher = p.pretrain.init_from, p.distill.teacher
    teacher_folder = [teacher] if "distilled" in p.finetune.init and teacher not in CHECKPOINTS else []
    return {"ingest": [s.path for s in p.ingest.sources if s.kind != "package"],
            "checkpoint": [init_from] if init_from and init_from not in CHECKPOINTS else [],
            "teacher": teacher_folder, "distill": teacher_folder}


def task_sources(p: Params) -> dict[str, str]:
    """What each task's task_data stage reads: your file or folder, or for a built-in dataset
    the code that reads its pinned package."""
    from components.data.tasks.builtin import BUILTINS

    return {name: BUILTIN_SOURCE if t.source in BUILTINS else t.source
            for name, t in p.finetune.tasks.items()}


HEADER = """\
# Generated from the stage table (pipeline/stages.py) and params.yaml: do not edit by hand.
# `python -m pipeline.deps --write` writes it (and every pipeline run, first); tests/test_layers.py
# fails when it differs. One stage per step; DVC runs the same `bertflow stage NAME` that the
# Prefect flow runs. Each stage's deps: the folders it reads, the files of yours it reads
# (ingest's sources, a checkpoint or teacher folder, each task's file in `task_sources`), and the
# component modules it imports, transitively: an edit reruns the stages that read the edited
# file or key, and only those. Folder outputs are `persist: true`: DVC would otherwise delete a
# stage's folder before running it, whatever it holds; the stage replaces it itself, and only
# when bertflow made it. Stats, plots and reports are small files git keeps (`cache: false`);
# only two are DVC `metrics:`, so `dvc metrics show` stays a screen wide.
"""


def render(p: Params) -> str:
    """dvc.yaml for params `p`: every stage the params use, with its deps, params and outputs;
    a per-task stage as a `foreach` over the tasks (task_data's over their sources), the
    finetune stage over each task's starts (`fits`)."""
    from pipeline.stages import STAGES, fit_items

    sources = source_deps(p)
    lines = [*HEADER.splitlines(), "vars:", "  - task_sources:",
             *(f"      {n}: {s}" for n, s in task_sources(p).items()), "  - fits:",
             *(f"      {n}: {_flow(item)}" for n, item in fit_items(p).items()), "stages:"]
    for name, stage in STAGES.items():
        if not stage.used(p):
            continue
        refs = ({"{task}": "${item.task}", "{start}": "${item.start}", "{weights}": "${item.weights}"}
                if stage.per_start else {"{task}": "${key}"} if stage.per_task else {})
        source = ["${item}"] if name == "task_data" else sources.get(name, [])
        body = entry(stage, p, lambda t, refs=refs: _fill(t, refs), source,
                     [f"  - {_fill(k, refs)}" for k in stage.params],
                     f"bertflow stage {name}" + ("@${key}" if stage.per_task else ""))
        if stage.per_task:
            over = ("${task_sources}" if name == "task_data" else "${fits}" if stage.per_start
                    else "${finetune.tasks}")
            body = [f"foreach: {over}", "do:", *(f"  {line}" for line in body)]
        lines += ["", f"  {name}:", *(f"    {line}" for line in body)]
    return "\n".join(lines) + "\n"


def _fill(template: str, refs: dict[str, str]) -> str:
    """A template of the table with its `{task}`, `{start}`, `{weights}` replaced."""
    for ref, value in refs.items():
        template = template.replace(ref, value)
    return template


def entry(stage, p: Params, fill, source: list[str], params: list[str], cmd: str) -> list[str]:
    """A stage's dvc.yaml entry (cmd, deps, params, outputs), its path templates passed through
    `fill` (to dvc.yaml's templates, or to paths)."""
    from pipeline.stages import STAGES, start_stage

    reads = []
    for read in stage.reads:
        if read == "{starts}":  # evaluate: the folder of each start of the task
            reads += [fill(STAGES[start_stage(s)].writes.replace("{start}", s)) for s in p.finetune.init]
        else:
            reads.append(fill(STAGES[read].writes if read in STAGES else read))
    outs = [*([(fill(stage.writes), {"persist": True})] if stage.writes else []),
            *((fill(f), {"cache": False}) for f in stage.files),
            *([] if stage.metric else [(fill(stage.stats), {"cache": False})])]
    return [f"cmd: {cmd}",
            "deps:", *(f"  - {d}" for d in [*dict.fromkeys(reads), *source, *code_deps(stage.name)]),
            "params:", *params,
            *_outputs("outs", outs),
            *_outputs("metrics", [(fill(stage.stats), {"cache": False})] if stage.metric else []),
            *_outputs("plots", [(fill(f), {"cache": False, **options}) for f, options in stage.plots])]


def _outputs(kind: str, entries: list[tuple[str, dict]]) -> list[str]:
    """A dvc.yaml output list (`outs`, `metrics`, `plots`): each path with its options."""
    if not entries:
        return []
    lines = [f"{kind}:"]
    for path, options in entries:
        lines.append(f"  - {path}:")
        lines += [f"      {k}: {_flow(v)}" for k, v in options.items()]
    return lines


def _flow(value: object) -> str:
    """A value on one line, as YAML's flow style writes it."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000)
    return text.removesuffix("\n...\n").strip()  # a scalar ends its document with `...`


def write(params_path: Path = ROOT / "params.yaml", dvc_yaml: Path = DVC_YAML) -> bool:
    """Write dvc.yaml anew from the stage table, the imports and params_path; True if it changed."""
    from components.core.io import atomic_file
    from components.core.params import load_params

    text = dvc_yaml.read_text() if dvc_yaml.is_file() else ""
    new = render(load_params(params_path))
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

    sys.stdout.write(render(load_params(ROOT / "params.yaml")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
