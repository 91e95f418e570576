"""Stage `tokenizer`: learn WordPiece (or BPE) on the clean training split.

Output folder, loadable by `tokenizers.Tokenizer.from_file`, by transformers'
`PreTrainedTokenizerFast(tokenizer_file=...)` and (WordPiece) `BertTokenizer.from_pretrained`:
  tokenizer.json            normaliser, pre-tokeniser, model and the [CLS] A [SEP] B [SEP] template
  vocab.txt                 one token per line, id order (WordPiece; BPE writes vocab.json+merges.txt)
  tokenizer_config.json, special_tokens_map.json   what transformers needs to load it offline
Both kinds mark word-internal pieces with `##`, so whole-word masking works the same for either.
WordPiece output is byte-identical from run to run (see _canonical_ids); BPE's merge order can
differ between runs where merges tie (huggingface/tokenizers#1794), and DVC's cache keeps the
first result until the inputs change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from components.core import progress
from components.core.config import TokenizerConfig
from components.core.errors import DataError
from components.core.io import atomic_dir, iter_rows, list_shards

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]  # ids 0..4, in this order
TOKENIZER_FILE = "tokenizer.json"
# What a model folder carries of a WordPiece tokenizer, for this pipeline and for transformers.
TOKENIZER_FILES = (TOKENIZER_FILE, "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def _sentences(folder: Path) -> Iterator[str]:
    for doc in iter_rows(folder, ("sentences",)):
        yield from doc["sentences"]


def build(cfg: TokenizerConfig):
    """An untrained tokenizer with BERT's normaliser, pre-tokeniser and decoder, and its trainer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if cfg.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix="##"))
        trainer = trainers.WordPieceTrainer(
            vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
            special_tokens=SPECIAL_TOKENS, limit_alphabet=cfg.limit_alphabet,
            continuing_subword_prefix="##", show_progress=progress.enabled(),
        )
    else:
        tok = Tokenizer(models.BPE(unk_token=UNK, continuing_subword_prefix="##"))
        trainer = trainers.BpeTrainer(
            vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
            special_tokens=SPECIAL_TOKENS, limit_alphabet=cfg.limit_alphabet,
            continuing_subword_prefix="##", show_progress=progress.enabled(),
        )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=cfg.lowercase,
        lowercase=cfg.lowercase,
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok, trainer


def _canonical_ids(tok):
    """Renumber a WordPiece vocabulary so that ids depend only on the set of pieces.

    `tokenizers` 0.23 gives `##` pieces ids in hash-map order and breaks ties between merges of
    equal count by those ids (huggingface/tokenizers#1794), so the learned order changes from
    run to run even when the pieces do not. WordPiece looks pieces up by string, so ids are
    only labels: specials keep 0-4, then single characters, then `##` characters, then the
    other pieces, each group sorted. BPE keeps the trainer's ids: its merge ranks carry meaning.
    """
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    special = [t for t in SPECIAL_TOKENS if t in vocab]

    def group(t: str) -> tuple[int, str]:
        return (0 if len(t) == 1 else 1 if t.startswith("##") and len(t) == 3 else 2), t

    order = special + sorted((t for t in vocab if t not in special), key=group)
    data["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    return Tokenizer.from_str(json.dumps(data))


def add_template(tok) -> None:
    """BERT's post-processor: [CLS] A [SEP] for one text, [CLS] A [SEP] B [SEP] (segment 1) for two."""
    from tokenizers import processors

    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )


def transformers_files(cfg: TokenizerConfig, out: Path, max_len: int) -> None:
    """tokenizer_config.json and special_tokens_map.json, for transformers' `from_pretrained`."""
    # Written by hand rather than with transformers' save_pretrained: it keeps the stage free of
    # a 5 s import, and these few keys are all `from_pretrained` reads.
    specials = {"pad_token": PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP,
                "mask_token": MASK}
    config = {
        "tokenizer_class": "BertTokenizer" if cfg.kind == "wordpiece" else "PreTrainedTokenizerFast",
        "do_lower_case": cfg.lowercase,
        "strip_accents": cfg.lowercase,
        "tokenize_chinese_chars": True,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        **specials,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def heldout_stats(tok, folder: Path, batch: int = 4096) -> dict:
    """UNK rate and tokens per word on held-out sentences (words as the pre-tokeniser sees them)."""
    unk_id = tok.token_to_id(UNK)
    tokens = unks = words = 0
    buffer: list[str] = []

    def flush() -> None:
        nonlocal tokens, unks, words
        for enc in tok.encode_batch(buffer, add_special_tokens=False):
            tokens += len(enc.ids)
            unks += enc.ids.count(unk_id)
            word_ids = [w for w in enc.word_ids if w is not None]
            words += (max(word_ids) + 1) if word_ids else 0
        buffer.clear()

    tok.encode_special_tokens = True  # "[MASK]" written in a document is text, not a token
    try:
        for sentence in _sentences(folder):
            buffer.append(sentence)
            if len(buffer) >= batch:
                flush()
        flush()
    finally:
        tok.encode_special_tokens = False
    return {
        "heldout_tokens": tokens,
        "heldout_words": words,
        "unk_rate": unks / max(tokens, 1),
        "tokens_per_word": tokens / max(words, 1),
    }


def train_tokenizer(cfg: TokenizerConfig, clean_dir: Path, out_dir: Path,
                    max_len: int = 512) -> dict:
    """Learn the vocabulary on `clean_dir/train`, measure it on `clean_dir/heldout`, save it."""
    train, heldout = Path(clean_dir) / "train", Path(clean_dir) / "heldout"
    if not list_shards(train):
        raise DataError(f"tokenizer: no shards in {train}; run the clean stage first")
    tok, trainer = build(cfg)
    tok.train_from_iterator(_sentences(train), trainer)
    if cfg.kind == "wordpiece":
        tok = _canonical_ids(tok)
    add_template(tok)
    vocab = tok.get_vocab_size()
    stats = {"vocab_size": vocab, "vocab_size_requested": cfg.vocab_size, "kind": cfg.kind}
    if vocab < cfg.vocab_size:
        # Not an error: the corpus has fewer distinct pieces than asked for. Later stages size
        # the model from the real vocabulary.
        stats["warning"] = (f"the corpus supports only {vocab} tokens, fewer than "
                            f"tokenizer.vocab_size={cfg.vocab_size}")
    stats.update(heldout_stats(tok, heldout))
    with atomic_dir(out_dir) as tmp:
        tok.save(str(tmp / TOKENIZER_FILE))
        if cfg.kind == "wordpiece":
            write_vocab(tok, tmp)
        else:
            tok.model.save(str(tmp))
        transformers_files(cfg, tmp, max_len)
    return stats


def write_vocab(tok, folder: Path) -> None:
    """vocab.txt in id order: what BertTokenizer(vocab_file=...) expects."""
    inverse = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (Path(folder) / "vocab.txt").write_text("".join(t + "\n" for t, _ in inverse), encoding="utf-8")


def load(folder: Path):
    """The saved tokenizer (`tokenizers.Tokenizer`)."""
    from tokenizers import Tokenizer

    path = Path(folder) / TOKENIZER_FILE
    if not path.exists():
        raise DataError(f"{path}: no tokenizer; run the tokenizer stage first")
    return Tokenizer.from_file(str(path))
