"""The transfer set's augmented copies (TinyBERT's data augmentation, Jiao et al. 2020): training
rows with some of their words replaced by what the pipeline's own encoder predicts there with its
masked-LM head. The teacher then labels each copy (training.transfer): more in-domain text, with
labels that follow what the replaced words now say.

A word is replaceable when it is letters only and the encoder's tokenizer keeps it as one
subword (TinyBERT leaves multi-piece words to GloVe, which this pipeline has not). Each copy
masks a seeded share of a row's replaceable words at once, runs the MLM over the row in windows,
and draws each replacement from the k most likely whole-word subwords other than the original.
Word counts never change, so a token task's per-word targets line up with its words.
Shapes: B windows, T subword positions, H hidden, N masked positions, V vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from components.data.tokenizer import CLS, MASK, SEP
from components.model.folders import load_pretraining_model, load_tokenizer
from components.model.inputs import length_batches
from components.model.metadata import read_encoder_info

TEXT_FIELDS = {"classification": ("text",), "pair": ("text_a", "text_b"), "token": ("tokens",),
               "span": ("tokens",)}


def augment(table: pa.Table, kind: str, encoder_dir: Path, copies: int, prob: float, top_k: int,
            seed: int, max_len: int, batch_size: int = 64) -> pa.Table:
    """`copies` copies of every row of `table` (copy after copy, rows in order), each with about
    `prob` of its replaceable words replaced; the other columns are the source row's. Texts are
    split at whitespace and joined with one space."""
    if copies == 0 or table.num_rows == 0:
        return table.slice(0, 0)
    cfg = read_encoder_info(encoder_dir).config
    with torch.random.fork_rng(devices=[]):
        model = load_pretraining_model(encoder_dir, cfg).eval()
    tok = load_tokenizer(encoder_dir, cfg)
    tok.no_truncation()
    allowed = torch.tensor([t.isalpha() for t in (tok.id_to_token(i) for i in range(cfg.vocab_size))])
    rng, draw = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    parts = []
    for _ in range(copies):
        copy = table
        for field in TEXT_FIELDS[kind]:
            values = table[field].to_pylist()
            docs = [v.split() if isinstance(v, str) else list(v) for v in values]
            new = replace_words(model, tok, docs, allowed, prob, top_k, rng, draw, max_len, batch_size)
            column = pa.array(new if kind in ("token", "span") else [" ".join(d) for d in new],
                              type=table.schema.field(field).type)
            copy = copy.set_column(copy.schema.get_field_index(field), field, column)
        parts.append(copy)
    return pa.concat_tables(parts)


@torch.no_grad()
def replace_words(model, tok, docs: list[list[str]], allowed: torch.Tensor, prob: float, top_k: int,
                  rng: np.random.Generator, draw: torch.Generator, max_len: int,
                  batch_size: int) -> list[list[str]]:
    """Each document's words with a `prob` share of the replaceable ones replaced by draws from
    the MLM's top-k whole-word subwords; `allowed` (V,) marks the subwords a word may become."""
    cls_id, sep_id, mask_id = (tok.token_to_id(t) for t in (CLS, SEP, MASK))
    out = [list(d) for d in docs]
    windows: list[tuple[list[int], list[tuple[int, int, int, int]]]] = []  # ids, (position, doc, word, id)
    for d, enc in enumerate(tok.encode_batch(docs, is_pretokenized=True, add_special_tokens=False)):
        pieces = np.bincount([w for w in enc.word_ids if w is not None], minlength=len(docs[d]))
        ids, masked = list(enc.ids), {}
        for pos, w in enumerate(enc.word_ids):
            if w is not None and pieces[w] == 1 and docs[d][w].isalpha() and bool(allowed[ids[pos]]) \
                    and rng.random() < prob:
                masked[pos] = (w, ids[pos])
                ids[pos] = mask_id
        # Windows of the row's subwords, each [CLS] ... [SEP]: the MLM's own input shape.
        step = max_len - 2
        for start in range(0, len(ids), step):
            spots = [(p - start + 1, d, w, was) for p, (w, was) in masked.items()
                     if start <= p < start + step]
            if spots:
                windows.append(([cls_id, *ids[start:start + step], sep_id], spots))
    for index in length_batches([len(w[0]) for w in windows], batch_size, rng=None):
        T = max(len(windows[i][0]) for i in index)
        ids = torch.zeros(len(index), T, dtype=torch.long)
        real = torch.zeros(len(index), T, dtype=torch.bool)
        for b, i in enumerate(index):
            ids[b, :len(windows[i][0])] = torch.tensor(windows[i][0])
            real[b, :len(windows[i][0])] = True
        spots = [(b, *spot) for b, i in enumerate(index) for spot in windows[i][1]]  # (b, p, d, w, id)
        rows, cols = torch.tensor([s[0] for s in spots]), torch.tensor([s[1] for s in spots])
        hidden = model.encoder(ids, torch.zeros_like(ids), real)  # (B, T, H)
        logits = model.mlm.logits(hidden[rows, cols]).float()  # (N, V)
        logits[:, ~allowed] = float("-inf")
        logits[torch.arange(len(spots)), torch.tensor([s[4] for s in spots])] = float("-inf")  # not the word
        top = logits.topk(top_k, dim=-1)  # (N, k)
        picked = torch.multinomial(top.values.softmax(-1), 1, generator=draw)[:, 0]  # (N,)
        chosen = top.indices[torch.arange(len(spots)), picked]
        for (_, _, d, w, _), token in zip(spots, chosen.tolist(), strict=True):
            out[d][w] = tok.id_to_token(token)
    return out
