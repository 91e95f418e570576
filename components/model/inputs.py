"""Task examples as model input: encoding for each head (the tokenizer of the encoder, words
aligned to subwords for token and span tasks), and padding into batches of similar length.

What fine-tuning trains on and what a served model reads go through these same functions, so
a served model answers exactly as it was scored. Shapes: B batch, T subword positions, W words,
S enumerated spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from components.data.tags import bio_to_spans
from components.data.tokenizer import UNK
from components.model.config import IGNORE

NULL = "NULL"  # span label of a span that is no entity


@dataclass
class Encoded:
    """One example as model input: subword ids, segments, and what the task's loss needs."""

    ids: list[int]
    types: list[int]
    label: int = IGNORE  # classification and pair
    token_labels: list[int] = field(default_factory=list)  # token: per subword (IGNORE where none)
    word_first: list[int] = field(default_factory=list)  # token/span: first subword of each word, -1 if cut
    word_last: list[int] = field(default_factory=list)  # span: last subword of each word
    spans: list[tuple[int, int]] = field(default_factory=list)  # span: enumerated (first, last word)
    span_labels: list[int] = field(default_factory=list)  # span: 0 = NULL, 1.. = label
    doc: int = -1  # long_text chunks: the row this window belongs to (-1: the example is its row)
    soft: np.ndarray | None = None  # distillation: the teacher's log-probs, (C,), (W, C) or (S, C); NaN: none
    gold: bool = True  # distillation: False for a row whose labels are not its own (an augmented copy)


def label_space(kind: str, labels: list[str], scheme: str = "bio") -> list[str]:
    """What the head predicts: the labels (plain tags too), BIO tags of the entity types, or
    NULL + types. Its first entry is what a token model gives a word cut by truncation."""
    if kind == "token" and scheme != "plain":
        return ["O"] + [f"{p}-{t}" for t in labels for p in ("B", "I")]
    if kind == "span":
        return [NULL, *labels]
    return list(labels)


def fit_length(ids: list[int], max_len: int, long_text: str) -> list[int]:
    """[CLS] body [SEP] cut to max_len: keep the head, or the head (1/4) and the tail (3/4), which
    for long documents keeps the conclusion (Sun et al., 2019)."""
    if len(ids) <= max_len:
        return ids
    body, keep = ids[1:-1], max_len - 2
    if long_text == "head_tail":
        head = keep // 4
        body = body[:head] + body[len(body) - (keep - head):]
    else:
        body = body[:keep]
    return [ids[0], *body, ids[-1]]


def windows(ids: list[int], max_len: int, overlap: int) -> list[list[int]]:
    """[CLS] body [SEP] as windows of at most max_len covering the whole body, consecutive ones
    sharing `overlap` subwords; the last window ends with the body (a full window, not a scrap)."""
    if len(ids) <= max_len:
        return [ids]
    body, keep = ids[1:-1], max_len - 2
    stride = max(1, keep - overlap)  # params check overlap < keep; an encoder's max_position may cut keep
    starts = [*range(0, len(body) - keep, stride), len(body) - keep]
    return [[ids[0], *body[s:s + keep], ids[-1]] for s in starts]


def enumerate_spans(n_words: int, max_words: int) -> list[tuple[int, int]]:
    """Every (first, last) word span of at most max_words words: sum over w of (n - w + 1)."""
    return [(i, j) for i in range(n_words) for j in range(i, min(n_words, i + max_words))]


def align_words(word_ids: list[int | None], n_words: int) -> tuple[list[int], list[int]]:
    """First and last subword position of each word (-1 for words cut by truncation)."""
    first, last = [-1] * n_words, [-1] * n_words
    for pos, w in enumerate(word_ids):
        if w is None:
            continue
        if first[w] < 0:
            first[w] = pos
        last[w] = pos
    return first, last


def encode(table: pa.Table, kind: str, tokenizer, labels: list[str], max_len: int,
           long_text: str = "truncate", label_subwords: str = "all",
           max_span_words: int = 8, scheme: str = "bio", chunk_overlap: int = 0) -> list[Encoded]:
    """Encode a split of task data (components.data.tasks columns) for the task's head; with
    long_text chunks a classification row becomes one example per window (`doc`: its row)."""
    space = {name: i for i, name in enumerate(label_space(kind, labels, scheme))}
    tok = tokenizer  # configured (truncation) per kind below
    if kind == "classification":
        tok.no_truncation()  # cut by fit_length or windows, which keep more than the head
        encs = tok.encode_batch(table["text"].to_pylist())
        gold = table["label"].to_pylist()
        if long_text == "chunks":
            return [Encoded(w, [0] * len(w), space[lab], doc=row)
                    for row, (e, lab) in enumerate(zip(encs, gold, strict=True))
                    for w in windows(e.ids, max_len, chunk_overlap)]
        return [Encoded(fit_length(e.ids, max_len, long_text), [0] * min(len(e.ids), max_len),
                        space[lab]) for e, lab in zip(encs, gold, strict=True)]
    tok.enable_truncation(max_len, strategy="longest_first")
    if kind == "pair":
        pairs = list(zip(table["text_a"].to_pylist(), table["text_b"].to_pylist(), strict=True))
        encs = tok.encode_batch(pairs)
        return [Encoded(e.ids, e.type_ids, space[lab])
                for e, lab in zip(encs, table["label"].to_pylist(), strict=True)]
    words, tags = table["tokens"].to_pylist(), table["tags"].to_pylist()
    encs = [_every_word_a_piece(tok, e, ws) for e, ws in
            zip(tok.encode_batch(words, is_pretokenized=True), words, strict=True)]
    out = []
    for e, ws, ts in zip(encs, words, tags, strict=True):
        first, last = align_words(e.word_ids, len(ws))
        ex = Encoded(e.ids, e.type_ids, word_first=first, word_last=last)
        if kind == "token":
            ex.token_labels = token_labels(e.word_ids, [space[t] for t in ts], label_subwords)
        else:
            gold = {(s, end - 1): space[t] for s, end, t in bio_to_spans(ts)}
            kept = sum(1 for f in first if f >= 0)  # words that survived truncation
            ex.spans = enumerate_spans(kept, max_span_words)
            ex.span_labels = [gold.get(s, 0) for s in ex.spans]
        out.append(ex)
    return out


