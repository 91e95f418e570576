"""A preset: a params file beside the project's params.yaml (`params-distill.yaml`, which
`extends: params.yaml`) with a DVC pipeline of its own, `presets/distill/dvc.yaml`, generated.

A stage of the preset *is* the default run's when it reads the same values of every params key
it lists, writes the same folders, and reads only what such shared stages write: it would make
the same outputs in the same place, so the preset's pipeline leaves it out and its own stages
take those outputs as plain DVC deps (the distillation preset's student reads the default run's
encoder and task data; its evaluation reads the default run's pretrained and scratch fits).
Every other stage is the preset's own, in its dvc.yaml; one that would write where a stage of
its base writes is refused, naming the key to set. DVC keeps the books of both pipelines
(dvc.lock, presets/NAME/dvc.lock), and `dvc repro presets/NAME/dvc.yaml` runs the preset as
`bertflow run -p params-NAME.yaml` does.

A stage of the preset lists each params key under each params file that sets it (the preset
file, the files it extends), so DVC sees an edit of either. DVC reserves `@` for the stages a
`foreach` makes, and the preset's stages have params of their own each: they are written out
one by one, `finetune@trec-6-scratch` as `finetune__trec-6-scratch`. A preset extending another
preset shares with that one: its stages are its own, its base's, or the default run's.

    python -m pipeline.presets   write every preset's pipeline (`bertflow run -p` writes its own)
"""

from __future__ import annotations

from pathlib import Path

import yaml

from components.core.config import Params
from components.core.errors import ConfigError
from components.core.params import load_params
from pipeline import deps
from pipeline.pipelines import SEP, is_preset, pipeline_file
from pipeline.stages import (
    STAGES,
    START_WEIGHTS,
    lookup,
    outputs,
    plan,
    producers,
    resolve,
    split_name,
    stage_params,
)


def _overlap(a: str, b: str) -> bool:
    """One path is the other or inside it."""
    return Path(a).is_relative_to(b) or Path(b).is_relative_to(a)


def base_of(params_path: Path) -> Path:
    """The params file a preset extends (params.yaml, or another preset)."""
    params_path = Path(params_path).resolve()
    data = yaml.safe_load(params_path.read_text(encoding="utf-8")) or {}
    return (params_path.parent / str(data.get("extends", "params.yaml"))).resolve()


def owners(params_path: Path, until: str | None = None) -> dict[str, Path]:
    """Each stage of a run with `params_path` up to `until`, and the params file whose pipeline
    holds it: the preset's own stages its own, the others their base's (recursively)."""
    params_path = Path(params_path).resolve()
    p = load_params(params_path)
    if not is_preset(params_path):
        return dict.fromkeys(plan(p, until), params_path)
    base = base_of(params_path)
    theirs = owners(base)
    own = set(own_stages(p, load_params(base), plan(p), params_path.name))
    return {name: params_path if name in own else theirs[name] for name in plan(p, until)}


def own_stages(preset: Params, default: Params, names: list[str], preset_file: str) -> list[str]:
    """The stages of `names` (the preset's plan, in order) that are not those of `default`,
    the params it extends (see the module's docstring).
    Refuses, naming the stage, the path and the key to set, one that writes where the default
    run writes."""
    theirs = {n: outputs(default, n) for n in plan(default)}
    own: list[str] = []
    for name in names:
        stage, task, _ = split_name(name)
        # What the stage makes: its folder (its stats go to the preset's metrics or stay the
        # default run's), or a stage without one its files.
        made = (lambda p, n: outputs(p, n)[:1]) if stage.writes else outputs
        if (name in theirs and made(preset, name) == made(default, name)
                and _reads(preset, name) == _reads(default, name)
                and not set(producers(preset, name)) & set(own)):
            continue
        own.append(name)
        for out in outputs(preset, name):
            clash = next(((n, d) for n, outs in theirs.items() for d in outs if _overlap(out, d)), None)
            if clash:
                key = (stage.writes if out == resolve(stage.writes, preset, task) else "${paths.metrics}")
                raise ConfigError(
                    f"{preset_file}: stage {name} would write {out}, where the default run's stage "
                    f"{clash[0]} writes {clash[1]}, but it reads other params or inputs than "
                    f"params.yaml's: give it a path of its own ({key[2:key.index('}')]} in {preset_file})")
    return own


