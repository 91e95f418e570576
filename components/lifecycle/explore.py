"""Look inside a pretrained encoder: cloze predictions (fill-mask), contextual vectors
(sentence and token embeddings, one word across contexts) and attention maps.

Everything runs on the exported encoder folder (safetensors + bertflow.json + tokenizer), the
one the pretrain stage writes and the registry holds as model `encoder`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from components.core.errors import DataError
from components.model.config import BertConfig
from components.model.folders import load_pretraining_model, load_tokenizer
from components.model.metadata import read_encoder_info
from components.model.pretraining import BertForPretraining

Pooling = Literal["mean", "cls"]


@dataclass
class LoadedEncoder:
    """A pretrained encoder with its MLM head, in eval mode, and the tokenizer it was trained with."""

    model: BertForPretraining
    tokenizer: object
    cfg: BertConfig


def load_encoder(folder: Path) -> LoadedEncoder:
    """The exported encoder at `folder`, checked against its tokenizer."""
    cfg = read_encoder_info(folder).config
    tokenizer = load_tokenizer(folder, cfg)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return LoadedEncoder(load_pretraining_model(folder, cfg).eval(), tokenizer, cfg)


def _batch(enc: LoadedEncoder, texts: list[str]) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Encodings of `texts` ([CLS] text [SEP], cut at the model's length) and padded
    ids (B, T) and attention mask (B, T)."""
    encodings = enc.tokenizer.encode_batch(texts)
    limit = enc.cfg.max_position
    lengths = [min(len(e.ids), limit) for e in encodings]
    ids = torch.full((len(texts), max(lengths)), enc.cfg.pad_id, dtype=torch.long)
    for row, (e, n) in enumerate(zip(encodings, lengths, strict=True)):
        ids[row, :n] = torch.tensor(e.ids[:n])
    return encodings, ids, ids != enc.cfg.pad_id


@torch.no_grad()
def fill_mask(enc: LoadedEncoder, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """For each [MASK] in `text`, the `top_k` tokens the MLM head predicts, with probabilities."""
    from components.data.tokenizer import MASK

    if enc.model.mlm is None:
        raise DataError("this encoder was pretrained with replaced-token detection (ELECTRA): it "
                        "has no MLM head to fill a [MASK] with")
    mask_id = enc.tokenizer.token_to_id(MASK)
    _, ids, attention = _batch(enc, [text])
    positions = (ids[0] == mask_id).nonzero()[:, 0]  # (M,)
    if len(positions) == 0:
        raise DataError(f"no {MASK} in {text!r}: write {MASK} where a word should be predicted")
    hidden = enc.model.encoder(ids, attention_mask=attention)  # (1, T, H)
    probs = enc.model.mlm.logits(hidden[0, positions]).softmax(-1)  # (M, V)
    top = probs.topk(top_k, dim=-1)
    return [[(enc.tokenizer.id_to_token(int(i)), float(p)) for p, i in zip(ps, idx, strict=True)]
            for ps, idx in zip(top.values, top.indices, strict=True)]


@torch.no_grad()
def embed(enc: LoadedEncoder, texts: list[str], pooling: Pooling = "mean",
          batch_size: int = 64) -> np.ndarray:
    """One vector per text (N, H): the mean of its token vectors, or the [CLS] vector."""
    out = []
    for start in range(0, len(texts), batch_size):
        _, ids, attention = _batch(enc, texts[start:start + batch_size])
        hidden = enc.model.encoder(ids, attention_mask=attention)  # (B, T, H)
        if pooling == "cls":
            out.append(hidden[:, 0])
        else:
            weights = attention.unsqueeze(-1).float()  # (B, T, 1): padding counts for nothing
            out.append((hidden * weights).sum(1) / weights.sum(1))
    return torch.cat(out).numpy() if out else np.zeros((0, enc.cfg.hidden), np.float32)


@torch.no_grad()
def token_vectors(enc: LoadedEncoder, text: str) -> tuple[list[str], np.ndarray]:
    """The tokens of `text` ([CLS] and [SEP] included) and their contextual vectors (T, H)."""
    encodings, ids, attention = _batch(enc, [text])
    hidden = enc.model.encoder(ids, attention_mask=attention)[0]  # (T, H)
    return encodings[0].tokens[: ids.shape[1]], hidden.numpy()


@torch.no_grad()
def word_in_context(enc: LoadedEncoder, word: str, context: str) -> np.ndarray:
    """The contextual vector (H,) of the first occurrence of `word` in `context`: the mean of
    the vectors of its subword pieces."""
    match = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", context, re.IGNORECASE)
    if match is None:
        raise DataError(f"{word!r} does not occur as a word in {context!r}")
    encodings, ids, attention = _batch(enc, [context])
    hidden = enc.model.encoder(ids, attention_mask=attention)[0]  # (T, H)
    pieces = [t for t, (a, b) in enumerate(encodings[0].offsets[: ids.shape[1]])
              if b > a and a < match.end() and b > match.start()
              and encodings[0].special_tokens_mask[t] == 0]
    if not pieces:
        raise DataError(f"{word!r} in {context!r} lies beyond the model's "
                        f"{enc.cfg.max_position} tokens")
    return hidden[pieces].mean(0).numpy()


def cosine_table(vectors: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity (N, N) of the rows of `vectors` (N, H)."""
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T


@torch.no_grad()
def attention_maps(enc: LoadedEncoder, text: str) -> tuple[list[str], np.ndarray]:
    """The tokens of `text` and every attention matrix: (layers, heads, T, T), rows summing to 1.

    The model attends through SDPA, which does not return its weights; hooks catch each
    attention module's inputs (with a modern encoder's rotations and window) and recompute
    them with the module's own `probabilities`.
    """
    encodings, ids, attention = _batch(enc, [text])
    inputs: list[tuple] = []
    hooks = [block.attn.register_forward_pre_hook(lambda m, args: inputs.append(args))
             for block in enc.model.encoder.blocks]
    try:
        enc.model.encoder(ids, attention_mask=attention)
    finally:
        for hook in hooks:
            hook.remove()
    maps = [block.attn.probabilities(*args)[0]
            for block, args in zip(enc.model.encoder.blocks, inputs, strict=True)]
    return encodings[0].tokens[: ids.shape[1]], torch.stack(maps).numpy()


def plot_attention(tokens: list[str], matrix: np.ndarray, title: str, out: Path) -> None:
    """A heatmap PNG of one (T, T) attention matrix: rows attend to columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from components.core.io import atomic_file

    size = max(4.0, 0.35 * len(tokens) + 1.5)
    fig, ax = plt.subplots(figsize=(size, size))
    image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=float(matrix.max()))
    ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
    ax.set_xlabel("attends to")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    with atomic_file(Path(out)) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
