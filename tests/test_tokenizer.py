"""Stage tokenizer: trained on the small real corpus, loadable by transformers with the same ids."""

from __future__ import annotations

import json

import pytest

from components.core.config import TokenizerConfig
from components.core.errors import DataError
from components.data.tokenizer import SPECIAL_TOKENS, load, train_tokenizer
from tests.conftest import section

TEXT_A = "The President addressed Congress about the economy."
TEXT_B = "Unbelievably, the senators applauded twice!"


def test_wordpiece_layout_and_specials(stages_dir):
    tok = load(stages_dir / "tokenizer")
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    enc = tok.encode(TEXT_A, TEXT_B)
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2 and enc.tokens[-1] == "[SEP]"
    first_sep = enc.tokens.index("[SEP]")
    assert enc.type_ids == [0] * (first_sep + 1) + [1] * (len(enc.ids) - first_sep - 1)
    assert enc.tokens[1] == "the"  # lowercased by default
    vocab = (stages_dir / "tokenizer" / "vocab.txt").read_text().splitlines()
    assert vocab[:5] == SPECIAL_TOKENS and len(vocab) == tok.get_vocab_size()
    assert any(t.startswith("##") for t in vocab)


def test_transformers_loads_it_with_identical_ids(stages_dir):
    from transformers import AutoTokenizer, BertTokenizer, PreTrainedTokenizerFast

    folder = stages_dir / "tokenizer"
    ours = load(folder).encode(TEXT_A, TEXT_B)
    fast = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    assert fast(TEXT_A, TEXT_B)["input_ids"] == ours.ids
    for hf in (BertTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)):
        out = hf(TEXT_A, TEXT_B)
        assert out["input_ids"] == ours.ids
        assert out["token_type_ids"] == ours.type_ids
        assert hf.mask_token_id == 4 and hf.pad_token_id == 0
        assert len(hf) == load(folder).get_vocab_size()
    # Not checked: BertTokenizer(vocab_file=...), which transformers 5 silently ignores
    # (docs/development.md, "Stack notes").


def test_stats_on_heldout(stages_dir):
    stats = train_tokenizer(section(TokenizerConfig, vocab_size=2000), stages_dir / "clean",
                            stages_dir / "tok-again")
    assert stats["vocab_size"] == 2000
    assert stats["unk_rate"] < 0.01 and 1.0 < stats["tokens_per_word"] < 1.6
    # Same corpus and params, same tokenizer file.
    assert (stages_dir / "tok-again" / "tokenizer.json").read_bytes() == \
        (stages_dir / "tokenizer" / "tokenizer.json").read_bytes()


def test_bpe_option_uses_the_same_conventions(stages_dir, tmp_path):
    from transformers import PreTrainedTokenizerFast

    stats = train_tokenizer(section(TokenizerConfig, kind="bpe", vocab_size=1500), stages_dir / "clean",
                            tmp_path / "bpe")
    tok = load(tmp_path / "bpe")
    enc = tok.encode(TEXT_A, TEXT_B)
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    assert json.loads((tmp_path / "bpe" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert any(t.startswith("##") for t in tok.get_vocab())  # word-internal pieces marked
    assert (tmp_path / "bpe" / "merges.txt").exists()
    assert stats["vocab_size"] == 1500
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "bpe" / "tokenizer.json"))
    assert fast(TEXT_A, TEXT_B)["input_ids"] == enc.ids


def _files(folder) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


@pytest.mark.parametrize(("kind", "limit_alphabet"), [("wordpiece", 1000), ("bpe", 1000),
                                                      ("wordpiece", 58)])
def test_same_corpus_gives_byte_identical_tokenizers(stages_dir, tmp_path, kind, limit_alphabet):
    # 8,192 pieces from this corpus reach merges seen two or three times, full of ties, and a
    # 58-character alphabet cuts between characters seen once: `tokenizers` broke both kinds of
    # tie in hash-map order, a new seed in every map, so three trainings gave two or three results.
    cfg = section(TokenizerConfig, kind=kind, vocab_size=8192, limit_alphabet=limit_alphabet)
    for i in range(3):
        train_tokenizer(cfg, stages_dir / "clean", tmp_path / str(i))
    first = _files(tmp_path / "0")
    assert _files(tmp_path / "1") == first and _files(tmp_path / "2") == first


def test_vocab_larger_than_the_corpus_supports_is_reported(stages_dir, tmp_path):
    stats = train_tokenizer(section(TokenizerConfig, vocab_size=200_000), stages_dir / "clean",
                            tmp_path / "t")
    assert stats["vocab_size"] < 200_000
    assert "supports only" in stats["warning"]


def test_missing_input_is_an_error(tmp_path):
    with pytest.raises(DataError, match="no shards in .*train; run the clean stage first"):
        train_tokenizer(section(TokenizerConfig), tmp_path / "nothing", tmp_path / "t")
    assert not (tmp_path / "t").exists()


ODD = ["Ünïcödé àccents and naïve café", "東京タワー is tall", "x" * 300,
       "pneumonoultramicroscopicsilicovolcanoconiosis", "emoji 🤗 and ✓ marks", "tabs\tand  spaces",
       "Use the [SEP] and [MASK] tokens as words"]


@pytest.mark.parametrize(("kind", "lowercase"), [("wordpiece", True), ("wordpiece", False), ("bpe", False)])
def test_transformers_agrees_on_held_out_text(stages_dir, tmp_path, kind, lowercase):
    from transformers import AutoTokenizer

    from components.core.io import iter_rows

    folder = stages_dir / "tokenizer"
    if kind == "bpe" or not lowercase:  # the fixture's tokenizer is lowercased WordPiece
        train_tokenizer(section(TokenizerConfig, kind=kind, vocab_size=1500, lowercase=lowercase),
                        stages_dir / "clean", tmp_path / "b")
        folder = tmp_path / "b"
    ours, hf = load(folder), AutoTokenizer.from_pretrained(folder)
    # Uncased also strips accents, in both (transformers reads do_lower_case and strip_accents).
    assert ours.encode("The").tokens[1] == ("the" if lowercase else "The")
    assert ours.normalizer.normalize_str("Café") == ("cafe" if lowercase else "Café")
    sentences = [s for row in iter_rows(stages_dir / "clean" / "heldout", ("sentences",))
                 for s in row["sentences"]][:300] + ODD
    for a, b in zip(sentences[::2], sentences[1::2], strict=False):
        assert hf(a, b)["input_ids"] == ours.encode(a, b).ids, (a, b)
