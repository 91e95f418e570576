"""Stage `pairs`: pretraining instances from the clean corpus.

`nsp` mode follows Google's `create_pretraining_data.py` (create_instances_from_document):
per document a target length (max_seq_len - 3, or with `short_seq_prob` a random shorter one);
sentences accumulate into a chunk until it reaches the target; a random split point ends A;
B is the true continuation, or (50%, and always for one-sentence chunks) sentences from a random
*other* document, the chunk's unused sentences going back to be read again; then
truncate_seq_pair; layout `[CLS] A [SEP] B [SEP]`, segment ids 0 then 1; `dupe_factor` passes.
As in Google's runs the random document comes from the same input shard, which bounds memory.
With `balance_nsp: false` the instances are Google's, draw for draw: the same random generator
calls in the same order (a test replays Google's code verbatim and compares instance by
instance). One-sentence chunks force a random B, which skews the labels (56% random on the
default corpus, mostly from documents given a short target length). With `balance_nsp: true`
(default) each forced random B is paid back by spending the next free coin as a true
continuation; chunking, split points, negatives and truncation keep Google's rules, and the
labels come out balanced. Unlike Google's, a random B never comes from the same document.

`sop` mode (ALBERT's sentence-order prediction): Google's chunking, target lengths and split
points, but B is always A's true continuation, and with probability 1/2 the two segments swap
places (label 1: swapped, 0: in order; the NSP column and head carry it). NSP's negatives come
from other documents, so a model can solve NSP by topic alone; SOP's two segments share a topic,
so only discourse order tells them apart (ALBERT, Lan et al. 2020, section 4.6). A one-sentence
chunk, which NSP must pair with another document, is cut at a random token instead; ALBERT's
own script still draws a random document there, which would put NSP's topic cue back in.

`packing` mode (RoBERTa FULL-SENTENCES): contiguous sentences packed to max_seq_len across
document boundaries, a [SEP] between documents, no NSP (label -1). Whole sentences leave a row
short by part of one (17% of the default's positions are padding: benchmarks/speed/padding.py).
`stream` mode (ModernBERT's unpadded packing): the documents' tokens, a [SEP] after each, fill
every row to max_seq_len; a document cut where a row ends goes on in the next.

Output: `{train,heldout}/part-*.parquet` with input_ids list<int32>, token_type_ids list<int8>,
next_sentence_label int8 (0: B follows A, 1: B is random (NSP) or the two are swapped (SOP), as
in BERT and HF; -1: no pair objective).
Each shard and pass seeds its own generator from (seed, split, shard), so the output does not
depend on how many workers ran.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.core.config import ExecutorConfig, PairsConfig
from components.core.errors import DataError
from components.core.io import SPLITS, atomic_dir, list_shards
from components.core.parallel import ShardExecutor
from components.core.seeds import stable_hash
from components.data import validation
from components.data.tokenizer import CLS, SEP, load

PAIRS_SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("token_type_ids", pa.list_(pa.int8())),
    ("next_sentence_label", pa.int8()),
])
LABEL_FRACTION = {"sop": "sop_swapped_fraction"}  # stats key of the label-1 share, per mode
HIST_BIN = 16  # tokens per bin of the length histogram

Document = list[list[int]]  # sentences of token ids
Instance = tuple[list[int], list[int], int]  # (A, B, label); packing puts everything in A


def truncate_seq_pair(a: list[int], b: list[int], max_num_tokens: int,
                      rng: random.Random) -> tuple[list[int], list[int]]:
    """Google's truncate_seq_pair, drawing from `rng` exactly as it does.

    Google removes one token at a time from the longer side (B on a tie), from the front or the
    back with probability 1/2. The same draws decide the same cuts here, but the tokens are
    sliced once at the end instead of being deleted one by one.
    """
    len_a, len_b = len(a), len(b)
    front = [0, 0]
    while len_a + len_b > max_num_tokens:
        side = 0 if len_a > len_b else 1
        if rng.random() < 0.5:
            front[side] += 1
        if side == 0:
            len_a -= 1
        else:
            len_b -= 1
    return (a[front[0]:front[0] + len_a], b[front[1]:front[1] + len_b])


def _owes_positive(cfg: PairsConfig, counts: Counter) -> bool:
    """balance_nsp: spend this free coin as a true continuation to pay back a forced random B."""
    if cfg.balance_nsp and counts["forced_random_next"] > counts["balancing_is_next"]:
        counts["balancing_is_next"] += 1
        return True
    return False


def _target_length(cfg: PairsConfig, rng: random.Random) -> tuple[int, int]:
    """Google's per-document lengths: the most tokens A and B may hold ([CLS] and two [SEP]
    aside), and the target, with `short_seq_prob` a random shorter one."""
    max_num_tokens = cfg.max_seq_len - 3
    if rng.random() < cfg.short_seq_prob:
        return max_num_tokens, rng.randint(2, max_num_tokens)
    return max_num_tokens, max_num_tokens


def instances_from_document(docs: list[Document], index: int, cfg: PairsConfig,
                            rng: random.Random, counts: Counter) -> list[Instance]:
    """Google's create_instances_from_document for document `index` of `docs`."""
    document = docs[index]
    max_num_tokens, target_seq_length = _target_length(cfg, rng)
    instances: list[Instance] = []
    chunk: list[list[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for s in chunk[:a_end] for t in s]
            forced = len(chunk) == 1  # B can't continue A inside a one-sentence chunk
            if forced and len(docs) > 1:
                counts["forced_random_next"] += 1
            if len(docs) > 1 and (forced or not _owes_positive(cfg, counts) and rng.random() < 0.5):
                is_random_next = 1
                target_b_length = target_seq_length - len(tokens_a)
                for _ in range(10):  # Google's draw of another document
                    other = rng.randint(0, len(docs) - 1)
                    if other != index:
                        break
                if other == index:  # Google would then use the same document; we never do
                    other = (index + 1 + rng.randint(0, len(docs) - 2)) % len(docs)
                random_document = docs[other]
                tokens_b: list[int] = []
                for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
                    tokens_b.extend(random_document[j])
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(chunk) - a_end  # the unused sentences are read again
            elif not forced:
                is_random_next = 0
                tokens_b = [t for s in chunk[a_end:] for t in s]
            else:  # a one-document shard has no other document to draw B from
                counts["skipped_no_other_document"] += 1
                chunk, chunk_length = [], 0
                i += 1
                continue
            tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            instances.append((tokens_a, tokens_b, is_random_next))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def sop_instances_from_document(document: Document, cfg: PairsConfig, rng: random.Random,
                                counts: Counter) -> list[Instance]:
    """Sentence-order instances of one document: Google's chunks, in order or swapped."""
    max_num_tokens, target_seq_length = _target_length(cfg, rng)
    instances: list[Instance] = []
    chunk: list[list[int]] = []
    chunk_length = 0
    for i, sentence in enumerate(document):
        chunk.append(sentence)
        chunk_length += len(sentence)
        if i < len(document) - 1 and chunk_length < target_seq_length:
            continue
        if len(chunk) >= 2:
            a_end = rng.randint(1, len(chunk) - 1)
            tokens_a = [t for s in chunk[:a_end] for t in s]
            tokens_b = [t for s in chunk[a_end:] for t in s]
        elif len(sentence) >= 2:  # one sentence: its two halves are in order too
            cut = rng.randint(1, len(sentence) - 1)
            tokens_a, tokens_b = sentence[:cut], sentence[cut:]
        else:
            counts["skipped_one_token_chunk"] += 1
            chunk, chunk_length = [], 0
            continue
        tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        swapped = int(rng.random() < 0.5)
        instances.append((tokens_b, tokens_a, 1) if swapped else (tokens_a, tokens_b, 0))
        chunk, chunk_length = [], 0
    return instances


def pack_documents(docs: list[Document], max_seq_len: int) -> list[Instance]:
    """Pack contiguous sentences into full sequences, a [SEP] (id -1 here) between documents."""
    budget = max_seq_len - 2  # [CLS] ... [SEP]
    out: list[Instance] = []
    current: list[int] = []

    def flush() -> None:
        nonlocal current
        while current and current[-1] == -1:  # no dangling boundary before the final [SEP]
            current.pop()
        if current:
            out.append((current, [], -1))
        current = []

    for doc in docs:
        if current:
            if len(current) + 1 > budget:
                flush()
            else:
                current.append(-1)
        for sentence in doc:
            for start in range(0, len(sentence), budget):  # split sentences longer than budget
                piece = sentence[start:start + budget]
                if len(current) + len(piece) > budget:
                    flush()
                current.extend(piece)
    flush()
    return out


def stream_documents(docs: list[Document], max_seq_len: int) -> list[Instance]:
    """Every document's tokens in order, a boundary (id -1) after each but the last, cut into
    rows of max_seq_len - 2 (the last row shorter); no row starts or ends on a boundary."""
    budget = max_seq_len - 2  # [CLS] ... [SEP]
    stream: list[int] = []
    for doc in docs:
        if stream:
            stream.append(-1)
        for sentence in doc:
            stream.extend(sentence)
    rows = (stream[i:i + budget] for i in range(0, len(stream), budget))
    # A row's own [SEP] closes its last document: a boundary at either end would double it.
    trimmed = (row[row[0] == -1:len(row) - (row[-1] == -1)] for row in rows)
    return [(row, [], -1) for row in trimmed if row]


def to_table(instances: list[Instance], cls_id: int, sep_id: int) -> pa.Table:
    """Instances -> Arrow table of the pairs contract, built from flat numpy arrays."""
    n = len(instances)
    len_a = np.fromiter((len(a) for a, _, _ in instances), np.int64, n)
    len_b = np.fromiter((len(b) for _, b, _ in instances), np.int64, n)
    labels = np.fromiter((lab for _, _, lab in instances), np.int8, n)
    nsp = labels >= 0
    # NSP: [CLS] A [SEP] B [SEP]; packing: [CLS] A [SEP] (B empty).
    lengths = len_a + 2 + np.where(nsp, len_b + 1, 0)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat: list[int] = []
    for (a, b, label) in instances:
        flat.append(cls_id)
        flat.extend(a)
        flat.append(sep_id)
        if label >= 0:
            flat.extend(b)
            flat.append(sep_id)
    ids = np.asarray(flat, dtype=np.int32)
    ids[ids == -1] = sep_id  # document boundaries of packing mode
    # Segment ids: 0 over [CLS] A [SEP], 1 over B [SEP] (packing: all 0).
    seg_lengths = np.stack([len_a + 2, lengths - len_a - 2], axis=1).ravel()
    types = np.repeat(np.tile(np.array([0, 1], np.int8), n), seg_lengths)
    return pa.table({
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
        "token_type_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(types)),
        "next_sentence_label": pa.array(labels),
    }, schema=PAIRS_SCHEMA)


def tokenize_documents(tok, sentences_per_doc: list[list[str]], batch: int = 8192) -> list[Document]:
    """Token ids per sentence per document (empty sentences and documents dropped)."""
    flat = [s for doc in sentences_per_doc for s in doc]
    ids: list[list[int]] = []
    for start in range(0, len(flat), batch):  # bounded batches: Encoding objects are large
        ids.extend(e.ids for e in tok.encode_batch_fast(flat[start:start + batch],
                                                         add_special_tokens=False))
    docs, pos = [], 0
    for doc in sentences_per_doc:
        sentences = [s for s in ids[pos:pos + len(doc)] if s]
        pos += len(doc)
        if sentences:
            docs.append(sentences)
    return docs


@dataclass
class _ShardTask:
    cfg: PairsConfig
    tokenizer: Path
    split: str
    src: Path
    dst: Path


def _pairs_shard(task: _ShardTask) -> Counter:
    """Build and write the instances of one clean shard; return its counts."""
    cfg = task.cfg
    tok = load(task.tokenizer)
    tok.encode_special_tokens = True  # "[SEP]" written in a document is text, not a separator
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    docs = tokenize_documents(tok, pq.read_table(task.src, columns=["sentences"])
                              ["sentences"].to_pylist())
    # Seeded per shard: the output does not depend on how many workers ran, nor in what order.
    rng = random.Random(stable_hash(cfg.seed, task.split, task.src.name))
    counts: Counter = Counter()
    instances: list[Instance] = []
    rng.shuffle(docs)  # once, as Google shuffles all_documents before its dupe_factor loop
    for _ in range(cfg.dupe_factor):
        if cfg.mode == "nsp":
            for index in range(len(docs)):
                instances.extend(instances_from_document(docs, index, cfg, rng, counts))
        elif cfg.mode == "sop":
            for doc in docs:
                instances.extend(sop_instances_from_document(doc, cfg, rng, counts))
        elif cfg.mode == "packing":
            instances.extend(pack_documents(docs, cfg.max_seq_len))
        else:
            instances.extend(stream_documents(docs, cfg.max_seq_len))
    rng.shuffle(instances)
    table = to_table(instances, cls_id, sep_id)
    pq.write_table(table, task.dst, row_group_size=8192)
    lengths = pc.list_value_length(table["input_ids"]).to_numpy(zero_copy_only=False)
    labels = table["next_sentence_label"].to_numpy()
    counts["instances"] += table.num_rows
    counts["tokens"] += int(lengths.sum())
    counts["random_next"] += int((labels == 1).sum())
    for b, c in zip(*np.unique(lengths // HIST_BIN, return_counts=True), strict=True):
        counts[f"length_hist.{int(b) * HIST_BIN}"] += int(c)
    return counts


def make_pairs(cfg: PairsConfig, executor: ExecutorConfig, clean_dir: Path, tokenizer_dir: Path,
               out_dir: Path) -> dict:
    """Build the instances of every clean shard into `out_dir/{train,heldout}`; return stats."""
    tok = load(tokenizer_dir)
    vocab_size = tok.get_vocab_size()
    stats: dict = {"mode": cfg.mode}
    with atomic_dir(out_dir) as tmp, ShardExecutor(executor) as ex:
        tasks = []
        for split in SPLITS:
            (tmp / split).mkdir()
            tasks += [_ShardTask(cfg, Path(tokenizer_dir), split, src, tmp / split / src.name)
                      for src in list_shards(Path(clean_dir) / split)]
        if not tasks:
            raise DataError(f"pairs: no shards in {clean_dir}; run the clean stage first")
        results = ex.map(_pairs_shard, tasks, "pairs")
        for split in SPLITS:
            counts: Counter = Counter()
            for task, result in zip(tasks, results, strict=True):
                if task.split == split:
                    counts.update(result)
                    validation.check_pairs_shard(
                        pq.read_table(task.dst), cls_id=tok.token_to_id(CLS),
                        sep_id=tok.token_to_id(SEP), vocab_size=vocab_size,
                        max_seq_len=cfg.max_seq_len, nsp=cfg.mode in ("nsp", "sop"),
                        where=out_dir / split / task.dst.name)
            if counts["instances"] == 0:
                raise DataError(f"pairs: no {split} instances from {clean_dir / split}")
            hist = {int(k.split(".")[1]): v for k, v in counts.items() if k.startswith("length_hist.")}
            stats[split] = {
                "instances": counts["instances"],
                "tokens": counts["tokens"],
                LABEL_FRACTION.get(cfg.mode, "nsp_random_fraction"):
                    counts["random_next"] / counts["instances"],
                "forced_random_next": counts["forced_random_next"],
                "skipped_no_other_document": counts["skipped_no_other_document"],
                "skipped_one_token_chunk": counts["skipped_one_token_chunk"],
                "length_histogram": {str(k): hist[k] for k in sorted(hist)},
            }
    return stats