def _reads(p: Params, name: str) -> dict:
    """The values of its params keys that decide stage `name`'s outputs: of a task's entry the
    fields it reads (its kind and source, and those of finetune.task_defaults it lists), of
    finetune.onnx whether it names the stage's start; DVC sees the whole entry and list."""
    stage, task, start = split_name(name)
    values = p.model_dump(mode="json")
    fields = ["kind", "source", *(k.rpartition(".")[2] for k in stage.params
                                  if k.startswith("finetune.task_defaults."))]
    found = {}
    for key in stage_params(stage, task):
        if task and key == f"finetune.tasks.{task}":
            found[key] = {f: values["finetune"]["tasks"][task][f] for f in fields}
        elif key == "finetune.onnx" and start:
            found[key] = start in p.finetune.onnx
        else:
            found[key] = lookup(values, key)
    return found


def _chain(params_path: Path) -> list[tuple[str, dict]]:
    """The preset file and every file it extends, each as (its path from the root, its data)."""
    root = Path(params_path).resolve().parent
    chain, path = [], Path(params_path).resolve()
    while path is not None:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        chain.append((path.relative_to(root).as_posix(), data))
        base = data.get("extends")
        path = (path.parent / str(base)).resolve() if base else None
    return chain


def _sets(data: dict, key: str) -> bool:
    """Whether a params file's data sets `key` (`finetune.tasks.trec-6`) or a key inside it."""
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def render(params_path: Path) -> str:
    """The preset's dvc.yaml: each of its own stages, paths resolved with its params, run from
    the project root."""
    params_path = Path(params_path).resolve()
    preset = load_params(params_path)
    chain, sources = _chain(params_path), deps.source_deps(preset)
    task_sources = deps.task_sources(preset)
    lines = [f"# The pipeline of the preset {params_path.name}: its stages that are not the default run's",
             "# (pipeline/presets.py). Generated by `bertflow run -p FILE`: do not edit by hand.", "stages:"]
    for name in [n for n, owner in owners(params_path).items() if owner == params_path]:
        stage, task, start = split_name(name)

        def fill(template: str, task: str = task, start: str = start) -> str:
            if template == "{weights}":
                template = STAGES[START_WEIGHTS[start]].writes
            return resolve(template, preset, task, start)

        params = []
        for file, data in chain:
            keys = [k for k in stage_params(stage, task) if _sets(data, k)]
            params += [f"  - {file}:", *(f"      - {k}" for k in keys)] if keys else []
        source = [task_sources[task]] if stage.name == "task_data" else sources.get(stage.name, [])
        body = deps.entry(stage, preset, fill, source, params,
                          f"bertflow stage {name} --params {params_path.name}")
        lines += ["", f"  {name.replace('@', SEP)}:", "    wdir: ../..", *(f"    {line}" for line in body)]
    return "\n".join(lines) + "\n"


def write(params_path: Path) -> bool:
    """Write the preset's dvc.yaml anew; True if it changed."""
    from components.core.io import atomic_file

    path = pipeline_file(params_path)
    text = path.read_text() if path.is_file() else ""
    new = render(params_path)
    if new != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as tmp:
            tmp.write_text(new)
    return new != text


def main() -> int:
    """`python -m pipeline.presets`: write the pipeline of every preset beside params.yaml."""
    import sys

    from components.core.imports import ROOT

    for preset in sorted(ROOT.glob("params-*.yaml")):
        changed = write(preset)
        state = "rewritten" if changed else "already current"
        sys.stdout.write(f"{pipeline_file(preset).relative_to(ROOT)}: {state}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