def _every_word_a_piece(tok, enc, words: list[str]):
    """The encoding with every word before the truncation point owning at least one subword:
    a word the normaliser erases (a zero-width space, a soft hyphen) becomes [UNK], so word i's
    subwords never stand in for word i + 1's."""
    seen = {w for w in enc.word_ids if w is not None}
    last = max(seen, default=-1)
    if len(seen) == last + 1:
        return enc
    return tok.encode([w if i in seen or i > last else UNK for i, w in enumerate(words)],
                      is_pretokenized=True)


def token_labels(word_ids: list[int | None], word_tags: list[int], label_subwords: str) -> list[int]:
    """Per-subword training labels: every subword carries its word's tag (`all`, as in the BERT
    literature) or only the first one does (`first`); specials carry none."""
    labels, previous = [], None
    for w in word_ids:
        if w is None or (label_subwords == "first" and w == previous):
            labels.append(IGNORE)
        else:
            labels.append(word_tags[w])
        previous = w
    return labels


def collate(examples: list[Encoded], kind: str) -> dict[str, torch.Tensor]:
    """Pad a list of examples to their longest; add what the kind's loss and decoding need."""
    B, T = len(examples), max(len(e.ids) for e in examples)
    ids = torch.zeros(B, T, dtype=torch.long)
    types = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, e in enumerate(examples):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        types[i, :len(e.types)] = torch.tensor(e.types)
        mask[i, :len(e.ids)] = True
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if kind in ("classification", "pair"):
        batch["labels"] = torch.tensor([e.label for e in examples])
    if kind == "token":
        labels = torch.full((B, T), IGNORE, dtype=torch.long)
        for i, e in enumerate(examples):
            labels[i, :len(e.token_labels)] = torch.tensor(e.token_labels)
        batch["labels"] = labels
    if kind in ("token", "span"):
        W = max(1, max(len(e.word_first) for e in examples))
        first = torch.full((B, W), -1, dtype=torch.long)
        for i, e in enumerate(examples):
            first[i, :len(e.word_first)] = torch.tensor(e.word_first, dtype=torch.long)
        batch["word_first"] = first  # (B, W)
    if kind == "span":
        S = max(1, max(len(e.spans) for e in examples))
        start = torch.zeros(B, S, dtype=torch.long)
        end = torch.zeros(B, S, dtype=torch.long)
        width = torch.zeros(B, S, dtype=torch.long)
        labels = torch.full((B, S), IGNORE, dtype=torch.long)
        for i, e in enumerate(examples):
            if not e.spans:
                continue
            sp = torch.tensor(e.spans)  # (S_i, 2) first and last word
            start[i, :len(sp)] = torch.tensor([e.word_first[a] for a, _ in e.spans])
            end[i, :len(sp)] = torch.tensor([e.word_last[b] for _, b in e.spans])
            width[i, :len(sp)] = sp[:, 1] - sp[:, 0]
            labels[i, :len(sp)] = torch.tensor(e.span_labels)
        batch.update(span_start=start, span_end=end, span_width=width, span_labels=labels)
    if examples[0].soft is not None:
        batch.update(_soft(examples))
    return batch


def _soft(examples: list[Encoded]) -> dict[str, torch.Tensor]:
    """The teacher's targets padded to the batch: `soft` (B, C), (B, W, C) or (B, S, C), NaN
    where there is none, and `gold` (B,), the rows whose labels are their own."""
    first = examples[0].soft
    if first.ndim == 1:
        soft = torch.from_numpy(np.stack([e.soft for e in examples]))
    else:
        longest = max(1, *(len(e.soft) for e in examples))
        soft = torch.full((len(examples), longest, first.shape[-1]), float("nan"))
        for i, e in enumerate(examples):
            soft[i, :len(e.soft)] = torch.from_numpy(e.soft)
    return {"soft": soft, "gold": torch.tensor([e.gold for e in examples])}


def length_batches(lengths: list[int], batch_size: int, rng: np.random.Generator | None) -> list[list[int]]:
    """Batches of similar length (little padding): sort within chunks of 50 batches, then
    shuffle the batches. No rng: one sorted pass (evaluation)."""
    order = np.arange(len(lengths)) if rng is None else rng.permutation(len(lengths))
    chunk = batch_size * 50
    batches = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c:c + chunk], key=lambda i: lengths[i])
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return [[int(i) for i in b] for b in batches]
