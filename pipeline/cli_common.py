"""What `bertflow`'s command modules share: the --params option and the project's MLflow client."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from components.core.errors import BertflowError
from components.core.params import load_params
from components.lifecycle.backends import BACKENDS

ParamsOption = Annotated[Path, typer.Option("--params", "-p", help="The params file.", dir_okay=False)]
Backend = Enum("Backend", {b: b for b in BACKENDS}, type=str)  # typer offers an Enum's values
BackendOption = Annotated[Backend, typer.Option(
    help="Run the model in torch, or its ONNX graph in ONNX Runtime: onnx (fp32) or onnx-int8 "
         "(where its int8 check passed; finetune.onnx writes both).")]


def mlflow_client(params: Path):
    """The project's MLflow client; also points mlflow's own URIs (models:/...) at the store."""
    import mlflow

    from components.core import tracking

    params = params.resolve()
    cfg = load_params(params).tracking
    uri = tracking.tracking_uri(cfg, params.parent)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return tracking.client(cfg, params.parent)


def registry_client(params: Path):
    """`mlflow_client`, for commands that read the registry: a project without its MLflow
    database yet gets one clear line instead of a new, empty database and a lookup that fails."""
    from components.core import tracking
    params = params.resolve()
    cfg = load_params(params).tracking
    prefix = "sqlite:///"
    # Looked at before tracking_uri, which makes the project's store when there is none.
    db = tracking.store_path(cfg, params.parent) or (
        Path(cfg.uri[len(prefix):]) if cfg.uri.startswith(prefix) else None)
    if db is not None and not db.exists():
        raise BertflowError(f"no registry here yet ({db} does not exist): "
                            "run `bertflow run` first, or point --params at your project")
    return mlflow_client(params)


def check_checkout(root: Path) -> None:
    """Refuse a project folder this user cannot write, or a checkout whose commands run another
    checkout's different code (a copied .venv), and say loudly when git cannot read the checkout: the first
    and last happen to a bind mount owned by another uid (Docker), and the last would otherwise
    leave every run's lineage at `git.commit: none` without a word."""
    import os
    import subprocess

    import typer

    hint = 'in Docker, run as the checkout\'s owner: docker run --user "$(id -u):$(id -g)" ...'
    code = Path(__file__).resolve().parents[1]  # the checkout whose code this process runs
    if (code != root.resolve() and (root / "pipeline" / "cli_common.py").is_file()
            and _sources(code) != _sources(root.resolve())):
        raise BertflowError(f"{root} is a checkout of bertflow, but this command runs the code of "
                            f"{code} (a copied .venv keeps the original's paths): run `make install` "
                            f"in {root}, or use {code}'s own commands there")
    if not os.access(root, os.W_OK):
        raise BertflowError(f"{root} is not writable by uid {os.getuid()} (it belongs to uid "
                            f"{root.stat().st_uid}); {hint}")
    if not (root / ".git").exists():  # not a git checkout: no commit to record
        return
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[0]
        typer.echo(f"warning: git cannot read {root} ({why}): this run records git.commit none, "
                   f"so its lineage loses the code version; {hint}, or mark it safe: "
                   f"git config --global --add safe.directory {root}", err=True)


def _sources(checkout: Path) -> dict[str, bytes]:
    """The Python sources of a checkout's packages, by relative path."""
    return {p.relative_to(checkout).as_posix(): p.read_bytes()
            for package in ("components", "pipeline") for p in sorted((checkout / package).rglob("*.py"))}


def check_output(path: Path, name: str, params: Path, folder: bool = False) -> None:
    """An output a command writes where you say: apart from the project's code, inputs, stores and
    stage outputs; a folder only if bertflow made it (components.core.guard). `name` is the
    option or argument, for the error line."""
    from components.core.guard import check_command_output, check_place, claim, project_places

    label = f"{name}: {path}"
    if params.is_file():
        check_command_output(path, label, load_params(params), params.resolve().parent)
    else:  # outside a project (explore's --model FOLDER): the code and stores of the folder here
        check_place(path, label, project_places(params.resolve().parent, {}))
    if folder:
        claim(path, name)
    elif path.is_dir():
        raise BertflowError(f"{label} is a folder; name the file to write")
