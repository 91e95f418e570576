"""Model outputs to predictions: labels with scores, word-level tags (argmax or a CRF's
Viterbi path), scored spans (nested, or greedy without overlap), and the predictions table that
evaluation scores. Shapes: B batch, T subword positions, C labels, W words, S spans.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
import torch

from components.model.config import IGNORE
from components.model.heads import viterbi
from components.model.inputs import Encoded, collate, length_batches

SPAN_INPUTS = ("span_start", "span_end", "span_width")


def word_emissions(emissions: torch.Tensor, word_first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first subword's emissions of each word: (B, W, C), and the mask of kept words (B, W)
    (words cut by truncation and padding have word_first -1, and come last in each row)."""
    rows = torch.arange(emissions.shape[0])[:, None]
    return emissions[rows, word_first.clamp(min=0)], word_first >= 0


def bio_forbidden(space: list[str]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """What no BIO reader accepts, as Viterbi score offsets: (start (C,), transitions (C from,
    C to)), -inf where a sequence may not start with a tag (I-X) or a tag may not follow another
    (I-X after anything but B-X or I-X), 0 elsewhere; None if `space` is not BIO tags."""
    if not all(t == "O" or t[:2] in ("B-", "I-") for t in space) or not any(t[:2] == "I-" for t in space):
        return None
    inside = torch.tensor([t[:2] == "I-" for t in space])  # (C,)
    kind = [t[2:] for t in space]
    follows = torch.tensor([[t != "O" and kind[a] == kind[b] for b in range(len(space))]
                            for a, t in enumerate(space)])  # (C from, C to): same entity type
    no = torch.tensor(float("-inf"))
    return (torch.where(inside, no, 0.0), torch.where(inside[None, :] & ~follows, no, 0.0))


def word_tags(emissions: torch.Tensor, word_first: torch.Tensor, n_words: list[int],
              space: list[str], crf=None, tag_decoding: str = "free") -> list[list[str]]:
    """Word-level tags from the first subword's emissions of each word: with `tag_decoding`
    `valid` (and BIO tags) the best sequence a BIO reader accepts (constrained Viterbi over the
    CRF's scores, or over the words' log-probabilities without one), with `free` the CRF's
    Viterbi path or each word's argmax. Words cut by truncation get the space's first tag (O;
    plain tags: the most frequent in train)."""
    # On the CPU whatever the model's device: a loop over words, cheap next to the encoder.
    per_word, kept = word_emissions(emissions.float().cpu(), word_first.cpu())  # (B, W, C), (B, W)
    forbidden = bio_forbidden(space) if tag_decoding == "valid" else None
    if crf is not None:
        paths = crf.viterbi(per_word, kept, forbidden)
    elif forbidden is not None:
        zero = torch.zeros(len(space))
        paths = viterbi(per_word.log_softmax(-1), kept, forbidden[0], forbidden[1], zero)
    else:
        paths = [row[m].tolist() for row, m in zip(per_word.argmax(-1), kept, strict=True)]
    return [[space[t] for t in path] + [space[0]] * (n - len(path))
            for path, n in zip(paths, n_words, strict=True)]


ScoredSpan = tuple[int, int, str, float]  # first word, end word (exclusive), label, score


def pick_spans(candidates: list[ScoredSpan], decoding: str) -> list[ScoredSpan]:
    """`nested`: every candidate; `greedy`: by descending score, those overlapping no kept span.
    Spans are (first word, end word exclusive, label, score)."""
    if decoding == "nested":
        return sorted(candidates)
    kept: list[ScoredSpan] = []
    for c in sorted(candidates, key=lambda c: -c[3]):
        if all(c[1] <= k[0] or k[1] <= c[0] for k in kept):
            kept.append(c)
    return sorted(kept)


@torch.no_grad()
def predict(model, kind: str, examples: list[Encoded], space: list[str], batch_size: int,
            span_decoding: str = "nested", threshold: float | None = None,
            tag_decoding: str = "free") -> list:
    """Predictions in example order: (label, score) for classification and pairs, word-level
    tags for token tasks, [(first word, end word exclusive, label, score)] for spans. Windows of
    one row (long_text chunks) give one prediction, from the mean of their logits.

    Span candidates are the spans whose argmax is not NULL or, with a threshold, whose best
    label's probability reaches it."""
    model.eval()
    # validation runs outside Lightning's batch transfer; an ONNX head keeps a buffer on its device
    device = next(itertools.chain(model.parameters(), model.buffers())).device
    out: list = [None] * len(examples)
    for index in length_batches([len(e.ids) for e in examples], batch_size, rng=None):
        batch = {k: v.to(device) for k, v in collate([examples[i] for i in index], kind).items()}
        inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
        if kind in ("classification", "pair"):
            rows = list(model(**inputs).float().cpu())  # B logit vectors (C,)
        elif kind == "token":
            n_words = [len(examples[i].word_first) for i in index]
            rows = word_tags(model(**inputs), batch["word_first"], n_words, space, model.crf, tag_decoding)
        else:
            probs = torch.softmax(model(**inputs, **{k: batch[k] for k in SPAN_INPUTS}), dim=-1)
            best_p, best_c = probs[..., 1:].max(-1)  # (B, S): best non-NULL label, its probability
            keep = (probs.argmax(-1) != 0) if threshold is None else best_p >= threshold
            keep &= batch["span_labels"] != IGNORE
            rows = []
            for b, i in enumerate(index):
                spans = examples[i].spans
                rows.append(pick_spans([(spans[s][0], spans[s][1] + 1, space[int(best_c[b, s]) + 1],
                                         float(best_p[b, s])) for s in keep[b].nonzero()[:, 0].tolist()],
                                       span_decoding))
        for i, row in zip(index, rows, strict=True):
            out[i] = row
    return labels_of(out, examples, space) if kind in ("classification", "pair") else out


def labels_of(logits: list[torch.Tensor], examples: list[Encoded],
              space: list[str]) -> list[tuple[str, float]]:
    """(label, probability) per row: the softmax of its example's logits, or of the mean of its
    windows' logits (examples with the same `doc`, which are consecutive)."""
    rows: dict[int, list[torch.Tensor]] = {}
    for i, (e, row) in enumerate(zip(examples, logits, strict=True)):
        rows.setdefault(e.doc if e.doc >= 0 else i, []).append(row)
    if not rows:
        return []
    probs = torch.softmax(torch.stack([torch.stack(r).mean(0) for r in rows.values()]), dim=-1)  # (rows, C)
    score, label = probs.max(-1)
    return [(space[int(c)], float(s)) for c, s in zip(label, score, strict=True)]


def predictions_table(kind: str, predictions: list) -> pa.Table:
    """Predictions of one fit, one row per example in split order (what evaluate@task reads)."""
    if kind in ("classification", "pair"):
        table = pa.table({"pred": [p[0] for p in predictions], "score": [p[1] for p in predictions]})
    elif kind == "token":
        table = pa.table({"pred_tags": predictions})
    else:
        spans = [[{"start": a, "end": b, "label": lab, "score": s} for a, b, lab, s in row]
                 for row in predictions]
        table = pa.table({"pred_spans": pa.array(spans, type=pa.list_(pa.struct(
            [("start", pa.int32()), ("end", pa.int32()), ("label", pa.string()), ("score", pa.float32())])))})
    return table
