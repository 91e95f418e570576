"""Stage pairs: Google's NSP construction, checked on the small real corpus."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.core.config import ExecutorConfig, PairsConfig
from components.core.errors import ValidationError
from components.core.io import iter_rows, list_shards
from components.data import validation
from components.data.pairs import (
    instances_from_document,
    make_pairs,
    pack_documents,
    sop_instances_from_document,
    to_table,
    tokenize_documents,
    truncate_seq_pair,
)
from components.data.tokenizer import load
from tests.conftest import section

SERIAL = section(ExecutorConfig, kind="serial")


# Google's create_pretraining_data.py (google-research/bert), verbatim but for its masking call:
# masking is dynamic here, done at training time.
def google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def google_create_instances_from_document(all_documents, document_index, max_seq_length,
                                          short_seq_prob, rng):
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                assert len(tokens_a) >= 1
                assert len(tokens_b) >= 1
                instances.append((tokens_a, tokens_b, int(is_random_next)))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def test_truncation_equals_googles_draw_for_draw():
    rng = random.Random(0)
    for _ in range(3000):
        la, lb, m = rng.randint(1, 300), rng.randint(1, 300), rng.randint(2, 200)
        a, b = list(range(la)), list(range(1000, 1000 + lb))
        g_rng, o_rng = random.Random(la * 7 + lb), random.Random(la * 7 + lb)
        ours = truncate_seq_pair(a, b, m, o_rng)
        google_truncate_seq_pair(a, b, m, g_rng)
        assert ours == (a, b) and o_rng.random() == g_rng.random()  # same cuts, same draws


def test_instances_equal_googles_without_balancing(stages_dir):
    # The real small corpus at 128 tokens (so truncation happens), Google's rules unbalanced:
    # the same seed must give Google's instances exactly, one by one.
    tok = load(stages_dir / "tokenizer")
    docs = tokenize_documents(tok, [d["sentences"] for d in iter_rows(
        stages_dir / "clean" / "train", ("sentences",))])
    cfg = section(PairsConfig, balance_nsp=False)
    ours_rng, google_rng = random.Random(5), random.Random(5)
    total = 0
    for index in range(len(docs)):
        ours = instances_from_document(docs, index, cfg, ours_rng, Counter())
        google = google_create_instances_from_document(docs, index, cfg.max_seq_len,
                                                       cfg.short_seq_prob, google_rng)
        assert ours == google, index
        total += len(ours)
    assert total > 1000


@pytest.fixture(scope="module")
def news_docs(stages_dir):
    """Token-id documents of the real small corpus, short enough that nothing is truncated at 512."""
    tok = load(stages_dir / "tokenizer")
    docs = tokenize_documents(tok, [d["sentences"] for d in iter_rows(
        stages_dir / "clean" / "train", ("sentences",))])
    return [d for d in docs if sum(map(len, d)) < 500 and len(d) >= 2][:300]


def _find(stream: list[int], part: list[int]) -> int:
    """Start of `part` as a contiguous slice of `stream`, or -1."""
    n = len(part)
    for i in range(len(stream) - n + 1):
        if stream[i] == part[0] and stream[i:i + n] == part:
            return i
    return -1


def test_positives_are_adjacent_text_and_negatives_come_from_another_document(news_docs):
    cfg = section(PairsConfig, max_seq_len=512)
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
        c, n = Counter(), Counter()
        cfg = section(PairsConfig, balance_nsp=balance)
        for seed in range(20):  # ~6,000 instances: the fair coins' noise is below 1%
            rng = random.Random(seed)
            for index in range(len(news_docs)):
                for _, _, label in instances_from_document(news_docs, index, cfg, rng, c):
                    n[label] += 1
        counts[balance] = (n[1] / (n[0] + n[1]), c["forced_random_next"])
    google_fraction, forced = counts[False]
    assert forced > 0 and google_fraction > 0.5  # one-sentence chunks force random Bs
    assert abs(counts[True][0] - 0.5) < 0.02


def test_pairs_stage_on_real_corpus(pairs_out, stages_dir):
    out, stats = pairs_out
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


def test_same_seed_gives_byte_identical_shards_whatever_the_workers(pairs_out, stages_dir, tmp_path):
    out, _ = pairs_out
    nsp = section(PairsConfig, mode="nsp")
    make_pairs(nsp, SERIAL, stages_dir / "clean", stages_dir / "tokenizer", tmp_path / "p")
    for split in ("train", "heldout"):
        a, b = list_shards(out / split), list_shards(tmp_path / "p" / split)
        assert [x.name for x in a] == [y.name for y in b]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True))
    make_pairs(nsp.model_copy(update={"seed": 99}), SERIAL, stages_dir / "clean", stages_dir / "tokenizer",
               tmp_path / "q")
    assert list_shards(tmp_path / "q" / "train")[0].read_bytes() != \
        list_shards(out / "train")[0].read_bytes()


def test_sop_pairs_are_one_documents_consecutive_text_in_order_or_swapped(news_docs):
    cfg = section(PairsConfig, mode="sop")
    rng, counts = random.Random(7), Counter()
    labels = Counter()
    for doc in news_docs:
        stream = [t for s in doc for t in s]
        for a, b, label in sop_instances_from_document(doc, cfg, rng, counts):
            labels[label] += 1
            first, second = (b, a) if label == 1 else (a, b)
            start = _find(stream, first)
            assert start >= 0, "both segments must be text of the document itself"
            # The truncation may trim the text between them, never reorder it.
            assert _find(stream[start + len(first):], second) >= 0
    assert abs(labels[1] / (labels[0] + labels[1]) - 0.5) < 0.05
    # A one-sentence document still gives an instance: the sentence cut in two.
    (a, b, label), = sop_instances_from_document([[5, 6, 7, 8]], cfg, random.Random(0), counts)
    assert (b + a if label else a + b) == [5, 6, 7, 8]


def test_sop_stage_writes_pair_shards(stages_dir, tmp_path):
    stats = make_pairs(section(PairsConfig, mode="sop"), SERIAL, stages_dir / "clean",
                       stages_dir / "tokenizer",
                       tmp_path / "p")
    assert abs(stats["train"]["sop_swapped_fraction"] - 0.5) <= 0.03
    assert stats["train"]["forced_random_next"] == 0
    table = pq.read_table(list_shards(tmp_path / "p" / "train")[0])
    assert set(table["next_sentence_label"].to_pylist()) == {0, 1}


def test_packing_mode(stages_dir, tmp_path):
    cfg = section(PairsConfig, mode="packing", max_seq_len=64)
    make_pairs(cfg, SERIAL, stages_dir / "clean", stages_dir / "tokenizer", tmp_path / "p")
    table = pq.read_table(list_shards(tmp_path / "p" / "train")[0])
    lengths = np.array([len(x) for x in table["input_ids"].to_pylist()])
    # Full sentences only (RoBERTa's FULL-SENTENCES), so sequences end short of 64 by less
    # than a sentence.
    assert (lengths <= 64).all() and lengths.mean() > 0.75 * 64
    assert set(table["next_sentence_label"].to_pylist()) == {-1}
    assert {t for row in table["token_type_ids"].to_pylist() for t in row} == {0}
    # Tokens keep their order, documents are separated by a boundary ([SEP] in the shard),
    # a sentence longer than a sequence is split, and nothing is lost or repeated.
    docs = [[[1] * 5, [2] * 70], [[3] * 3], [[4] * 2, [5] * 2]]
    packed = [a for a, _, _ in pack_documents(docs, 32)]
    assert all(len(a) <= 30 for a in packed)
    assert [t for a in packed for t in a] == [1] * 5 + [2] * 70 + [-1] + [3] * 3 + [-1] + [4] * 2 + [5] * 2
    table = to_table([(a, [], -1) for a in packed], cls_id=100, sep_id=101)
    assert table["input_ids"].to_pylist()[-1] == \
        [100] + [2] * 10 + [101] + [3] * 3 + [101] + [4, 4, 5, 5] + [101]


def test_stream_mode_fills_every_row_and_loses_nothing(stages_dir, tmp_path):
    from components.data.pairs import stream_documents

    docs = [[[1] * 5, [2] * 70], [[3] * 3], [[4] * 2, [5] * 2]]
    rows = [a for a, _, _ in stream_documents(docs, 32)]
    assert [len(a) for a in rows[:-1]] == [30, 30]  # full rows; boundaries never at an end
    assert all(a[0] != -1 and a[-1] != -1 for a in rows)
    assert [t for a in rows for t in a] == [1] * 5 + [2] * 70 + [-1] + [3] * 3 + [-1] + [4] * 2 + [5] * 2
    make_pairs(section(PairsConfig, mode="stream", max_seq_len=64), SERIAL, stages_dir / "clean",
               stages_dir / "tokenizer", tmp_path / "p")
    table = pq.read_table(list_shards(tmp_path / "p" / "train")[0])
    lengths = [len(x) for x in table["input_ids"].to_pylist()]
    assert sorted(lengths)[1] >= 63  # every row full but the shard's last (less one dropped boundary)


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
            for a, b, label in instances_from_document(docs, index, section(
                    PairsConfig, max_seq_len=9, short_seq_prob=0.0), rng, Counter()):
                if label == 1:
                    assert set(b) != {index}
                else:
                    assert set(a) == set(b) == {index}


def test_special_tokens_written_in_text_stay_text(stages_dir, tmp_path):
    clean_dir = tmp_path / "clean"
    for split, n in (("train", 6), ("heldout", 3)):
        (clean_dir / split).mkdir(parents=True)
        pq.write_table(pa.table({
            "doc_id": [f"{split}{i}" for i in range(n)], "source": ["t"] * n,
            "sentences": [[f"Put a [SEP] here in doc {i}.", "And [MASK] or [CLS] there.",
                           "Then a third sentence."] for i in range(n)],
        }), clean_dir / split / "part-00000.parquet")
    make_pairs(section(PairsConfig, mode="nsp"), SERIAL, clean_dir, stages_dir / "tokenizer", tmp_path / "p")
    tok = load(stages_dir / "tokenizer")
    table = pq.read_table(list_shards(tmp_path / "p" / "train")[0])
    specials = {tok.token_to_id(t) for t in ("[SEP]", "[MASK]", "[CLS]")}
    for row in table["input_ids"].to_pylist():
        inner = [t for t in row[1:-1] if t != tok.token_to_id("[SEP]")]
        assert len(row) - len(inner) == 3  # [CLS], the middle [SEP] and the last [SEP] only
        assert not specials & set(inner)


def test_one_document_shard_has_no_negatives():
    docs = [[[i, i + 1] for i in range(0, 40, 2)]]  # one document of 20 two-token sentences
    counts = Counter()
    instances = instances_from_document(docs, 0, section(PairsConfig, max_seq_len=12, short_seq_prob=0),
                                        random.Random(0), counts)
    assert instances and {label for _, _, label in instances} == {0}
    assert counts["forced_random_next"] == 0
