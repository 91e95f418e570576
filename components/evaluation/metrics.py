"""Task metrics: pure functions of predictions, shared by the evaluate stage (test split) and by
fine-tuning (validation passes, early stopping).

Classification (and plain tags, each word an example) through scikit-learn; entities of BIO
tag sequences through seqeval, whose default mode follows conlleval (a span counts when its
start, end and type all match). Span tasks may predict nested or overlapping spans, which no tag
sequence can hold: they are scored by the same exact-match rule on sets of (start, end, type).
Heavy imports happen inside the functions.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from components.data.tags import Span, bio_to_spans

if TYPE_CHECKING:
    import pyarrow as pa


def classification_metrics(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str]) -> dict:
    """Accuracy, macro F1 (over all `labels`), multiclass MCC, confusion matrix (rows true,
    columns predicted, `labels` order) and per-class P/R/F1."""
    from sklearn.metrics import confusion_matrix, matthews_corrcoef, precision_recall_fscore_support

    if len(y_true) != len(y_pred):
        raise ValueError(f"{len(y_true)} true labels but {len(y_pred)} predictions")
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate labels in {list(labels)}")
    unknown = (set(y_true) | set(y_pred)) - set(labels)
    if unknown:  # a label outside the map is a bug upstream; dropping it would inflate the scores
        raise ValueError(f"labels not in {list(labels)}: {sorted(unknown)}")
    labels = list(labels)
    matrix = confusion_matrix(y_true, y_pred, labels=labels)
    # zero_division=0: a class never predicted has P = 0; a class asked for but never seen nor
    # predicted scores 0 and still counts in the macro average (a model must not hide it).
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, zero_division=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MCC is undefined for a constant predictor: 0
        mcc = float(matthews_corrcoef(y_true, y_pred)) if len(y_true) else 0.0
    total = int(matrix.sum())
    return {
        "accuracy": int(matrix.trace()) / total if total else 0.0,
        "macro_f1": float(f1.mean()) if labels else 0.0,
        "mcc": mcc,
        "confusion": matrix.tolist(),
        "labels": labels,
        "per_class": {label: {"precision": float(precision[k]), "recall": float(recall[k]),
                              "f1": float(f1[k]), "support": int(support[k])}
                      for k, label in enumerate(labels)},
    }


def tag_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
    """Entity P/R/F1 (micro over all sentences, and per type) of BIO tag sequences, by seqeval."""
    from seqeval.metrics.sequence_labeling import get_entities, precision_recall_fscore_support

    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    gold, pred = [list(s) for s in gold], [list(s) for s in pred]
    # seqeval names the types it reports in sorted order of every type seen on either side.
    types = sorted({t for seq in (gold, pred) for t, _, _ in get_entities(seq)})
    per_type = precision_recall_fscore_support(gold, pred, average=None, zero_division=0)
    micro = precision_recall_fscore_support(gold, pred, average="micro", zero_division=0)
    return {
        "precision": float(micro[0]), "recall": float(micro[1]), "f1": float(micro[2]),
        "support": int(micro[3]), "predicted": len(get_entities(pred)),
        "per_class": {t: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(n)}
                      for t, p, r, f, n in zip(types, *per_type, strict=True)},
    }


def entity_metrics(gold: Sequence[Sequence[Span]], pred: Sequence[Sequence[Span]]) -> dict:
    """Exact-match (start, end, type) micro P/R/F1 over all sentences, and the same per type,
    for span sets that may nest or overlap (what tag_metrics computes for tag sequences)."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    tp, n_gold, n_pred = Counter(), Counter(), Counter()  # per type
    for g_spans, p_spans in zip(gold, pred, strict=True):
        # Sets: a span listed twice is one entity; a repeated prediction must not earn two hits.
        g, p = {tuple(s) for s in g_spans}, {tuple(s) for s in p_spans}
        tp.update(s[2] for s in g & p)
        n_gold.update(s[2] for s in g)
        n_pred.update(s[2] for s in p)
    per_class = {kind: {**_prf(tp[kind], n_pred[kind], n_gold[kind]), "support": n_gold[kind]}
                 for kind in sorted(n_gold.keys() | n_pred.keys())}
    return {**_prf(sum(tp.values()), sum(n_pred.values()), sum(n_gold.values())),
            "support": sum(n_gold.values()), "predicted": sum(n_pred.values()), "per_class": per_class}


def _prf(tp: int, n_pred: int, n_true: int) -> dict[str, float]:
    """Precision, recall, F1 from counts; 0 where a denominator is 0 (as zero_division=0)."""
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_true if n_true else 0.0
    # 2tp/(pred+true) equals 2PR/(P+R) and needs no special case when only one of P, R is 0.
    f1 = 2 * tp / (n_pred + n_true) if n_pred + n_true else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def _check_aligned(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> None:
    """Gold and predicted tags must have the same sentences and words."""
    if len(gold) != len(pred) or any(len(g) != len(p) for g, p in zip(gold, pred, strict=True)):
        raise ValueError("gold and predicted tags differ in sentences or words")


def word_accuracy(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """The share of words whose predicted tag is the gold one, over all sentences."""
    _check_aligned(gold, pred)
    words = sum(len(g) for g in gold)
    hits = sum(a == b for g, p in zip(gold, pred, strict=True) for a, b in zip(g, p, strict=True))
    return hits / words if words else 0.0


def plain_tag_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
                      labels: Sequence[str]) -> dict:
    """Per-word scores of a plain tag set: every word one example of classification_metrics
    (accuracy, macro F1 over the tags, per-tag P/R/F1, confusion)."""
    _check_aligned(gold, pred)
    return classification_metrics([t for s in gold for t in s], [t for s in pred for t in s], labels)


def primary_metric(kind: str, scheme: str = "bio") -> str:
    """What a task is judged on: accuracy for texts and pairs, entity F1 for BIO token and
    span tasks, word accuracy for plain tags."""
    if kind in ("classification", "pair"):
        return "accuracy"
    return "word_accuracy" if scheme == "plain" else "entity_f1"


def score_predictions(kind: str, labels: list[str], gold: pa.Table, predictions: pa.Table,
                      scheme: str = "bio") -> dict:
    """Metrics of one fit's predictions (a table of model.decoding) against a split's gold
    (`labels`: the classes, or the plain tags)."""
    if kind in ("classification", "pair"):
        return classification_metrics(gold["label"].to_pylist(), predictions["pred"].to_pylist(), labels)
    if kind == "token":
        tags, found = gold["tags"].to_pylist(), predictions["pred_tags"].to_pylist()
        if scheme == "plain":
            out = plain_tag_metrics(tags, found, labels)
            return {**out, "word_accuracy": out["accuracy"]}
        out = tag_metrics(tags, found)
        out["word_accuracy"] = word_accuracy(tags, found)
    else:
        out = entity_metrics([bio_to_spans(t) for t in gold["tags"].to_pylist()],
                             [[(s["start"], s["end"], s["label"]) for s in row]
                              for row in predictions["pred_spans"].to_pylist()])
    out["entity_f1"] = out["f1"]
    return out
