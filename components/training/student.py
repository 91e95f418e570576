"""The `distilled` start's student when it is not the pipeline's pretrained encoder: the layers
`distill.student_layers` of the teacher's checkpoint (`distill.teacher`), renumbered, as
DistilBERT started from every other layer of BERT. Built in a temporary folder by the distill
stage (MiniLM's cut takes seconds), so that choosing other layers reruns no teacher.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from components.core.config import DistillConfig
from components.model.checkpoint import cut_checkpoint, import_checkpoint


@contextmanager
def student_encoder(distill: DistillConfig, root: Path, packages_dir: Path,
                    beside: Path) -> Iterator[Path | None]:
    """A folder in `beside` holding the cut student while the context lasts (in the project, not
    /tmp: a cluster's workers read it too); None when the student is the pretrained encoder (no
    student_layers)."""
    if not distill.student_layers:
        yield None
        return
    Path(beside).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bertflow-student-", dir=beside) as work:
        import_checkpoint(distill.teacher, root, packages_dir, Path(work) / "teacher")
        cut_checkpoint(Path(work) / "teacher", distill.student_layers, Path(work) / "student")
        yield Path(work) / "student"
