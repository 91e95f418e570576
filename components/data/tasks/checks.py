"""Checks of a task's settings and examples: config sense before any data is read, row-level
checks that name the file and line, label sets and splits, and the written split's Great
Expectations suite (the data contract)."""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from components.core.config import TaskConfig
from components.core.errors import ConfigError, DataError
from components.data import validation
from components.data.tags import bio_to_spans
from components.data.tasks.folder import SPLIT_NAMES
from components.data.tasks.source import ROLES, Context, Example

log = logging.getLogger(__name__)
_BIO = re.compile(r"^(O|[BI]-\S+)$")


def check_config(name: str, task: TaskConfig) -> None:
    """Settings that make no sense for this task, found before any data is read."""
    where = f"finetune.tasks.{name}"
    unknown = sorted(set(task.columns) - set(ROLES[task.kind]))
    if unknown:
        raise ConfigError(f"{where}.columns: unknown role(s) {unknown} for a {task.kind} task "
                          f"(roles: {', '.join(ROLES[task.kind])})")
    if task.kind == "span" and task.scheme == "plain":
        raise ConfigError(f"{where}.scheme: a span task reads entities from BIO tags; "
                          "`plain` is for token tasks")
    if task.kind in ("token", "span") and task.scheme != "plain":
        tags = [lab for lab in task.labels if lab == "O" or lab[:2] in ("B-", "I-")]
        if tags:
            raise ConfigError(f"{where}.labels: a {task.kind} task lists entity types (PER), "
                              f"not BIO tags; got {tags}")
    if len(set(task.labels)) != len(task.labels):
        raise ConfigError(f"{where}.labels: duplicate labels in {task.labels}")
    if task.max_train_examples < 0:
        raise ConfigError(f"{where}.max_train_examples: must be >= 0, got {task.max_train_examples}")


def resolve_scheme(splits: dict[str, list[Example]], ctx: Context) -> str:
    """The tag scheme of a token or span task: as configured, or for `auto` BIO if every tag
    fits and plain if no tag starts with B- or I-. A mix is an error naming the first tag that
    breaks BIO: most likely a typo in a BIO file (`B_PER`), which as plain tags would be a
    silent new class."""
    if ctx.task.scheme != "auto":
        return ctx.task.scheme
    if ctx.task.kind == "span":
        return "bio"
    tagged = [(ex, i, tag) for split in SPLIT_NAMES for ex in splits[split]
              for i, tag in enumerate(ex["tags"])]
    broken = next(((ex, i, tag) for ex, i, tag in tagged if not _BIO.match(tag)), None)
    if broken is None:
        return "bio"
    if not any(tag[:2] in ("B-", "I-") for _, _, tag in tagged):
        return "plain"
    ex, i, tag = broken
    raise DataError(f"{_at(ex, i)}: tag {tag!r} on token {ex['tokens'][i]!r} is not BIO, but other "
                    f"tags of task '{ctx.name}' are (B-TYPE, I-TYPE); fix the tag, or set "
                    f"finetune.tasks.{ctx.name}.scheme: plain to take every tag as a label")


def check_example(ex: Example, kind: str, split: str, ctx: Context) -> None:
    """Row-level checks (naming file and line); BIO tags are repaired to BIO2 in place."""
    given = set(ctx.task.labels)
    if kind in ("classification", "pair"):
        for role in ROLES[kind][:-1]:
            if not ex[role].strip():
                raise DataError(f"{ex['_where']}: empty {role}")
        if not ex["label"].strip():
            raise DataError(f"{ex['_where']}: empty label")
        if given and ex["label"] not in given:
            raise DataError(f"{ex['_where']}: label {ex['label']!r} is not one of the task's "
                            f"labels {sorted(given)}")
        return
    tokens, tags = ex["tokens"], ex["tags"]
    if not tokens:
        raise DataError(f"{ex['_where']}: empty sentence (no tokens)")
    if len(tokens) != len(tags):
        raise DataError(f"{ex['_where']}: {len(tokens)} tokens but {len(tags)} tags "
                        f"(tokens and tags of different lengths)")
    for i, (token, tag) in enumerate(zip(tokens, tags, strict=True)):
        if not token.strip():
            raise DataError(f"{_at(ex, i)}: empty token")
        if not tag.strip():
            raise DataError(f"{_at(ex, i)}: empty tag on token {token!r}")
        if ctx.scheme == "plain":
            if given and tag not in given:
                raise DataError(f"{_at(ex, i)}: tag {tag!r} on token {token!r} is not one of the "
                                f"task's labels {sorted(given)}")
            continue
        if not _BIO.match(tag):
            hint = "" if kind == "span" else \
                f"; for a tag set without B-/I- set finetune.tasks.{ctx.name}.scheme: plain"
            raise DataError(f"{_at(ex, i)}: malformed BIO tag {tag!r} on token {token!r} "
                            f"(expected O, B-TYPE or I-TYPE{hint})")
        if given and tag != "O" and tag[2:] not in given:
            raise DataError(f"{_at(ex, i)}: entity type {tag[2:]!r} (tag {tag!r}) is not one of "
                            f"the task's labels {sorted(given)}")
    if ctx.scheme == "plain":
        return
    # IOB1 starts an entity with I-; BIO2 (what the span decoder expects) always with B-.
    for i, tag in enumerate(tags):
        if tag[:2] == "I-" and (i == 0 or tags[i - 1][2:] != tag[2:]):
            tags[i] = "B-" + tag[2:]
            ctx.changed["tags_iob1_to_bio2"] += 1


