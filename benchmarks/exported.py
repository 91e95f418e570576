"""The task models a project's run exported (`make run`): what the benchmarks that read them take."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from components.core.config import TaskConfig
from components.core.params import load_params

ROOT = Path(__file__).resolve().parents[1]


def project_option(parser: argparse.ArgumentParser) -> None:
    """--project: the checkout whose run exported the models (default: this one)."""
    parser.add_argument("--project", type=Path, default=ROOT, help="a project that ran `make run`")


def exported_models(project: Path) -> Iterator[tuple[str, TaskConfig, Path, Path]]:
    """(task name, its settings, its exported model folder, its task data folder) per task of
    the project's params.yaml whose model exists: the task model of finetune.init's first start,
    the one the registry takes."""
    p = load_params(project / "params.yaml")
    for name, task in p.finetune.tasks.items():
        model = project / p.paths.models / "tasks" / name / p.finetune.init[0] / "model"
        if model.exists():
            yield name, task, model, project / p.paths.tasks / name
