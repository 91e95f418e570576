"""Stage `task_data@task`: a fine-tuning task's examples, validated and split, as Parquet.

prepare_task  a built-in dataset (builtin.py) or your file or folder (files.py)
              -> out_dir/{train,valid,test}.parquet + meta.json, written atomically
    classification  text: string, label: string
    pair            text_a: string, text_b: string, label: string
    token, span     tokens: list<string>, tags: list<string> (BIO2: O, B-X, I-X; or plain tags)
meta.json     {"task", "kind", "labels"} and for token and span tasks "scheme" (bio or plain):
              labels are the classes, the entity types (PER, LOC, ...; never the BIO tags), or
              the plain tags, the most frequent first.
Row-level checks run first so a bad example is named by file and line; a Great Expectations
suite then checks each written split as the data contract (checks.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.core.config import TaskConfig
from components.core.errors import ConfigError, DataError
from components.core.io import atomic_dir, write_json
from components.data.tasks.builtin import BUILTINS
from components.data.tasks.checks import (
    check_config,
    check_example,
    check_splits,
    count_long_spans,
    example_labels,
    resolve_scheme,
    task_labels,
    validate_split,
)
from components.data.tasks.files import load_user
from components.data.tasks.folder import SCHEMAS, SPLIT_NAMES
from components.data.tasks.source import Context, Example


def prepare_task(name: str, task: TaskConfig, root: Path, packages_dir: Path, out_dir: Path) -> dict:
    """Read the task's source, validate it, split it, write out_dir atomically; return stats."""
    check_config(name, task)
    ctx = Context(name, task, Path(root), Path(packages_dir))
    splits = _load(ctx)
    if task.kind in ("token", "span"):
        ctx.scheme = resolve_scheme(splits, ctx)
    for split in SPLIT_NAMES:
        for ex in splits[split]:
            check_example(ex, task.kind, split, ctx)
    labels = task_labels(splits, ctx)
    full_train = len(splits["train"])
    if 0 < task.max_train_examples < full_train:
        splits["train"] = _sample(splits["train"], task.max_train_examples, task.split_seed)
    check_splits(splits, labels, ctx)
    if task.kind == "span":
        count_long_spans(splits, ctx)
    with atomic_dir(out_dir) as tmp:
        for split in SPLIT_NAMES:
            table = _to_table(splits[split], task.kind)
            validate_split(table, task.kind, labels, Path(out_dir) / f"{split}.parquet", ctx.scheme)
            pq.write_table(table, tmp / f"{split}.parquet")
        scheme = {"scheme": ctx.scheme} if ctx.scheme else {}
        write_json(tmp / "meta.json", {"task": name, "kind": task.kind, "labels": labels, **scheme})
    stats: dict[str, Any] = {
        "task": name,
        "kind": task.kind,
        **scheme,
        "source": ctx.source,
        "split": ctx.split,
        "labels": labels,
        "examples": {s: len(splits[s]) for s in SPLIT_NAMES},
        "label_counts": {s: _label_counts(splits[s], task.kind, ctx.scheme) for s in SPLIT_NAMES},
        "dropped": {k: int(v) for k, v in sorted(ctx.dropped.items()) if v},
        "changed": {k: int(v) for k, v in sorted(ctx.changed.items()) if v},
    }
    if len(splits["train"]) < full_train:
        stats["train_sampled_from"] = full_train
    return stats


def _load(ctx: Context) -> dict[str, list[Example]]:
    """The three splits of the task's source, built-in or the user's file/folder."""
    source = ctx.task.source
    if source in BUILTINS:
        kinds, loader = BUILTINS[source]
        if ctx.task.kind not in kinds:
            raise ConfigError(f"finetune.tasks.{ctx.name}: built-in source '{source}' is a "
                              f"{' or '.join(kinds)} task, not {ctx.task.kind}")
        return loader(ctx)
    path = ctx.root / source
    if not path.exists():
        raise DataError(f"task '{ctx.name}': source '{source}' is neither a built-in "
                        f"({', '.join(BUILTINS)}) nor an existing file or folder ({path})")
    return load_user(path, ctx)


def _sample(items: list[Example], size: int, seed: int) -> list[Example]:
    """A seeded sample of `size` examples, in source order."""
    rng = np.random.default_rng([seed, 1])  # not the split's stream: a different draw
    return [items[i] for i in sorted(rng.choice(len(items), size=size, replace=False))]


def _to_table(examples: list[Example], kind: str) -> pa.Table:
    """Examples as an Arrow table with the kind's schema (the `_where` bookkeeping left out)."""
    schema = SCHEMAS[kind]
    return pa.table({c: [ex[c] for ex in examples] for c in schema.names}, schema=schema)


def _label_counts(examples: list[Example], kind: str, scheme: str) -> dict[str, int]:
    """Examples per class, entities per type (BIO), or words per tag (plain)."""
    counts = Counter(lab for ex in examples for lab in example_labels(ex, kind, scheme))
    return dict(sorted(counts.items()))
