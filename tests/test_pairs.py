"""Stage pairs: Google's NSP construction, checked on the small real corpus."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components import validation
from components.config import ExecutorConfig, PairsConfig
from components.corpus import iter_documents
from components.errors import ConfigError, ValidationError
from components.io import list_shards
from components.pairs import (
    instances_from_document,
    make_pairs,
    pack_documents,
    to_table,
    tokenize_documents,
    truncate_seq_pair,
    truncation,
)
from components.tokenizer import load

SERIAL = ExecutorConfig(kind="serial")


def google_truncate_seq_pair(a: list, b: list, max_num_tokens: int, rng: random.Random) -> None:
    """Google's create_pretraining_data.truncate_seq_pair, verbatim in behaviour."""
    while True:
        total_length = len(a) + len(b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = a if len(a) > len(b) else b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def test_truncation_counts_equal_googles_loop():
    rng = random.Random(0)
    for _ in range(3000):
        la, lb, m = rng.randint(1, 300), rng.randint(1, 300), rng.randint(2, 200)
        a, b = list(range(la)), list(range(lb))
        google_truncate_seq_pair(a, b, m, random.Random(1))
        assert truncation(la, lb, m) == (la - len(a), lb - len(b)), (la, lb, m)


def test_truncation_removes_from_front_and_back_evenly():
    rng = random.Random(0)
    fronts = []
    for _ in range(4000):
        a, b = truncate_seq_pair(list(range(100)), list(range(10)), 50, rng)
        assert len(a) == 40 and b == list(range(10))
        fronts.append(a[0])  # tokens cut from the front of A
        assert a == list(range(a[0], a[0] + 40))  # what is left is one contiguous slice
    assert abs(np.mean(fronts) - 30) < 0.5  # Binomial(60, 1/2) from the front


@pytest.fixture(scope="module")
def news_docs(stages_dir):
    """Token-id documents of the real small corpus, short enough that nothing is truncated at 512."""
    tok = load(stages_dir / "tokenizer")
    docs = tokenize_documents(tok, [d["sentences"] for d in iter_documents(stages_dir / "clean" / "train")])
    return [d for d in docs if sum(map(len, d)) < 500 and len(d) >= 2][:300]


def _find(stream: list[int], part: list[int]) -> int:
    """Start of `part` as a contiguous slice of `stream`, or -1."""
    n = len(part)
    for i in range(len(stream) - n + 1):
        if stream[i] == part[0] and stream[i:i + n] == part:
            return i
    return -1


def test_positives_are_adjacent_text_and_negatives_come_from_another_document(news_docs):
    cfg = PairsConfig(max_seq_len=512)
    rng = random.Random(7)
    streams = [[t for s in d for t in s] for d in news_docs]
    boundaries = [set(np.cumsum([0] + [len(s) for s in d]).tolist()) for d in news_docs]
    labels = Counter()
    for index in range(len(news_docs)):
        for a, b, label in instances_from_document(news_docs, index, cfg, rng, Counter()):
            labels[label] += 1
            start = _find(streams[index], a)
            assert start >= 0, "A must be text of the document itself"
            if label == 0:  # A and B: whole sentences, B exactly those that follow A
                assert start in boundaries[index] and start + len(a) in boundaries[index]
                assert streams[index][start + len(a): start + len(a) + len(b)] == b
            else:  # B is a run of text of some other document (A may be truncated here)
                others = [i for i, s in enumerate(streams) if i != index and _find(s, b) >= 0]
                assert others, "a random B must come from another document"
    assert labels[0] > 50 and labels[1] > 50


def test_google_law_without_balance_and_balanced_by_default(news_docs):
    counts = {}
    for balance in (False, True):
        rng, c, n = random.Random(3), Counter(), Counter()
        cfg = PairsConfig(balance_nsp=balance)
        for index in range(len(news_docs)):
            for _, _, label in instances_from_document(news_docs, index, cfg, rng, c):
                n[label] += 1
        counts[balance] = (n[1] / (n[0] + n[1]), c["forced_random_next"])
    google_fraction, forced = counts[False]
    assert forced > 0 and google_fraction > 0.5  # one-sentence chunks force random Bs
    assert abs(counts[True][0] - 0.5) < 0.02


@pytest.fixture(scope="module")
def pairs_dir(stages_dir):
    out = stages_dir / "pairs"
    stats = make_pairs(PairsConfig(), ExecutorConfig(workers=2), stages_dir / "clean",
                       stages_dir / "tokenizer", out)
    return out, stats


def test_pairs_stage_on_real_corpus(pairs_dir, stages_dir):
    out, stats = pairs_dir
    assert abs(stats["train"]["nsp_random_fraction"] - 0.5) <= 0.03
    assert stats["train"]["instances"] > 1000 and stats["heldout"]["instances"] > 50
    tok = load(stages_dir / "tokenizer")
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    for path in list_shards(out / "train") + list_shards(out / "heldout"):
        table = pq.read_table(path)
        assert table.schema.field("input_ids").type.value_type == pa.int32()
        assert table.schema.field("token_type_ids").type.value_type == pa.int8()
        assert table.schema.field("next_sentence_label").type == pa.int8()
        frame = validation.pairs_row_stats(table, sep_id)
        assert (frame["length"] <= 128).all() and (frame["first"] == cls_id).all()
        assert (frame["seps"] == 2).all() and (frame["segments_ok"] == 1).all()
    hist = stats["train"]["length_histogram"]
    assert sum(hist.values()) == stats["train"]["instances"]


def test_same_seed_gives_byte_identical_shards_whatever_the_workers(pairs_dir, stages_dir, tmp_path):
    out, _ = pairs_dir
    make_pairs(PairsConfig(), SERIAL, stages_dir / "clean", stages_dir / "tokenizer", tmp_path / "p")
    for split in ("train", "heldout"):
        a, b = list_shards(out / split), list_shards(tmp_path / "p" / split)
        assert [x.name for x in a] == [y.name for y in b]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True))
    make_pairs(PairsConfig(seed=99), SERIAL, stages_dir / "clean", stages_dir / "tokenizer",
               tmp_path / "q")
    assert list_shards(tmp_path / "q" / "train")[0].read_bytes() != \
        list_shards(out / "train")[0].read_bytes()


