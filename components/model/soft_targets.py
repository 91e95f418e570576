"""A teacher's soft targets for distillation, in units no tokenizer owns: a distribution per row
(classification, pairs), per word (token tasks) and per enumerated word span (span tasks), as
log-probabilities. The teacher and the student tokenize differently; words and word spans are
what both see. `teacher_targets` computes them with the teacher; `attach_targets` lays them on
the student's encoded examples. Shapes: B batch, C labels, W words, S enumerated spans.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from components.model.config import IGNORE
from components.model.decoding import SPAN_INPUTS, word_emissions
from components.model.inputs import Encoded, collate, enumerate_spans, length_batches


@torch.no_grad()
def teacher_targets(model, kind: str, examples: list[Encoded], batch_size: int) -> list[np.ndarray]:
    """Per row (an example, or a long text's windows), float32 log-probabilities: (C,) for
    classification and pairs (of the mean of the windows' logits, as prediction averages them);
    (W_kept, C) per word the teacher saw, for token tasks (a CRF's marginals, else the first
    subword's softmax); (S, 1 + labels) per enumerated span for span tasks."""
    model.eval()
    device = next(itertools.chain(model.parameters(), model.buffers())).device
    out: list = [None] * len(examples)
    for index in length_batches([len(e.ids) for e in examples], batch_size, rng=None):
        batch = {k: v.to(device) for k, v in collate([examples[i] for i in index], kind).items()}
        inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
        if kind in ("classification", "pair"):
            rows = list(model(**inputs).float().cpu())  # (C,) logits each
        elif kind == "token":
            per_word, kept = word_emissions(model(**inputs).float().cpu(), batch["word_first"].cpu())
            crf = getattr(model, "crf", None)
            logp = crf.log_marginals(per_word, kept) if crf is not None else per_word.log_softmax(-1)
            rows = [p[m] for p, m in zip(logp, kept, strict=True)]  # (W_kept, C) each
        else:
            logits = model(**inputs, **{k: batch[k] for k in SPAN_INPUTS}).float().cpu()
            rows = [lg[: len(examples[i].spans)].log_softmax(-1) for lg, i in zip(logits, index, strict=True)]
        for i, row in zip(index, rows, strict=True):
            out[i] = row
    if kind not in ("classification", "pair"):
        return [r.numpy() for r in out]
    by_row: dict[int, list[torch.Tensor]] = {}
    for i, (e, row) in enumerate(zip(examples, out, strict=True)):
        by_row.setdefault(e.doc if e.doc >= 0 else i, []).append(row)
    return [torch.stack(r).mean(0).log_softmax(-1).numpy() for r in by_row.values()]


def attach_targets(examples: list[Encoded], kind: str, targets: list[np.ndarray], gold: list[bool],
                   max_span_words: int) -> None:
    """Give each of the student's examples its row's soft targets, laid on the student's own
    structure (NaN where the teacher saw no such word or span: truncation differs), and drop the
    gold labels of rows that have none (the teacher's augmented copies: their labels are the
    source row's, not theirs)."""
    for i, e in enumerate(examples):
        row = e.doc if e.doc >= 0 else i
        t = np.asarray(targets[row], dtype=np.float32)
        if kind in ("classification", "pair"):
            e.soft = t
        elif kind == "token":
            e.soft = np.full((len(e.word_first), t.shape[-1]), np.nan, dtype=np.float32)
            n = min(len(t), len(e.word_first))
            e.soft[:n] = t[:n]
        else:
            seen = {s: k for k, s in enumerate(enumerate_spans(_words_of(len(t), max_span_words),
                                                                max_span_words))}
            e.soft = np.full((len(e.spans), t.shape[-1]), np.nan, dtype=np.float32)
            for k, s in enumerate(e.spans):
                if s in seen:
                    e.soft[k] = t[seen[s]]
        if not gold[row]:
            e.label = IGNORE
            e.token_labels = [IGNORE] * len(e.token_labels)
            e.span_labels = [IGNORE] * len(e.span_labels)
            e.gold = False


def _words_of(spans: int, max_span_words: int) -> int:
    """The word count whose enumeration has `spans` spans: word n adds min(n, max_span_words)."""
    n = total = 0
    while total < spans:
        n += 1
        total += min(n, max_span_words)
    if total != spans:
        raise ValueError(f"{spans} spans: no sentence enumerates that many (of <= {max_span_words} words)")
    return n
