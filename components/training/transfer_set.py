"""Stage `transfer_set@task`: the transfer set the `distilled` start learns from (data/transfer_set.py):
the training split, `distill.augment_copies` copies of it with words the pretrained encoder's
masked LM replaced (training/augment.py), with the task's `transfer_corpus` a sample of that
corpus source's documents or sentences, and with a pair task's `transfer_pairs` new pairs of its
training texts (`new_pairs`); every row labelled by the task's teacher
(teacher@task) with its soft targets (model/soft_targets.py). The validation and test splits
never enter it. The stage exists only with `distilled` in finetune.init.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.core.config import DistillConfig, FinetuneConfig, TaskConfig
from components.core.errors import DataError
from components.core.io import atomic_dir
from components.data.tasks.folder import read_meta, read_split
from components.data.text import split_words
from components.data.transfer_set import write_transfer
from components.model.build import task_model
from components.model.folders import load_tokenizer, read_weights
from components.model.inputs import encode
from components.model.metadata import INFO_FILE, TaskModelInfo, read_encoder_info, read_task_model_info
from components.model.soft_targets import teacher_targets
from components.training.augment import augment

log = logging.getLogger(__name__)


def build_transfer(name: str, task: TaskConfig, cfg: FinetuneConfig, distill: DistillConfig,
                   task_dir: Path, encoder_dir: Path, teacher_dir: Path, out_dir: Path,
                   clean_dir: Path | None = None) -> dict:
    """The transfer set of one task into `out_dir` (with the task's transfer_corpus, text of
    the clean corpus in `clean_dir` too)."""
    meta = read_meta(task_dir)
    info = check_teacher(Path(teacher_dir) / "model", name, task, meta)
    train = read_split(task_dir, "train")
    max_len = min(task.max_seq_len, read_encoder_info(encoder_dir).config.max_position)
    copies = augment(train, task.kind, encoder_dir, distill.augment_copies, distill.augment_prob,
                     distill.augment_top_k, distill.seed, max_len)
    corpus = paired = train.slice(0, 0)
    if task.transfer_corpus:
        corpus = corpus_rows(clean_dir, task.transfer_corpus, task.kind, train, distill.corpus_rows,
                             distill.seed)
    if task.transfer_pairs:
        paired = new_pairs(train, task.transfer_pairs, task.pair_link, meta["labels"], distill.seed)
    parts = {"train": train, "augmented": copies, "corpus": corpus, "paired": paired}
    table = pa.concat_tables(parts.values())
    n = train.num_rows
    table = (table.append_column("source", pa.array([s for s, t in parts.items() for _ in range(t.num_rows)]))
             .append_column("gold", pa.array([True] * n + [False] * (table.num_rows - n))))
    model = task_model(info.config, task.kind, info.space, info.crf, task.max_span_words)
    model.load_state_dict(read_weights(Path(teacher_dir) / "model" / "model.safetensors"))
    examples = encode(table, task.kind, load_tokenizer(Path(teacher_dir) / "model", info.config), info.labels,
                      info.max_seq_len, task.long_text, info.label_subwords, task.max_span_words, info.scheme,
                      task.chunk_overlap)
    targets = teacher_targets(model, task.kind, examples, cfg.batch_size * 2)
    record = {"task": name, "kind": task.kind, "labels": meta["labels"], "teacher": info.fit}
    with atomic_dir(out_dir) as tmp:
        write_transfer(table, targets, task.kind, record, tmp)
    stats = {"transfer": True, "rows": table.num_rows, "train_rows": n, "augmented_rows": copies.num_rows,
             "corpus_rows": corpus.num_rows, "paired_rows": paired.num_rows}
    if task.kind in ("classification", "pair"):
        # How far the teacher's labels are from the gold (train) and from the source's (copies).
        picked = np.array([info.space[int(t.argmax())] for t in targets])
        same = picked == np.array(table["label"].to_pylist())
        stats["teacher_train_accuracy"] = float(same[:n].mean())
        if copies.num_rows:
            stats["augmented_label_kept"] = float(same[n:n + copies.num_rows].mean())
    log.info("transfer_set@%s: %d rows (%d augmented, %d from the corpus, %d new pairs)", name,
             table.num_rows, copies.num_rows, corpus.num_rows, paired.num_rows)
    return stats


def corpus_rows(clean_dir: Path | None, source: str, kind: str, like: pa.Table, limit: int,
                seed: int) -> pa.Table:
    """A seeded sample of at most `limit` texts of corpus source `source` (the clean corpus's
    training part; its held-out part never): whole documents for classification, sentences of
    three words or more as words for token and span tasks; in the schema of `like` (a training
    split), whose first row's labels stand in (unused: the rows are not gold)."""
    folder = Path(clean_dir or "") / "train"
    docs = [d for shard in sorted(folder.glob("*.parquet"))
            for src, d in zip(*pq.read_table(shard, columns=["source", "sentences"]).to_pydict().values(),
                              strict=True) if src == source]
    if not docs:
        raise DataError(f"transfer_corpus {source!r}: no documents of that source in {folder}; "
                        f"run the clean stage with it among ingest.sources")
    if kind == "classification":
        units = [" ".join(d) for d in docs]
    else:
        units = [w for d in docs for s in d if len(w := split_words(s)[0]) >= 3]
    keep = np.sort(np.random.default_rng(seed).permutation(len(units))[:limit])
    picked = [units[i] for i in keep]
    if kind == "classification":
        label = like["label"][0].as_py()
        return pa.table({"text": picked, "label": [label] * len(picked)}, schema=like.schema)
    stand_in = like["tags"][0].as_py()[0]
    return pa.table({"tokens": picked, "tags": [[stand_in] * len(w) for w in picked]}, schema=like.schema)


