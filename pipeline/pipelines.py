"""Which DVC pipeline holds a stage, and how DVC names it there: params.yaml's stages are in the
project's dvc.yaml under their own names; a preset's own stages in presets/NAME/dvc.yaml, as
`stage__item` (pipeline/presets.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

SEP = "__"  # `stage@item` in a preset's dvc.yaml, where DVC reserves `@` for foreach stages


def is_preset(params_path: Path) -> bool:
    """Another params file than the params.yaml of the DVC project it lies in."""
    params_path = Path(params_path).resolve()
    root = params_path.parent
    default = root / "params.yaml"
    return (root / ".dvc").is_dir() and default.is_file() and params_path != default


def pipeline_file(params_path: Path) -> Path:
    """The preset's generated dvc.yaml: `params-distill.yaml` -> `presets/distill/dvc.yaml`."""
    params_path = Path(params_path).resolve()
    return params_path.parent / "presets" / params_path.stem.removeprefix("params-") / "dvc.yaml"


def address(params_path: Path, name: str) -> str:
    """How DVC names the preset's stage `name`: `presets/distill/dvc.yaml:distill__trec-6`."""
    params_path = Path(params_path).resolve()
    return f"{pipeline_file(params_path).relative_to(params_path.parent).as_posix()}:{name.replace('@', SEP)}"


def stage_address(params_path: Path, name: str) -> str | None:
    """How DVC names stage `name` run with `params_path`: its name in params.yaml's pipeline, its
    address in a preset's; None outside a DVC project, or where the preset's pipeline does not
    hold it (a stage it shares with its base, run by hand with its params)."""
    params_path = Path(params_path).resolve()
    if not (params_path.parent / ".dvc").is_dir():
        return None
    if not is_preset(params_path):
        return name
    pipeline = pipeline_file(params_path)
    stages = (yaml.safe_load(pipeline.read_text()) or {}).get("stages", {}) if pipeline.is_file() else {}
    return address(params_path, name) if name.replace("@", SEP) in stages else None


