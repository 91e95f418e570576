"""A checkpoint's tokenizer: read as this pipeline uses one, and adopted by the tokenizer stage
when `pretrain.init_from` is set (the checkpoint's embeddings index its vocabulary). Apart from
the checkpoint import so that the tokenizer stage runs none of the model's code."""

from __future__ import annotations

import json
from pathlib import Path

from components.core.errors import DataError
from components.core.io import atomic_dir
from components.data.tokenizer import (
    SPECIAL_TOKENS,
    TOKENIZER_FILES,
    UNK,
    add_template,
    heldout_stats,
    load,
    read_file,
)
from components.model.metadata import read_checkpoint_info


def checkpoint_tokenizer(folder: Path, vocab_size: int):
    """The checkpoint's tokenizer (tokenizer.json, else vocab.txt), as this pipeline uses one:
    no padding or truncation of its own, BERT's [CLS] A [SEP] B [SEP] template, and the
    vocabulary the embeddings were trained with."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    folder = Path(folder)
    if (folder / "tokenizer.json").exists():
        tok = read_file(folder / "tokenizer.json")
    elif (folder / "vocab.txt").exists():
        settings = folder / "tokenizer_config.json"
        lower = json.loads(settings.read_text()).get("do_lower_case", True) if settings.exists() else True
        tok = Tokenizer(models.WordPiece.from_file(str(folder / "vocab.txt"), unk_token=UNK))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lower, strip_accents=lower)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
    else:
        raise DataError(f"{folder}: no tokenizer.json or vocab.txt; a checkpoint needs its tokenizer")
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise DataError(f"{folder}: the tokenizer has no {', '.join(missing)} (BERT's special tokens)")
    if tok.get_vocab_size() != vocab_size:
        raise DataError(f"{folder}: the tokenizer has {tok.get_vocab_size()} tokens but the "
                        f"model's vocabulary (config.json vocab_size) is {vocab_size}")
    tok.no_padding()
    tok.no_truncation()
    add_template(tok)
    return tok


def adopt_tokenizer(init_from: str, checkpoint_dir: Path, clean_dir: Path, out_dir: Path) -> dict:
    """The tokenizer stage with `pretrain.init_from`: the checkpoint's tokenizer, not a learned
    one (its embeddings index that vocabulary), measured on the held-out sentences all the same."""
    read_checkpoint_info(checkpoint_dir, init_from)
    tok = load(checkpoint_dir)
    stats = {"kind": "checkpoint", "init_from": init_from, "vocab_size": tok.get_vocab_size(),
             **heldout_stats(tok, Path(clean_dir) / "heldout")}
    with atomic_dir(out_dir) as tmp:
        for name in TOKENIZER_FILES:
            (tmp / name).write_bytes((Path(checkpoint_dir) / name).read_bytes())
    return stats