def _at(ex: Example, i: int) -> str:
    """Where token `i` of an example is: its line in a CoNLL file, else the row and position."""
    if "_line" in ex:
        return f"{ex['_file']}:{ex['_line'] + i}"
    return f"{ex['_where']}, token {i + 1}"


def example_labels(ex: Example, kind: str, scheme: str = "bio") -> list[str]:
    """The labels an example carries: its class, the entity types of its B- tags, or its plain
    tags."""
    if kind in ("classification", "pair"):
        return [ex["label"]]
    if scheme == "plain":
        return list(ex["tags"])
    return [t[2:] for t in ex["tags"] if t[:2] == "B-"]


def task_labels(splits: dict[str, list[Example]], ctx: Context) -> list[str]:
    """The task's label list: as configured, else from the (full) train split, sorted (plain
    tags: the most frequent first, the tag a word cut by truncation gets)."""
    kind, scheme = ctx.task.kind, ctx.scheme
    if ctx.task.labels:
        return list(ctx.task.labels)
    counts = Counter(lab for ex in splits["train"] for lab in example_labels(ex, kind, scheme))
    labels = sorted(counts, key=lambda lab: (-counts[lab], lab) if scheme == "plain" else lab)
    _refuse_near_duplicates(labels, splits["train"], kind, scheme)
    known = set(labels)
    what = {"plain": "tag", "bio": "entity type"}.get(scheme, "label")
    for split in ("valid", "test"):
        for ex in splits[split]:
            for lab in example_labels(ex, kind, scheme):
                if lab not in known:
                    raise DataError(f"{ex['_where']}: {what} {lab!r} in {split} never occurs in "
                                    f"train (train has "
                                    f"{labels}); add it to train or list the task's labels")
    return labels


def _refuse_near_duplicates(labels: list[str], train: list[Example], kind: str, scheme: str) -> None:
    """Labels that differ only by spaces or case (`" neg"` beside `neg`) are one label mistyped:
    as two they would be two classes, each with half the examples."""
    groups: dict[str, list[str]] = {}
    for lab in labels:
        groups.setdefault(" ".join(lab.split()).casefold(), []).append(lab)
    for same in (g for g in groups.values() if len(g) > 1):
        counts = Counter(lab for ex in train for lab in example_labels(ex, kind, scheme) if lab in same)
        rare = min(same, key=lambda lab: (counts[lab], lab))
        where = next(ex["_where"] for ex in train if rare in example_labels(ex, kind, scheme))
        others = ", ".join(repr(lab) for lab in same if lab != rare)
        raise DataError(f"{where}: label {rare!r} differs from {others} only by spaces or case "
                        f"({counts[rare]} vs {sum(counts.values()) - counts[rare]} examples); "
                        "write it one way")