def test_packing_mode(stages_dir, tmp_path):
    cfg = PairsConfig(mode="packing", max_seq_len=64)
    stats = make_pairs(cfg, SERIAL, stages_dir / "clean", stages_dir / "tokenizer", tmp_path / "p")
    table = pq.read_table(list_shards(tmp_path / "p" / "train")[0])
    lengths = np.array([len(x) for x in table["input_ids"].to_pylist()])
    # Full sentences only (RoBERTa's FULL-SENTENCES), so sequences end short of 64 by less
    # than a sentence.
    assert (lengths <= 64).all() and lengths.mean() > 0.75 * 64
    assert set(table["next_sentence_label"].to_pylist()) == {-1}
    assert {t for row in table["token_type_ids"].to_pylist() for t in row} == {0}
    # Every token of the corpus is packed exactly once (plus [CLS]/[SEP] and boundaries).
    docs = [[[1] * 5, [2] * 70], [[3] * 3]]
    packed = pack_documents(docs, 32)
    flat = [t for a, _, _ in packed for t in a if t != -1]
    assert sorted(flat) == sorted([1] * 5 + [2] * 70 + [3] * 3)
    assert all(len(a) <= 30 for a, _, _ in packed)
    assert stats["train"]["nsp_random_fraction"] == 0


def test_short_max_seq_len_is_a_config_error(stages_dir, tmp_path):
    with pytest.raises(ConfigError, match="pairs.max_seq_len=6: must be at least 8"):
        make_pairs(PairsConfig(max_seq_len=6), SERIAL, stages_dir / "clean",
                   stages_dir / "tokenizer", tmp_path / "p")


def test_pairs_suite_names_each_broken_rule(tmp_path):
    good = to_table([([10, 11], [12], 0), ([13], [14, 15], 1)], cls_id=2, sep_id=3)
    validation.check_pairs_shard(good, cls_id=2, sep_id=3, vocab_size=16, max_seq_len=8, nsp=True,
                                 where=tmp_path / "ok.parquet")
    bad = to_table([([10, 11], [12], 0), ([13], [99, 15], 1)], cls_id=2, sep_id=3)
    with pytest.raises(ValidationError) as err:
        validation.check_pairs_shard(bad, cls_id=2, sep_id=3, vocab_size=16, max_seq_len=5,
                                     nsp=True, where=tmp_path / "part-00007.parquet")
    msg = str(err.value)
    assert "part-00007.parquet: suite 'pairs' failed" in msg
    assert "'column': 'max_id'" in msg and "'column': 'length'" in msg
    assert "'column': 'seps'" not in msg  # what holds is not reported


def test_is_random_next_never_uses_the_same_document():
    docs = [[[i, i]] * 3 for i in range(4)]  # 4 documents of 3 two-token sentences
    rng = random.Random(0)
    for _ in range(200):
        for index in range(4):
            for a, b, label in instances_from_document(docs, index, dataclasses.replace(
                    PairsConfig(), max_seq_len=9, short_seq_prob=0.0), rng, Counter()):
                if label == 1:
                    assert set(b) != {index}
                else:
                    assert set(a) == set(b) == {index}
