"""Stage `teacher@task`: the teacher of the `distilled` start, `distill.teacher` (a public
checkpoint, MiniLM by default) fine-tuned on the task by the task's own protocol (epochs,
windows, decoding, early stopping) at the teacher's rates: the task's `teacher_lr`, else
`distill.teacher_lr_grid` searched on validation. The first seed's model is the teacher
(`model/`, a task model like any other: served, exported, quantized the same way); every
further seed (the task's `teacher_seeds`, else distill's) trains at the rate the first chose
into `members/s<seed>/model`, and the mean of every seed's distributions labels the transfer
set: an ensemble, a stronger teacher than any of its members. Every seed is scored on
validation and test, which is the checkpoint's own row in the transfer table; an ensemble of a
classification or pair task is scored too.
Apart from `transfer_set@task` so that a new pretrained encoder, or new augmentation settings,
relabel the transfer set without fitting the teacher again.
Without `distilled` in finetune.init the stage writes an empty record, so DVC's graph stays fixed.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.core.config import DistillConfig, FinetuneConfig, TaskConfig
from components.core.errors import DataError
from components.core.io import atomic_dir, write_json
from components.data.tasks.folder import read_meta, read_split
from components.evaluation.metrics import primary_metric, score_predictions
from components.model.build import task_model
from components.model.checkpoint import import_checkpoint
from components.model.folders import load_tokenizer, read_weights
from components.model.inputs import encode
from components.model.metadata import INFO_FILE, TaskModelInfo, read_task_model_info
from components.model.soft_targets import teacher_targets
from components.training.finetune import finetune_task, teacher_rates

log = logging.getLogger(__name__)

MEMBERS = "members"  # the further seeds' task models, beside the first's `model/`


def teacher_seeds(task: TaskConfig, distill: DistillConfig) -> list[int]:
    """The seeds of a task's teacher: the task's own, else distill's."""
    return list(task.teacher_seeds or distill.teacher_seeds)


def fit_teacher(name: str, task: TaskConfig, cfg: FinetuneConfig, distill: DistillConfig, wanted: bool,
                root: Path, packages_dir: Path, task_dir: Path, out_dir: Path) -> dict:
    """The task's teacher in `out_dir` (finetune's layout: `model/`, `fits/`; `members/` with
    more than one seed), its scores per seed; with `wanted` false (no `distilled` start), only
    an empty record."""
    if not wanted:
        with atomic_dir(out_dir) as tmp:
            write_json(tmp / INFO_FILE, {"teacher": ""})
        return {"teacher": ""}
    seeds = teacher_seeds(task, distill)
    teacher_task = task.model_copy(update={"lr": 0.0, "lr_grid": teacher_rates(task, distill)})
    # The checkpoint arm of finetune_task: fits named checkpoint-sN, each exported as a model.
    teacher_cfg = cfg.model_copy(update={"init": ["checkpoint"], "seeds": seeds[:1], "onnx": False})
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="bertflow-teacher-") as work:
        checkpoint = Path(work) / "checkpoint"
        import_checkpoint(distill.teacher, root, packages_dir, checkpoint)
        stats = finetune_task(name, teacher_task, teacher_cfg, task_dir, checkpoint, out_dir, checkpoint)
        if seeds[1:]:
            chosen = teacher_task.model_copy(update={"lr": stats["fits"][f"checkpoint-s{seeds[0]}"]["lr"],
                                                     "lr_grid": []})
            with atomic_dir(out_dir / MEMBERS) as members:
                for seed in seeds[1:]:
                    member = finetune_task(name, chosen, teacher_cfg.model_copy(update={"seeds": [seed]}),
                                           task_dir, checkpoint, members / f"s{seed}", checkpoint)
                    stats["fits"].update(member["fits"])
    scores = {k: v for fits in [out_dir / "fits", *sorted(out_dir.glob(f"{MEMBERS}/s*/fits"))]
              for k, v in _scores(task, task_dir, fits).items()}
    test = [s["test"] for s in scores.values()]
    record = {"teacher": distill.teacher, **{k: v for k, v in stats.items() if k != "encoder"},
              "scores": scores, "test_mean": float(np.mean(test)),
              "test_std": float(np.std(test, ddof=1)) if len(test) > 1 else 0.0}
    if len(seeds) > 1 and task.kind in ("classification", "pair"):
        record["ensemble"] = {split: _ensemble_accuracy(out_dir, task, cfg, read_split(task_dir, split))
                              for split in ("valid", "test")}
    log.info("teacher@%s: %s, test %.4f (mean of %d seeds)%s", name, distill.teacher, np.mean(test),
             len(test), f", ensemble {record['ensemble']['test']:.4f}" if "ensemble" in record else "")
    return record


