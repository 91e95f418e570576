"""The transfer set of the `distilled` start, as `transfer_set@task` writes it and `distill@task`
reads it: `transfer.parquet`, the task's columns (train's schema) plus `source` (train;
augmented, a training row with words the encoder's masked LM replaced; corpus, a text of the
task's transfer_corpus; paired, a new pair of training texts), `gold` (the row's labels are its
own; the others' stand in, unused) and `teacher`, the teacher's log-probabilities per row (C),
per word (W, C) or per enumerated word span (S, 1 + labels); and `teacher.json`, whose teacher
labelled it (task, kind, labels), checked against the task.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import DataError
from components.core.io import read_json, write_json
from components.data import validation

TRANSFER_FILE, TEACHER_FILE = "transfer.parquet", "teacher.json"


def targets_type(kind: str) -> pa.DataType:
    """The `teacher` column's type: a vector per row, or a matrix (a vector per word or span)."""
    vector = pa.list_(pa.float32())
    return vector if kind in ("classification", "pair") else pa.list_(vector)


def write_transfer(table: pa.Table, targets: list[np.ndarray], kind: str, record: dict, out: Path) -> None:
    """The transfer set into folder `out` (a stage's temp folder), checked first: a target per
    row, every one a finite distribution."""
    column = pa.array([t.tolist() for t in targets], type=targets_type(kind))
    table = table.append_column("teacher", column)
    check_transfer(table, targets, Path(out) / TRANSFER_FILE)
    pq.write_table(table, Path(out) / TRANSFER_FILE)
    write_json(Path(out) / TEACHER_FILE, record)


def check_transfer(table: pa.Table, targets: list[np.ndarray], where: Path) -> None:
    """Great Expectations on the transfer set: sources known, gold exactly on the training rows,
    each target's probabilities finite and summing to 1."""
    import pandas as pd

    mass = [np.exp(t.astype(np.float64)).sum(-1) for t in targets]  # per row: (,), (W,) or (S,)
    frame = pd.DataFrame({
        "source": table["source"].to_pylist(), "gold": table["gold"].to_pylist(),
        "finite": [bool(np.isfinite(t).all()) for t in targets],
        "min_mass": [float(m.min()) if m.size else 1.0 for m in mass],
        "max_mass": [float(m.max()) if m.size else 1.0 for m in mass]})
    frame["gold_is_train"] = frame["gold"] == (frame["source"] == "train")
    validation.validate(frame, "transfer_set", [
        ("ExpectColumnValuesToBeInSet", {"column": "source",
                                         "value_set": ["train", "augmented", "corpus", "paired"]}),
        ("ExpectColumnValuesToBeInSet", {"column": "gold_is_train", "value_set": [True]}),
        ("ExpectColumnValuesToBeInSet", {"column": "finite", "value_set": [True]}),
        ("ExpectColumnValuesToBeBetween", {"column": "min_mass", "min_value": 0.999}),
        ("ExpectColumnValuesToBeBetween", {"column": "max_mass", "max_value": 1.001}),
    ], where)


def read_transfer(folder: Path | None, task: str, kind: str, meta: dict) -> tuple[pa.Table, list[np.ndarray]]:
    """The transfer set and its targets, refused with one line if it is missing or its teacher
    was fine-tuned on another task or label set."""
    path = Path(folder or "") / TRANSFER_FILE
    if folder is None or not path.is_file():
        raise DataError(f"{path}: no transfer set; finetune.init has distilled, so run "
                        f"teacher@{task} and transfer_set@{task} first")
    record = read_json(Path(folder) / TEACHER_FILE)
    theirs = (record.get("task"), record.get("kind"), record.get("labels"))
    if theirs != (task, kind, meta["labels"]):
        raise DataError(f"{path}: labelled by a teacher of task {theirs[0]!r} ({theirs[1]}, labels "
                        f"{theirs[2]}), not of {task!r} ({kind}, labels {meta['labels']}); rerun "
                        f"teacher@{task} and transfer_set@{task}")
    table = pq.read_table(path)
    targets = [np.asarray(t, dtype=np.float32) for t in table["teacher"].to_pylist()]
    if kind not in ("classification", "pair"):  # a sentence the teacher saw no word of: (0, C)
        width = next((t.shape[-1] for t in targets if t.size), 1)
        targets = [t.reshape(-1, width) for t in targets]
    return table.drop_columns(["teacher"]), targets
