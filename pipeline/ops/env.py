"""Quiet, offline-safe defaults for the libraries the pipeline drives (set only if unset)."""

from __future__ import annotations

import ctypes
import os
import sys

from components.core.logs import configure_logging

# glibc's allocator: buffers over its 32 MB mmap ceiling (a pretraining step's sparse MLM logits,
# ~80 MB, and their gradient) are mapped, faulted in page by page and unmapped on every step:
# ~100,000 minor faults and a fifth of the CPU time in the kernel. From the heap, kept between
# steps, a step runs 1.09-1.15x faster (benchmarks/speed/malloc.py). Processes this one starts read the
# variable at their start; this one, already started, is told by mallopt.
TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824"
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameter numbers (malloc.h)

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
    "GLIBC_TUNABLES": TUNABLES,
}


def configure() -> None:
    """Apply DEFAULTS to os.environ and set up plain, redacted logging; called once by the CLI."""
    if "GLIBC_TUNABLES" not in os.environ:  # a user's own tunables are left as they are
        keep_freed_memory()
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    configure_logging()


def keep_freed_memory() -> None:
    """This process's glibc allocator as TUNABLES sets it for the processes it starts (nothing
    where the C library is not glibc)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # musl (Alpine) and others: their allocators have no such ceiling to tune
        return
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
