"""Snapshots written whole or not at all: beside their final name, then renamed.

Lightning's own writer goes through fsspec, which writes a temp file in the system's temp folder
and then *copies* it over the snapshot: a disk that fills during the copy leaves a truncated
`last.ckpt` (which then blocks the next run), and the error names the temp file. Here a failed
write leaves the last good snapshot in place, and the error names the folder that filled.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from components.core.io import atomic_file


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO, writing each snapshot to a temp file beside it and renaming it."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        buffer = io.BytesIO()  # torch.save to a file turns a full disk into a RuntimeError
        torch.save(checkpoint, buffer)
        try:
            with atomic_file(path) as tmp:
                tmp.write_bytes(buffer.getbuffer())
        except OSError as e:  # ENOSPC, EDQUOT, EIO: the folder is what the user must free or move
            raise OSError(e.errno, f"{e.strerror or e} while writing a pretraining snapshot into",
                          str(path.parent)) from None
