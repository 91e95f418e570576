"""Stage `teacher@task`: the teacher of the `distilled` start, `distill.teacher` (a public
checkpoint, MiniLM by default) fine-tuned on the task by the task's own protocol (epochs,
windows, decoding, early stopping) at the teacher's rates (the task's `teacher_lr`, searched on
validation when a list). The first seed's model is the teacher (`model/`, a task model like any
other: served, exported, quantized the same way); every seed is scored on validation and test,
which is the checkpoint's own row in the transfer table. Apart from `transfer_set@task` so that
a new pretrained encoder, or new augmentation settings, relabel the transfer set without fitting
the teacher again. The stage exists only with `distilled` in finetune.init.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from components.core.config import DistillConfig, FinetuneConfig, TaskConfig
from components.data.tasks.folder import read_meta, read_split
from components.evaluation.metrics import primary_metric, score_predictions
from components.model.checkpoint import import_checkpoint
from components.training.finetune import encoded_start, fit_start, open_start
from components.training.workers import Cluster

log = logging.getLogger(__name__)


def fit_teacher(name: str, task: TaskConfig, cfg: FinetuneConfig, distill: DistillConfig, root: Path,
                packages_dir: Path, task_dir: Path, out_dir: Path, cluster: Cluster | None = None) -> dict:
    """The task's teacher in `out_dir` (a start's layout: `model/`, `fits/teacher-sN`), its
    scores per seed; its fits on the Dask cluster `cluster` if one is given."""
    # The imported checkpoint beside out_dir, not in /tmp: a cluster's workers read it too.
    Path(out_dir).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bertflow-teacher-", dir=Path(out_dir).parent) as work:
        checkpoint = Path(work) / "checkpoint"
        import_checkpoint(distill.teacher, root, packages_dir, checkpoint)
        meta, encoder, tokenizer = open_start(name, task, task_dir, checkpoint)
        splits = {s: read_split(task_dir, s) for s in ("train", "valid", "test")}
        start = encoded_start("teacher", checkpoint, checkpoint, encoder.config, tokenizer, splits, task, cfg,
                              meta)
        stats = fit_start(name, task, cfg, start, meta, splits, task.teacher_lr, distill.teacher_seeds,
                          out_dir, cluster=cluster)
    scores = _scores(task, task_dir, Path(out_dir) / "fits")
    test = [s["test"] for s in scores.values()]
    log.info("teacher@%s: %s, test %.4f (mean of %d seeds)", name, distill.teacher, np.mean(test), len(test))
    return {"teacher": distill.teacher, **stats, "scores": scores, "test_mean": float(np.mean(test)),
            "test_std": float(np.std(test, ddof=1)) if len(test) > 1 else 0.0}


def _scores(task: TaskConfig, task_dir: Path, fits_dir: Path) -> dict[str, dict[str, float]]:
    """Each teacher fit's best validation and its test score (the task's primary metric)."""
    meta, test = read_meta(task_dir), read_split(task_dir, "test")
    scheme = meta.get("scheme", "")
    metric = primary_metric(task.kind, scheme)
    out = {}
    for path in sorted(fits_dir.glob("*.parquet")):
        found = score_predictions(task.kind, meta["labels"], test, pq.read_table(path), scheme)
        summary = json.loads(path.with_suffix(".json").read_text())
        out[path.stem] = {"valid": summary["best_val_metric"], "test": found[metric]}
    return out