def count_long_spans(splits: dict[str, list[Example]], ctx: Context) -> None:
    """A span task's model scores spans of up to `max_span_words` words: a longer entity can
    never be found. Counted in the stats (`changed.entities_over_max_span_words`) and logged;
    an error when no entity of train fits."""
    limit = ctx.task.max_span_words
    def lengths(exs: list[Example]) -> list[int]:
        return [end - start for ex in exs for start, end, _ in bio_to_spans(ex["tags"])]

    over = {split: sum(n > limit for n in lengths(exs)) for split, exs in splits.items()}
    fits = sum(n <= limit for n in lengths(splits["train"]))
    if over["train"] and not fits:
        raise DataError(f"task '{ctx.name}' ({ctx.source}): every entity in train is longer than "
                        f"max_span_words ({limit}); raise finetune.tasks.{ctx.name}.max_span_words")
    if sum(over.values()):
        ctx.changed["entities_over_max_span_words"] = sum(over.values())
        log.warning("task %s: %s entities are longer than max_span_words (%d), so they cannot be "
                    "found; per split: %s", ctx.name, sum(over.values()), limit, over)


def check_splits(splits: dict[str, list[Example]], labels: list[str], ctx: Context) -> None:
    """Every split has examples; train has at least two classes (token tasks: one type)."""
    for split in SPLIT_NAMES:
        if splits[split]:
            continue
        if split in ctx.files:
            raise DataError(f"{ctx.files[split]}: the {split} split is empty (no examples in "
                            f"the file) for task '{ctx.name}'")
        total = sum(len(v) for v in splits.values())
        raise DataError(f"task '{ctx.name}' ({ctx.source}): the {split} split is empty: "
                        f"{total} examples, split {ctx.split}; give more examples or change "
                        f"the split fractions")
    found = Counter(lab for ex in splits["train"]
                    for lab in example_labels(ex, ctx.task.kind, ctx.scheme))
    if (ctx.task.kind in ("classification", "pair") or ctx.scheme == "plain") and len(found) < 2:
        what = "tag" if ctx.scheme == "plain" else "class"
        raise DataError(f"task '{ctx.name}' ({ctx.source}): train has only one {what} "
                        f"{sorted(found)}; a classifier needs at least two")
    if ctx.task.kind in ("token", "span") and not found:
        raise DataError(f"task '{ctx.name}' ({ctx.source}): train has no entity (every tag is O)")


def validate_split(table: pa.Table, kind: str, labels: list[str], where: Path,
                   scheme: str = "bio") -> None:
    """The written split's data contract, as a Great Expectations suite."""
    import pandas as pd

    rows = ("ExpectTableRowCountToBeBetween", {"min_value": 1})
    if kind in ("classification", "pair"):
        texts = ROLES[kind][:-1]
        frame = pd.DataFrame({f"{c}_chars": _stripped_lengths(table[c]) for c in texts})
        frame["label"] = table["label"].to_pandas()
        validate_kw = [rows, ("ExpectColumnValuesToBeInSet", {"column": "label", "value_set": labels})]
        for c in texts:
            validate_kw.append(("ExpectColumnValuesToBeBetween", {"column": f"{c}_chars", "min_value": 1}))
        validation.validate(frame, f"task_{kind}", validate_kw, where)
        return
    plain = scheme == "plain"
    allowed = set(labels) if plain else {"O"} | {f"{p}-{lab}" for lab in labels for p in "BI"}
    tags = table["tags"].to_pylist()
    frame = pd.DataFrame({
        "tokens": [len(t) for t in table["tokens"].to_pylist()],
        "tags": [len(t) for t in tags],
        # tags outside the label set, and (BIO) I- tags that continue nothing: BIO2 broken
        "bad_tags": [sum(t not in allowed for t in ts) for ts in tags],
        "bad_starts": [0 if plain else _orphan_inside_tags(ts) for ts in tags],
    })
    frame["same_length"] = frame["tokens"] == frame["tags"]
    validation.validate(frame, f"task_{kind}", [
        rows,
        ("ExpectColumnValuesToBeBetween", {"column": "tokens", "min_value": 1}),
        ("ExpectColumnValuesToBeInSet", {"column": "same_length", "value_set": [True]}),
        ("ExpectColumnValuesToBeInSet", {"column": "bad_tags", "value_set": [0]}),
        ("ExpectColumnValuesToBeInSet", {"column": "bad_starts", "value_set": [0]}),
    ], where)


def _orphan_inside_tags(tags: list[str]) -> int:
    """I- tags that follow no tag of their type (what BIO2 never has)."""
    return sum(t[:2] == "I-" and (i == 0 or tags[i - 1][2:] != t[2:]) for i, t in enumerate(tags))


def _stripped_lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Characters per text after stripping whitespace (blank text counts as empty)."""
    return np.array([len(t.strip()) for t in column.to_pylist()], dtype=np.int64)