def members(teacher_dir: Path) -> list[Path]:
    """The teacher's task models: the first seed's, then the further seeds'."""
    return [Path(teacher_dir) / "model", *sorted(Path(teacher_dir).glob(f"{MEMBERS}/s*/model"))]


def ensemble_targets(teacher_dir: Path, task: TaskConfig, batch_size: int,
                     table: pa.Table) -> list[np.ndarray]:
    """The teacher's soft targets for each row of `table` (model/soft_targets.py's shapes): the
    log of the mean of its members' probabilities, one member's own with one seed."""
    folders = members(teacher_dir)
    info = read_task_model_info(folders[0])  # the members share tokenizer, labels and protocol
    examples = encode(table, task.kind, load_tokenizer(folders[0], info.config), info.labels,
                      info.max_seq_len, task.long_text, info.label_subwords, task.max_span_words,
                      info.scheme, task.chunk_overlap)
    total: list[np.ndarray] | None = None
    for folder in folders:
        model = task_model(info.config, task.kind, info.space, info.crf, task.max_span_words)
        model.load_state_dict(read_weights(folder / "model.safetensors"))
        found = [t.astype(np.float64) for t in teacher_targets(model, task.kind, examples, batch_size)]
        total = found if total is None else [np.logaddexp(a, t) for a, t in zip(total, found, strict=True)]
    return [(t - np.log(len(folders))).astype(np.float32) for t in total]


def check_teacher(teacher_dir: Path, name: str, task: TaskConfig, distill: DistillConfig,
                  meta: dict) -> TaskModelInfo:
    """The teacher's record, refused with one line if there is none, it was fine-tuned on
    another kind of task or label set, or it has another number of seeds than asked."""
    model_dir = Path(teacher_dir) / "model"
    if not (model_dir / INFO_FILE).is_file():
        raise DataError(f"{model_dir}: no teacher; run teacher@{name} (finetune.init has distilled)")
    info = read_task_model_info(model_dir)
    if (info.task.kind, info.labels, info.scheme) != (task.kind, meta["labels"], meta.get("scheme", "")):
        raise DataError(f"{model_dir}: a teacher of a {info.task.kind} task with labels {info.labels}, "
                        f"but task {name} is {task.kind} with labels {meta['labels']}; rerun teacher@{name}")
    found, wanted = len(members(teacher_dir)), len(teacher_seeds(task, distill))
    if found != wanted:
        raise DataError(f"{teacher_dir}: a teacher of {found} seeds, but task {name} asks for {wanted} "
                        f"(teacher_seeds); rerun teacher@{name}")
    return info


def _ensemble_accuracy(teacher_dir: Path, task: TaskConfig, cfg: FinetuneConfig, split: pa.Table) -> float:
    """The accuracy of the members' mean distribution on a split of a classification or pair task."""
    space = read_task_model_info(Path(teacher_dir) / "model").space
    picked = [space[int(t.argmax())] for t in ensemble_targets(teacher_dir, task, cfg.batch_size * 2, split)]
    return float(np.mean(np.array(picked) == np.array(split["label"].to_pylist())))


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
