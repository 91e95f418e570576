"""Quiet, offline-safe defaults for the libraries the pipeline drives (set only if unset)."""

from __future__ import annotations

import os

from components.core.logs import configure_logging

DEFAULTS = {
    "DVC_NO_ANALYTICS": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # else a "database is locked" heartbeat error
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",  # the default 20 s timed out once
    "PREFECT_LOGGING_EXTRA_LOGGERS": "components,pipeline",  # our logs in Prefect's run logs
    "HF_HUB_OFFLINE": "1",  # nothing is ever fetched from a hub
    "TRANSFORMERS_OFFLINE": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # a bar per model logged or loaded
}


def configure() -> None:
    """Apply DEFAULTS to os.environ and set up plain, redacted logging; called once by the CLI."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    configure_logging()
