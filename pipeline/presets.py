"""How a preset runs: what it takes from the default run, and the books of the rest.

A preset (`bertflow run -p params-distill.yaml`) is a params file beside the project's
params.yaml; DVC keeps the books of params.yaml's run only. One of the preset's stages *is* the
default run's when it reads the same values of every params key dvc.yaml lists for it, and its
inputs are the default run's: the same paths, or outputs of stages that are shared in turn.
Such a stage runs, or is skipped, exactly as in `bertflow run` (DVC decides, dvc.lock records
it), and where the preset puts its outputs elsewhere (its own `paths.models`) they are copied
there. Every other stage of the preset is refused before anything runs if it would write where
a stage of the default run writes (it would replace what dvc.lock records with something else),
and is kept in the preset's own books, a lock of the same kind as dvc.lock: the values of its
params keys and the sha256 of its deps (code included) and outputs, after each run. A stage
whose record matches is skipped, so a preset run that was stopped goes on where it stopped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import yaml

from components.core.config import Params
from components.core.digests import digest
from components.core.errors import ConfigError
from components.core.io import atomic_dir, atomic_file, write_json
from components.core.params import load_params
from pipeline import versioning
from pipeline.stages import lookup, plan, split_name, stage_params

_VAR = re.compile(r"\$\{([^}]+)\}")
_OUTPUT_KINDS = ("outs", "metrics", "plots")  # dvc.yaml's kinds of output, in its order

Copies = list[tuple[str, str]]  # (the default run's output, the preset's), relative to the root


def is_preset(params_path: Path) -> bool:
    """Another params file than the params.yaml of the DVC project it lies in."""
    root = Path(params_path).resolve().parent
    default = root / "params.yaml"
    return versioning.is_dvc_project(root) and default.is_file() and not versioning.tracks(params_path)


def preset_shares(params_path: Path, p: Params, until: str | None) -> dict[str, Copies]:
    """shared_stages of a run up to `until` with `params_path` (already read: `p`); {} unless
    it is a preset."""
    if not is_preset(params_path):
        return {}
    root = Path(params_path).resolve().parent
    return shared_stages(p, load_params(root / "params.yaml"), root, plan(p, until), Path(params_path).name)


def stage_paths(dvc_yaml: dict, name: str, p: Params) -> tuple[list[str], list[tuple[str, str]]]:
    """A stage's deps, and its outputs as (path, dvc.yaml's template), resolved as DVC resolves
    dvc.yaml but with `p`'s values. Outputs come in dvc.yaml's order, so the same position names
    the same output under two params files."""
    base, _, task = name.partition("@")
    entry = dvc_yaml["stages"][base]
    body = entry.get("do", entry)  # a foreach stage's template
    values = p.model_dump(mode="json")
    sources = next((v["task_sources"] for v in dvc_yaml.get("vars", []) if "task_sources" in v), {})

    def var(m: re.Match) -> str:
        if m[1] == "key":
            return task
        if m[1] == "item":  # task_data's: the task's source file, from dvc.yaml's own vars
            return sources.get(task, "")
        return str(lookup(values, m[1]))

    def template(item: str | dict) -> str:
        return item if isinstance(item, str) else next(iter(item))

    deps = [os.path.normpath(_VAR.sub(var, template(d))) for d in body.get("deps", [])]
    outs = [(os.path.normpath(_VAR.sub(var, template(o))), template(o))
            for kind in _OUTPUT_KINDS for o in body.get(kind, [])]
    return deps, outs


def _overlap(a: str, b: str) -> bool:
    """One path is the other or inside it."""
    a_parts, b_parts = Path(a).parts, Path(b).parts
    n = min(len(a_parts), len(b_parts))
    return a_parts[:n] == b_parts[:n]


def shared_stages(preset: Params, default: Params, root: Path, names: list[str],
                  preset_file: str) -> dict[str, Copies]:
    """The stages of `names` (the preset's plan, in order) that are the default run's, each with
    the outputs to copy where the preset's paths differ. Refuses, naming the stage, the path and
    the key to set, a stage that is not shared but writes where the default run writes."""
    dvc_yaml = yaml.safe_load((root / "dvc.yaml").read_text())
    theirs = {n: stage_paths(dvc_yaml, n, default) for n in plan(default)}
    ours = {n: stage_paths(dvc_yaml, n, preset) for n in names}
    values = preset.model_dump(mode="json"), default.model_dump(mode="json")
    shared: dict[str, Copies] = {}
    for i, name in enumerate(names):
        deps, outs = ours[name]
        if name in theirs and _same_stage(name, *values, deps, theirs[name][0],
                                          {n: ours[n][1] for n in names[:i]}, shared):
            shared[name] = [(d, o) for (d, _), (o, _) in zip(theirs[name][1], outs, strict=True) if d != o]
            continue
        for out, template in outs:
            clash = next(((n, d) for n, (_, theirs_outs) in theirs.items() for d, _ in theirs_outs
                          if _overlap(out, d)), None)
            if clash:
                key = _VAR.search(template)[1] if _VAR.search(template) else "paths"
                raise ConfigError(
                    f"{preset_file}: stage {name} would write {out}, where the default run's stage "
                    f"{clash[0]} writes {clash[1]}, but it reads other params "
                    f"or inputs than params.yaml's: give it a path of its own ({key} in {preset_file})")
    return shared


def _same_stage(name: str, ours: dict, theirs: dict, deps: list[str], their_deps: list[str],
                earlier_outs: dict[str, list[tuple[str, str]]], shared: dict[str, Copies]) -> bool:
    """Whether stage `name` of the preset reads what the default run's reads: the same values of
    its params keys (`ours`, `theirs`: the two params files' values), and each dep either the
    same path made by no stage of the preset, or made only by shared stages."""
    stage, task = split_name(name)
    if any(lookup(ours, k) != lookup(theirs, k) for k in stage_params(stage, task)):
        return False
    for dep, their_dep in zip(deps, their_deps, strict=True):
        makers = [n for n, outs in earlier_outs.items() if any(_overlap(dep, o) for o, _ in outs)]
        if not (all(n in shared for n in makers) if makers else dep == their_dep):
            return False
    return True


def copy_outputs(root: Path, copies: Copies) -> None:
    """Put a shared stage's outputs at the preset's paths, each written aside and renamed into
    place; a folder replaces only one that bertflow made (components.core.guard)."""
    for src, dst in copies:
        src_path, dst_path = root / src, root / dst
        if src_path.is_dir():
            with atomic_dir(dst_path) as tmp:
                shutil.copytree(src_path, tmp, dirs_exist_ok=True)  # its ownership mark too: the same
        elif src_path.is_file():
            with atomic_file(dst_path) as tmp:
                shutil.copyfile(src_path, tmp)
        else:
            raise ConfigError(f"{src}: the default run's output is missing, so it cannot be copied "
                              f"to {dst}; `dvc checkout` restores what dvc.lock records")


def _lock(root: Path, params_path: Path) -> Path:
    """The preset's books: DVC's temp folder (git-ignored), one file per params file."""
    return root / ".dvc" / "tmp" / "presets" / f"{Path(params_path).name}.lock.json"


def _recorded(root: Path, params_path: Path) -> dict[str, dict]:
    """The preset's books by stage name."""
    lock = _lock(root, params_path)
    try:
        return json.loads(lock.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):  # none yet, or cut short: every stage runs
        return {}


def _entry(root: Path, name: str, p: Params) -> dict:
    """What decides a stage's outputs, and what they are: its params values, the digests of
    its deps and of its outputs ('' for one missing)."""
    deps, outs = stage_paths(yaml.safe_load((root / "dvc.yaml").read_text()), name, p)
    values = p.model_dump(mode="json")
    stage, task = split_name(name)
    return {"params": {k: lookup(values, k) for k in stage_params(stage, task)},
            "deps": {d: digest(root / d) for d in deps}, "outs": {o: digest(root / o) for o, _ in outs}}


def up_to_date(root: Path, params_path: Path, name: str, p: Params) -> bool:
    """Whether the preset's books hold this stage with the same params, deps and outputs."""
    recorded = _recorded(root, params_path).get(name)
    return recorded is not None and all(recorded["outs"].values()) and recorded == _entry(root, name, p)


def record(root: Path, params_path: Path, name: str, p: Params) -> None:
    """Enter a stage that just ran into the preset's books (under the project lock: one writer)."""
    books = _recorded(root, params_path)
    books[name] = _entry(root, name, p)
    write_json(_lock(root, params_path), books)
