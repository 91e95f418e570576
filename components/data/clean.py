"""Stage `clean`: raw documents in, clean sentence-split documents out.

raw shards, in parallel: unicode repair, normalisation, sentence split, filters, MinHash
signatures; then, in order, exact and near-duplicate dedup across all shards
    -> clean/{train,heldout}/part-*.parquet   doc_id, source, sentences: list<string>
       (train keeps the raw sharding; the small held-out split is one shard)
Streams shard by shard: memory holds one shard of text plus one small signature per document.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.core.config import CleanConfig, ExecutorConfig
from components.core.errors import DataError
from components.core.io import SPLITS, atomic_dir, concat_shards, list_shards, shard_name
from components.core.parallel import ShardExecutor
from components.core.seeds import stable_hash
from components.data import validation
from components.data.text import split_sentences

CLEAN_SCHEMA = pa.schema([
    ("doc_id", pa.string()), ("source", pa.string()), ("sentences", pa.list_(pa.string())),
])
MINHASH_SCHEME = "affine32"  # datasketch's hashing scheme, fixed so signatures stay comparable
# Whitespace other than newlines that is not a single space already, made one space: matching
# every single space as well gave the same text but a list of two strings per word (65 MB for 5 MB
# of text, 0.7 GB for a 50 MB line).
_WS = re.compile(r"[^\S\n]{2,}|[^\S\n ]")
# Documents are hashed and shingled in batches of words from this many characters: the same
# hash and MinHash as from one list of all the words, which has 7 million words for a 50 MB line,
# and the MinHash of a batch is a (shingles, num_perm) uint64 array (1 KB per shingle: 10 GB).
_WORD_BATCH_CHARS = 50_000


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


def choose_heldout(doc_ids: list[str], fraction: float, seed: int) -> set[str]:
    """The held-out documents: those whose id hash falls below `fraction` (stable under
    reordering and additions); on a corpus too small for that, the single lowest hash."""
    chosen = {d for d in doc_ids if stable_hash(seed, d) < fraction * 2**64}
    if not chosen and len(doc_ids) >= 2 and fraction > 0:
        chosen = {min(doc_ids, key=lambda d: stable_hash(seed, d))}
    return chosen


def word_batches(text: str) -> Iterator[list[str]]:
    """text.split() in batches, cut at spaces (so the same words in the same order)."""
    start = 0
    while start < len(text):
        end = text.find(" ", start + _WORD_BATCH_CHARS)
        end = len(text) if end < 0 else end
        yield text[start:end].split()
        start = end


def minhash_signature(batches: Iterable[list[str]], cfg: CleanConfig) -> np.ndarray:
    """MinHash of the word shingles of a document, whose words come in batches: (num_perm,)
    uint64. A document shorter than a shingle is one shingle of all its words."""
    from datasketch import MinHash

    k = cfg.shingle_words
    m = MinHash(num_perm=cfg.num_perm, seed=cfg.seed, scheme=MINHASH_SCHEME)
    words: list[str] = []  # the last k - 1 words of the previous batch, then this batch
    shingled = False
    for batch in batches:
        words += batch
        shingles = [" ".join(words[i:i + k]).encode() for i in range(len(words) - k + 1)]
        if shingles:
            m.update_batch(shingles)  # the minimum per permutation: batches change nothing
            shingled = True
        words = words[len(words) - k + 1:] if len(words) >= k else words
    if not shingled:
        m.update_batch([" ".join(words).encode()])
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
    # Arrow's allocator keeps what decoding took (~4x the text of a huge document) for Arrow to
    # reuse; the Python steps below can't: it goes back (a 50 MB line: 0.49 -> 0.31 GB peak)
    pa.default_memory_pool().release_unused()
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
        text = " ".join(kept).lower()
        digest = hashlib.blake2b(digest_size=16)  # of " ".join(text.split())
        for i, batch in enumerate(b for b in word_batches(text) if b):
            digest.update(((" " if i else "") + " ".join(batch)).encode())
        hashes.append(digest.hexdigest())
        signatures.append(minhash_signature(word_batches(text), cfg) if cfg.dedup_near
                          else np.zeros(0))
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
