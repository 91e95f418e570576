"""Stage `tokenizer`: learn WordPiece (or BPE) on the clean training split.

Output folder, loadable by `tokenizers.Tokenizer.from_file`, by transformers'
`PreTrainedTokenizerFast(tokenizer_file=...)` and (WordPiece) `BertTokenizer.from_pretrained`:
  tokenizer.json            normaliser, pre-tokeniser, model and the [CLS] A [SEP] B [SEP] template
  vocab.txt                 one token per line, id order (WordPiece; BPE writes vocab.json+merges.txt)
  tokenizer_config.json, special_tokens_map.json   what transformers needs to load it offline
Both kinds mark word-internal pieces with `##`, so whole-word masking works the same for either.
Both kinds are byte-identical from run to run: `tokenizers` breaks ties between merges of equal
count by token id, and gives the `##` pieces their ids in hash-map order (a new random seed in
every map), so the learned pieces and merges changed between runs (huggingface/tokenizers#1794).
`initial_pieces` pins those ids before training (see train_tokenizer), and _canonical_ids makes
the final WordPiece ids independent of the merge order.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
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


def build(cfg: TokenizerConfig, pinned: tuple[list[str], list[str]] | None = None):
    """An untrained tokenizer with BERT's normaliser, pre-tokeniser and decoder, and its trainer.

    `pinned` is `initial_pieces(...)`: the alphabet and `##` pieces the trainer would start from.
    They are passed as extra special tokens, so they get fixed ids (specials, characters, `##`
    characters, each sorted) instead of hash-map order; unpin() removes them from the added tokens.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials, alphabet = list(SPECIAL_TOKENS), {"limit_alphabet": cfg.limit_alphabet}
    if pinned is not None:
        chars, inner = pinned
        specials += [t for t in chars + inner if t not in SPECIAL_TOKENS]
        # Exactly these: the trainer's own cut at limit_alphabet breaks ties in hash order.
        alphabet = {"initial_alphabet": chars, "limit_alphabet": len(chars)}
    model, trainer_cls = ((models.WordPiece, trainers.WordPieceTrainer) if cfg.kind == "wordpiece"
                          else (models.BPE, trainers.BpeTrainer))
    tok = Tokenizer(model(unk_token=UNK, continuing_subword_prefix="##"))
    trainer = trainer_cls(
        vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, special_tokens=specials,
        continuing_subword_prefix="##", show_progress=progress.enabled(), **alphabet,
    )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=cfg.lowercase,
        lowercase=cfg.lowercase,
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok, trainer


def initial_pieces(tok, sentences: Iterable[str], limit_alphabet: int,
                   batch: int = 1024) -> tuple[list[str], list[str]]:
    """The characters and `##` characters the trainer starts from, each sorted.

    The same words the trainer sees (this tokenizer's normaliser and pre-tokeniser), counted once
    per distinct whitespace-separated chunk; the alphabet is the `limit_alphabet` most frequent
    characters, ties broken by code point (the trainer breaks them in hash order).
    """
    normalize, pre_tokenize = tok.normalizer.normalize_str, tok.pre_tokenizer.pre_tokenize_str
    # The normaliser turns tab, newline and CR into spaces and is otherwise per character, so
    # splitting raw text there first gives the same words as normalising whole sentences.
    spaces = str.maketrans("\t\n\r", "   ")
    chunks: Counter[str] = Counter()
    buffer: list[str] = []
    for sentence in sentences:
        buffer.append(sentence)
        if len(buffer) >= batch:
            chunks.update(" ".join(buffer).translate(spaces).split(" "))
            buffer.clear()
    chunks.update(" ".join(buffer).translate(spaces).split(" "))
    chunks.pop("", None)
    counts: Counter[str] = Counter()
    inner: set[str] = set()
    for chunk, n in chunks.items():
        for word, _ in pre_tokenize(normalize(chunk)):
            for ch in word:
                counts[ch] += n
            inner.update(word[1:])
    chars = sorted(sorted(counts, key=lambda ch: (-counts[ch], ch))[:limit_alphabet])
    kept = set(chars)
    return chars, ["##" + ch for ch in sorted(inner & kept)]


def unpin(tok, pinned: tuple[list[str], list[str]]):
    """The trained tokenizer without the pinned pieces among its added (special) tokens.

    They stay in the model's vocabulary; as added tokens they would match inside text ("a", "##s").
    Also checks that the trainer started from exactly the pinned pieces: an initial piece it found
    on its own would have got a hash-order id again.
    """
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in SPECIAL_TOKENS]
    initial = {t for t in data["model"]["vocab"]
               if len(t) == 1 or (t.startswith("##") and len(t) == 3)} - set(SPECIAL_TOKENS)
    unpinned = initial - set(pinned[0]) - set(pinned[1])
    if unpinned:
        raise RuntimeError(f"tokenizer: initial pieces not pinned, the vocabulary would not be "
                           f"reproducible: {sorted(unpinned)[:10]}")
    return Tokenizer.from_str(json.dumps(data))


def _canonical_ids(tok):
    """Renumber a WordPiece vocabulary so that ids depend only on the set of pieces.

    The trainer numbers pieces in the order it learns them. WordPiece looks pieces up by string,
    so ids are only labels: specials keep 0-4, then single characters, then `##` characters,
    then the other pieces, each group sorted. BPE keeps the trainer's ids: its merge ranks carry
    meaning.
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


def transformers_files(kind: str, lowercase: bool, out: Path, max_len: int) -> None:
    """tokenizer_config.json and special_tokens_map.json, for transformers' `from_pretrained`."""
    # Written by hand rather than with transformers' save_pretrained: it keeps the stage free of
    # a 5 s import, and these few keys are all `from_pretrained` reads.
    specials = {"pad_token": PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP,
                "mask_token": MASK}
    config = {
        "tokenizer_class": "BertTokenizer" if kind == "wordpiece" else "PreTrainedTokenizerFast",
        "do_lower_case": lowercase,
        "strip_accents": lowercase,
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
    # Two passes over the shards: the initial pieces first, so that their ids, and with them the
    # trainer's tie-breaks between merges of equal count, do not depend on hash order.
    pinned = initial_pieces(build(cfg)[0], _sentences(train), cfg.limit_alphabet)
    tok, trainer = build(cfg, pinned)
    tok.train_from_iterator(_sentences(train), trainer)
    tok = unpin(tok, pinned)
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
        transformers_files(cfg.kind, cfg.lowercase, tmp, max_len)
    return stats


def write_vocab(tok, folder: Path) -> None:
    """vocab.txt in id order: what BertTokenizer(vocab_file=...) expects."""
    inverse = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (Path(folder) / "vocab.txt").write_text("".join(t + "\n" for t, _ in inverse), encoding="utf-8")


def load(folder: Path):
    """The saved tokenizer (`tokenizers.Tokenizer`)."""
    path = Path(folder) / TOKENIZER_FILE
    if not path.exists():
        raise DataError(f"{path}: no tokenizer; run the tokenizer stage first")
    return read_file(path)


def read_file(path: Path):
    """`tokenizers.Tokenizer.from_file`, with an error naming the file when it is damaged
    (truncated, edited by hand): the library's own names neither the file nor the fix."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception
        raise DataError(f"{path}: not a readable tokenizer file ({e}); rerun the stage that "
                        "wrote it") from None
