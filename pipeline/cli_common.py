"""What `bertflow`'s command modules share: the --params option and the project's MLflow client."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ParamsOption = Annotated[Path, typer.Option("--params", "-p", help="The params file.", dir_okay=False)]


def mlflow_client(params: Path):
    """The project's MLflow client; also points mlflow's own URIs (models:/...) at the store."""
    import mlflow

    from components.core import tracking
    from components.core.config import load_params

    params = params.resolve()
    cfg = load_params(params).tracking
    uri = tracking.tracking_uri(cfg, params.parent)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return tracking.client(cfg, params.parent)
