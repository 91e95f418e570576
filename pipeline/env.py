"""Quiet, offline-safe defaults for the libraries the pipeline drives (set only if unset)."""

from __future__ import annotations

import logging
import os
import warnings

from components.redact import install_log_redaction

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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()  # no credentials or tokens in any log line
    for noisy in ("great_expectations", "alembic", "urllib3", "httpx", "dvc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Lightning prints through its own handler; without this every line appears twice.
    logging.getLogger("lightning.pytorch").propagate = False
    # Per-fit banners (GPU/TPU available, tips): fine-tuning fits dozens of runs per pipeline.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # a deprecation inside Lightning
    # Fine-tuning batches come from one in-process iterator (no workers), so its length is exact.
    warnings.filterwarnings("ignore", message=".*IterableDataset.*has `__len__` defined.*")