def new_pairs(train: pa.Table, rows: int, link: str, labels: list[str], seed: int) -> pa.Table:
    """`rows` new pairs of the training split's texts, none a gold pair or a text with itself, in
    its schema (the first row's label stands in, unused: the teacher labels them). Each draws a
    text at random and a partner: with `link`, half the time one linked to it by gold pairs of
    that label, chains included (same fine type, paraphrase), so that the teacher sees as many
    pairs of the kind as of random ones; else, and for a text linked to none, any text."""
    if link and link not in labels:
        raise DataError(f"pair_link {link!r} is not a label of the task ({', '.join(labels)})")
    a, b, y = (train[c].to_pylist() for c in ("text_a", "text_b", "label"))
    texts = sorted(set(a) | set(b))
    index = {t: i for i, t in enumerate(texts)}
    group = list(range(len(texts)))  # union-find over the linked texts

    def root(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    for x, z, label in zip(a, b, y, strict=True):
        if label == link:
            group[root(index[x])] = root(index[z])
    members: dict[int, list[int]] = {}
    for i in range(len(texts)):
        members.setdefault(root(i), []).append(i)
    gold = set(zip(a, b, strict=True))
    rng = np.random.default_rng(seed)
    out: list[tuple[str, str]] = []
    while len(out) < rows:
        i = int(rng.integers(len(texts)))
        linked = members[root(i)]
        j = int(linked[rng.integers(len(linked))] if link and len(linked) > 1 and rng.random() < 0.5
                else rng.integers(len(texts)))
        if i != j and (texts[i], texts[j]) not in gold:
            out.append((texts[i], texts[j]))
    return pa.table({"text_a": [p[0] for p in out], "text_b": [p[1] for p in out],
                     "label": [y[0]] * rows}, schema=train.schema)


def check_teacher(model_dir: Path, name: str, task: TaskConfig, meta: dict) -> TaskModelInfo:
    """The teacher's record, refused with one line if there is none or it was fine-tuned on
    another kind of task or label set."""
    if not (Path(model_dir) / INFO_FILE).is_file():
        raise DataError(f"{model_dir}: no teacher; run teacher@{name} (finetune.init has distilled)")
    info = read_task_model_info(model_dir)
    if (info.task.kind, info.labels, info.scheme) != (task.kind, meta["labels"], meta.get("scheme", "")):
        raise DataError(f"{model_dir}: a teacher of a {info.task.kind} task with labels {info.labels}, "
                        f"but task {name} is {task.kind} with labels {meta['labels']}; rerun teacher@{name}")
    return info
