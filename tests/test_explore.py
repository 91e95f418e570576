"""fill-mask, embeddings, the "bank" test and attention maps, on an encoder really pretrained
(a minute, tiny model) on a small made-up corpus it can learn."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_maps_are_attended_with, run_cli, section, source_config

pytestmark = pytest.mark.slow
CAPITALS = {"france": "paris", "italy": "rome", "spain": "madrid", "japan": "tokyo",
            "egypt": "cairo", "peru": "lima"}
# "bank" in two senses, each in many contexts: what predicts the words around it is the sense.
RIVER = "the {a} {v} on the {adj} bank of the {water} ."
MONEY = "{p} {m} at the bank to {goal} ."
SLOTS = {"a": ["ducks", "frogs", "herons", "otters", "children"],
         "v": ["rested", "played", "waited", "slept"],
         "adj": ["muddy", "grassy", "steep", "sandy"],
         "water": ["river", "stream", "lake"],
         "p": ["she", "he", "my uncle", "the farmer"],
         "m": ["saved money", "asked for a loan", "paid the fee", "opened an account"],
         "goal": ["buy a house", "pay the rent", "start a shop", "fix the roof"]}


def _fill(template: str, rng: random.Random) -> str:
    return template.format(**{k: rng.choice(v) for k, v in SLOTS.items()})


def _documents(n: int, seed: int = 0) -> list[str]:
    """Documents of capital facts and of one sense of "bank" each."""
    rng = random.Random(seed)
    facts = [f"the capital of {c} is {city} ." for c, city in CAPITALS.items()]
    docs = []
    for _ in range(n):
        sense = RIVER if rng.random() < 0.5 else MONEY
        sentences = [rng.choice(facts) if rng.random() < 0.6 else _fill(sense, rng)
                     for _ in range(rng.randint(4, 8))]
        docs.append(" ".join(s.capitalize() for s in sentences))
    return docs


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> Path:
    from components.core.config import (
        CleanConfig,
        ExecutorConfig,
        IngestConfig,
        ModelConfig,
        PairsConfig,
        PretrainConfig,
        TokenizerConfig,
    )
    from components.data.clean import clean
    from components.data.ingest import ingest
    from components.data.pairs import make_pairs
    from components.data.tokenizer import train_tokenizer
    from components.training.pretrain import pretrain

    root = tmp_path_factory.mktemp("explore")
    with (root / "corpus.jsonl").open("w") as f:
        for i, doc in enumerate(_documents(400)):
            f.write(json.dumps({"id": str(i), "text": doc}) + "\n")
    serial = section(ExecutorConfig, kind="serial")
    ingest(section(IngestConfig, sources=[source_config("made-up", kind="jsonl", path="corpus.jsonl",
                                                        id_field="id")]),
           root, root, root / "raw")
    clean(section(CleanConfig, dedup_near=False, heldout_fraction=0.1), serial, root / "raw", root / "clean")
    train_tokenizer(section(TokenizerConfig, vocab_size=200, lowercase=True), root / "clean",
                    root / "tokenizer")
    # The classic encoder on NSP pairs, the recipe the steps below were tuned on (the modern
    # one's tools: tests/test_modern.py).
    make_pairs(section(PairsConfig, mode="nsp", max_seq_len=64), serial, root / "clean", root / "tokenizer",
               root / "pairs")
    # 800 steps: at 500 the capitals were still near a tie on one CPU model (paris 0.17, lima
    # 0.20, one thread, Emerald Rapids), where 800 give paris 0.96.
    cfg = section(PretrainConfig, max_steps=800, warmup_steps=30, batch_size=32, lr=5e-3, short_seq_steps=0,
                         mlm_probability=0.25, val_every_steps=800, snapshot_every_steps=800,
                         accelerator="cpu")
    stats = pretrain(model=section(ModelConfig, arch="classic", preset="tiny"), cfg=cfg,
                     pairs_dir=root / "pairs", tokenizer_dir=root / "tokenizer", out_dir=root / "encoder",
                     work_dir=root / "checkpoints")
    assert stats["mlm_accuracy"] > 0.5, stats  # it learned the corpus
    return root / "encoder"


def test_fill_mask_predicts_the_word_the_corpus_taught(encoder_dir, tmp_path):
    out = run_cli("bertflow", "fill-mask", "The capital of France is [MASK] .", "--model",
                  str(encoder_dir), cwd=tmp_path).stdout
    tokens = out.split()[::2]
    assert tokens[0] == "paris", out
    probabilities = [float(p) for p in out.split()[1::2]]
    assert len(tokens) == 5 and probabilities == sorted(probabilities, reverse=True)
    assert 0 <= probabilities[-1] and probabilities[0] <= 1
    two = run_cli("bertflow", "fill-mask", "The capital of [MASK] is [MASK] .", "--top-k", "3",
                  "--model", str(encoder_dir), cwd=tmp_path).stdout.splitlines()
    assert [line.split()[:2] for line in two] == [["[MASK]", "1:"], ["[MASK]", "2:"]]
    none = run_cli("bertflow", "fill-mask", "no mask here", "--model", str(encoder_dir),
                   cwd=tmp_path, check=False)
    assert none.returncode == 1 and "no [MASK] in 'no mask here'" in none.stderr


def test_bank_by_the_river_is_not_bank_with_the_money(encoder_dir, tmp_path):
    contexts = ["the otters slept on the muddy bank of the river .",  # sentences new to the model
                "the frogs waited on the steep bank of the lake .",
                "my uncle asked for a loan at the bank to buy a house ."]
    out = run_cli("bertflow", "similarity", "bank", *sum((["--context", c] for c in contexts), []),
                  "--model", str(encoder_dir), cwd=tmp_path).stdout.splitlines()
    table = np.array([[float(v) for v in line.split()[1:]] for line in out[-3:]])
    assert np.allclose(np.diag(table), 1.0, atol=1e-3) and np.allclose(table, table.T, atol=1e-3)
    # The two river banks are closer to each other than either is to the money bank.
    assert table[0, 1] > table[0, 2] and table[0, 1] > table[1, 2], table


def test_embeddings_as_npy_and_parquet_agree_with_the_token_vectors(encoder_dir, tmp_path):
    import pyarrow.parquet as pq

    from components.lifecycle.explore import embed, load_encoder, token_vectors

    texts = ["the capital of peru is lima .", "the bank gave him a loan ."]
    args = sum((["--text", t] for t in texts), [])
    run_cli("bertflow", "embed", *args, "--out", "s.npy", "--model", str(encoder_dir), cwd=tmp_path)
    run_cli("bertflow", "embed", *args, "--out", "t.parquet", "--tokens", "--model", str(encoder_dir),
            cwd=tmp_path)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    run_cli("bertflow", "embed", "--file", "in.jsonl", "--pooling", "cls", "--out", "c.parquet",
            "--model", str(encoder_dir), cwd=tmp_path)
    sentences = np.load(tmp_path / "s.npy")
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    cls = pq.read_table(tmp_path / "c.parquet").to_pylist()
    assert sentences.shape == (2, 64) and [r["text"] for r in rows] == texts == [r["text"] for r in cls]
    for i, row in enumerate(rows):
        vectors = np.array(row["vectors"])
        assert row["tokens"][0] == "[CLS]" and len(row["tokens"]) == len(vectors)
        assert np.allclose(vectors.mean(0), sentences[i], atol=1e-5)  # mean pooling, unpadded
        assert np.allclose(vectors[0], cls[i]["vector"], atol=1e-5)  # [CLS] pooling
    # Batched with padding, the vectors are those of each text alone.
    enc = load_encoder(encoder_dir)
    alone = token_vectors(enc, texts[1])[1].mean(0)
    assert np.allclose(embed(enc, texts)[1], alone, atol=1e-5)


def test_attention_maps_are_the_ones_the_model_attends_with(encoder_dir, tmp_path):
    from components.lifecycle.explore import attention_maps, load_encoder

    enc = load_encoder(encoder_dir)
    text = "the boat was tied to the river bank ."
    tokens, maps = attention_maps(enc, text)
    layers, heads = enc.cfg.layers, enc.cfg.heads
    assert maps.shape == (layers, heads, len(tokens), len(tokens))
    assert np.allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert_maps_are_attended_with(enc, text, maps)

    out = run_cli("bertflow", "attention", text, "--layer", "1", "--head", "2", "--out", "a.png",
                  "--model", str(encoder_dir), cwd=tmp_path).stdout
    assert "layer 1 of 2, head 2 of 2" in out
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = run_cli("bertflow", "attention", text, "--layer", "9", "--model", str(encoder_dir),
                  cwd=tmp_path, check=False)
    assert bad.returncode == 1 and "--layer 1..2" in bad.stderr


def test_an_electra_encoder_has_no_mlm_head_to_fill_a_mask_with(stages_dir, tmp_path):
    from components.data.tokenizer import load
    from components.model.build import build_model
    from components.model.folders import write_encoder
    from components.model.metadata import EncoderInfo
    from tests.conftest import encoder_config

    cfg = encoder_config(load(stages_dir / "tokenizer").get_vocab_size(), hidden=32, layers=1,
                         heads=2, intermediate=64, max_position=64, rtd=True)
    write_encoder(build_model(cfg), EncoderInfo(cfg), stages_dir / "tokenizer", tmp_path / "electra")
    proc = run_cli("bertflow", "fill-mask", "The capital of France is [MASK] .", "--model",
                   str(tmp_path / "electra"), cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "replaced-token detection (ELECTRA): it has no MLM head" in proc.stderr
