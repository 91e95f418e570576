"""Plain, redacted logging, the same in the CLI's process and in every worker it spawns."""

from __future__ import annotations

import logging
import warnings

from components.core.redact import install_log_redaction


class _PlainUserErrors(logging.Formatter):
    """A console formatter that leaves out the traceback of a BertflowError (bad params or data:
    its message names the file, row or key, and the CLI prints it as its `error:` line). The
    record keeps it: other handlers (Prefect's run logs) still store the traceback."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        from components.core.errors import BertflowError

        if not (record.exc_info and isinstance(record.exc_info[1], BertflowError)):
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text = saved


def plain_user_errors_on_consoles(*names: str) -> None:
    """Wrap the formatter of each console handler of the loggers `names` (and the root's) in
    _PlainUserErrors: a failed stage's Prefect logs are then lines, not 85-line tracebacks."""
    for name in ("", *names):
        for handler in logging.getLogger(name).handlers:
            console = type(handler) is not logging.FileHandler and isinstance(handler, logging.StreamHandler)
            if console and not isinstance(handler.formatter, _PlainUserErrors):
                handler.setFormatter(_PlainUserErrors(handler.formatter))


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
