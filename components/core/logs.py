"""Plain, redacted logging, the same in the CLI's process and in every worker it spawns."""

from __future__ import annotations

import logging
import warnings

from components.core.redact import install_log_redaction


def configure_logging() -> None:
    """INFO to stderr with secrets masked; Lightning's and the libraries' chatter turned down."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()  # no credentials or tokens in any log line
    for noisy in ("great_expectations", "alembic", "urllib3", "httpx", "dvc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Lightning prints through its own handler; without this every line appears twice.
    logging.getLogger("lightning.pytorch").propagate = False
    # Per-fit banners (GPU/TPU available, tips): fine-tuning fits dozens of models per pipeline.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # a deprecation inside Lightning
    # Fine-tuning batches come from one in-process iterator (no workers), so its length is exact.
    warnings.filterwarnings("ignore", message=".*IterableDataset.*has `__len__` defined.*")
