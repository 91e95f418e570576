"""Stage `evaluate`: task metrics, the pretrained-vs-scratch transfer table, and plots.

The metrics are written out in numpy (no sklearn) so each one can be checked by hand; the tests
cross-check them against sklearn. Entity metrics follow conlleval: a span counts only when its
start, end and type all match. The heavy imports (matplotlib, sklearn) happen inside the
functions that need them, so importing this module stays cheap.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from components.io import atomic_file

if TYPE_CHECKING:
    import pyarrow as pa

    from components.config import EvaluateConfig, TaskConfig

Span = tuple[int, int, str]  # (start word, end word exclusive, type)

NO_VALUE = "—"  # table cell when there is nothing to compare against


# --------------------------------------------------------------------------- BIO tags and spans


def _split_tag(tag: str) -> tuple[str, str]:
    """("B"|"I"|"O", type) of one BIO tag; a malformed tag is an error, not a silent O."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I") or not kind:
        raise ValueError(f"not a BIO tag: {tag!r}")
    return prefix, kind


def bio_to_spans(tags: Sequence[str]) -> list[Span]:
    """Entities of a BIO tag sequence with conlleval's rules (I-X after O or another type starts one)."""
    spans: list[Span] = []
    start, current = -1, ""  # the open entity, if start >= 0
    for i, tag in enumerate(tags):
        prefix, kind = _split_tag(tag)
        # conlleval: a chunk ends before O, before any B, and before an I of another type.
        if start >= 0 and (prefix != "I" or kind != current):
            spans.append((start, i, current))
            start = -1
        # ... and starts at any B, and at an I that does not continue the open chunk (IOB1-style).
        if prefix != "O" and start < 0:
            start, current = i, kind
    if start >= 0:
        spans.append((start, len(tags), current))
    return spans


def spans_to_bio(spans: Sequence[Span], n: int) -> list[str]:
    """BIO2 tags of `n` words for non-overlapping spans (every entity begins with B-)."""
    tags = ["O"] * n
    for start, end, kind in sorted(spans):
        if not 0 <= start < end <= n:
            raise ValueError(f"span {(start, end, kind)} outside 0..{n} or empty")
        if any(t != "O" for t in tags[start:end]):
            raise ValueError(f"span {(start, end, kind)} overlaps another span")
        tags[start] = f"B-{kind}"
        tags[start + 1:end] = [f"I-{kind}"] * (end - start - 1)
    return tags


# --------------------------------------------------------------------------- metrics


def _prf(tp: int, n_pred: int, n_true: int) -> tuple[float, float, float]:
    """Precision, recall, F1 from counts; 0 where a denominator is 0 (sklearn's zero_division=0)."""
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_true if n_true else 0.0
    # 2tp/(pred+true) equals 2PR/(P+R) and needs no special case when only one of P, R is 0.
    f1 = 2 * tp / (n_pred + n_true) if n_pred + n_true else 0.0
    return precision, recall, f1


def confusion_matrix(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str]) -> np.ndarray:
    """Counts (K, K): rows are true labels, columns predicted labels, both in `labels` order."""
    if len(y_true) != len(y_pred):
        raise ValueError(f"{len(y_true)} true labels but {len(y_pred)} predictions")
    index = {label: k for k, label in enumerate(labels)}
    if len(index) != len(labels):
        raise ValueError(f"duplicate labels in {list(labels)}")
    unknown = (set(y_true) | set(y_pred)) - index.keys()
    if unknown:  # a label outside the map is a bug upstream; dropping it would inflate the scores
        raise ValueError(f"labels not in {list(labels)}: {sorted(unknown)}")
    matrix = np.zeros((len(labels), len(labels)), dtype=np.int64)
    np.add.at(matrix, ([index[y] for y in y_true], [index[y] for y in y_pred]), 1)
    return matrix


def mcc_from_confusion(matrix: np.ndarray) -> float:
    """Multiclass Matthews correlation (Gorodkin 2004); 0 when it is undefined, as in sklearn."""
    # With t_k = row sums (true), p_k = column sums (pred), c = trace, s = total:
    #   MCC = (c*s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2))
    # Python ints keep the products exact (no int64 overflow on big test sets).
    t = [int(x) for x in matrix.sum(axis=1)]
    p = [int(x) for x in matrix.sum(axis=0)]
    c, s = int(np.trace(matrix)), int(matrix.sum())
    numerator = c * s - sum(pk * tk for pk, tk in zip(p, t, strict=True))
    denominator = (s * s - sum(pk * pk for pk in p)) * (s * s - sum(tk * tk for tk in t))
    return numerator / math.sqrt(denominator) if denominator else 0.0


def classification_metrics(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str]) -> dict:
    """Accuracy, macro F1 (over all `labels`), multiclass MCC, confusion matrix and per-class P/R/F1."""
    matrix = confusion_matrix(y_true, y_pred, labels)
    tp, n_pred, n_true = np.diag(matrix), matrix.sum(axis=0), matrix.sum(axis=1)
    per_class = {}
    for k, label in enumerate(labels):
        precision, recall, f1 = _prf(int(tp[k]), int(n_pred[k]), int(n_true[k]))
        per_class[label] = {"precision": precision, "recall": recall, "f1": f1, "support": int(n_true[k])}
    total = int(matrix.sum())
    return {
        "accuracy": int(tp.sum()) / total if total else 0.0,
        # Macro over every label asked for (a class never seen nor predicted scores 0), as sklearn
        # does with `labels=`: a model that never predicts a rare class must not hide it.
        "macro_f1": float(np.mean([m["f1"] for m in per_class.values()])) if labels else 0.0,
        "mcc": mcc_from_confusion(matrix),
        "confusion": matrix.tolist(),
        "labels": list(labels),
        "per_class": per_class,
    }


def entity_metrics(gold: Sequence[Sequence[Span]], pred: Sequence[Sequence[Span]]) -> dict:
    """Exact-match (start, end, type) micro P/R/F1 over all sentences, and the same per type."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    tp, n_gold, n_pred = Counter(), Counter(), Counter()  # per type
    for g_spans, p_spans in zip(gold, pred, strict=True):
        # Sets: a span listed twice is one entity; a repeated prediction must not earn two hits.
        g, p = {tuple(s) for s in g_spans}, {tuple(s) for s in p_spans}
        tp.update(s[2] for s in g & p)
        n_gold.update(s[2] for s in g)
        n_pred.update(s[2] for s in p)
    per_class = {}
    for kind in sorted(n_gold.keys() | n_pred.keys()):
        precision, recall, f1 = _prf(tp[kind], n_pred[kind], n_gold[kind])
        per_class[kind] = {"precision": precision, "recall": recall, "f1": f1, "support": n_gold[kind]}
    precision, recall, f1 = _prf(sum(tp.values()), sum(n_pred.values()), sum(n_gold.values()))
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "support": sum(n_gold.values()),
        "predicted": sum(n_pred.values()),
        "per_class": per_class,
    }


# --------------------------------------------------------------------------- baseline


def tfidf_baseline(train_texts: Sequence[str], train_labels: Sequence[str], test_texts: Sequence[str],
                   seed: int) -> list[str]:
    """Predicted labels of TF-IDF (word 1-2 grams, sublinear tf) + logistic regression."""
    if len(train_texts) != len(train_labels):
        raise ValueError(f"{len(train_texts)} texts but {len(train_labels)} labels")
    classes = sorted(set(train_labels))
    if len(classes) == 1:  # LogisticRegression refuses one class; the only sensible answer is it
        return [classes[0]] * len(test_texts)
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
    features = vectorizer.fit_transform(list(train_texts))
    # C=10: weak regularisation suits the small, sparse task sets; lbfgs is deterministic, and
    # the seed only matters if the solver ever changes to a stochastic one.
    model = LogisticRegression(C=10.0, max_iter=1000, random_state=seed)
    model.fit(features, list(train_labels))
    if not len(test_texts):
        return []
    return [str(y) for y in model.predict(vectorizer.transform(list(test_texts)))]


# --------------------------------------------------------------------------- seeds and the table


def summarize(values: Sequence[float]) -> dict:
    """Mean and sample std (ddof=1; 0 for a single value) of a metric over seeds."""
    if not len(values):
        raise ValueError("nothing to summarize")
    array = np.asarray(values, dtype=float)
    return {
        "mean": float(array.mean()),
        "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
        "n": len(array),
        "values": [float(v) for v in array],
    }


def _outcome(better: dict, worse: dict) -> str:
    """'helps' if the mean gain exceeds the larger seed std, 'hurts' if the loss does, else
    'within seed spread'."""
    gain = better["mean"] - worse["mean"]
    spread = max(better["std"], worse["std"])
    return "helps" if gain > spread else "hurts" if -gain > spread else "within seed spread"


def verdict(pretrained: dict, scratch: dict | None) -> str:
    """Whether the pretrained-minus-scratch gain exceeds the seed spread of either side."""
    if scratch is None:
        return NO_VALUE
    outcome = _outcome(pretrained, scratch)
    text = outcome if outcome == "within seed spread" else f"pretraining {outcome}"
    if min(pretrained["n"], scratch["n"]) < 2:  # std 0 by convention, not measured
        text += " (single seed: spread unknown)"
    return text


def verdicts(row: dict) -> str:
    """The verdict on pretraining; with a checkpoint arm, also on what continued pretraining
    added to the checkpoint as is."""
    text = verdict(row["pretrained"], row.get("scratch"))
    if row.get("checkpoint"):
        text += f"; continued pretraining {_outcome(row['pretrained'], row['checkpoint'])}"
    return text


def _pct(summary: dict) -> str:
    return f"{100 * summary['mean']:.1f} ± {100 * summary['std']:.1f}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")  # a pipe in a task name would split the row


ARMS = {"pretrained": "pretrained", "checkpoint": "checkpoint as is", "scratch": "from scratch"}


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown pipe table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def transfer_table(rows: list[dict]) -> str:
    """The transfer table in Markdown (see `transfer_cells`)."""
    return markdown(*transfer_cells(rows))


def _arms(rows: list[dict]) -> list[str]:
    """The inits any of the rows measured, in `ARMS` order."""
    return [a for a in ARMS if any(row.get(a) for row in rows)]


def transfer_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and cells per task: each init's score (`ARMS` order; pretrained always), the gain
    of pretraining over scratch, what continued pretraining added to the checkpoint, TF-IDF,
    and a verdict."""
    arms = _arms(rows)
    gains = [(title, other) for title, other in (("gain", "scratch"), ("vs checkpoint", "checkpoint"))
             if other in arms]
    header = ["task", "kind", "metric", *(ARMS[a] for a in arms), *(g for g, _ in gains),
              "TF-IDF + LR", "verdict"]
    cells = []
    for row in rows:
        pretrained, tfidf = row["pretrained"], row.get("tfidf")
        cells.append([row["task"], row["kind"], row["metric"],
                      *(_pct(row[a]) if row.get(a) else NO_VALUE for a in arms),
                      *(f"{100 * (pretrained['mean'] - row[other]['mean']):+.1f}" if row.get(other)
                        else NO_VALUE for _, other in gains),
                      NO_VALUE if tfidf is None else f"{100 * tfidf:.1f}",
                      verdicts(row)])
    return header, cells


def arm_minutes(finetune_stats: Path) -> dict[str, dict]:
    """Wall minutes of one fine-tuning run, per init over its seeds, from a task's
    finetune_stats.json (runs named INIT-sSEED); empty if the file is not there."""
    import json

    if not Path(finetune_stats).exists():
        return {}
    by_init: dict[str, list[float]] = {}
    for run, stats in json.loads(Path(finetune_stats).read_text())["runs"].items():
        by_init.setdefault(run.rsplit("-s", 1)[0], []).append(stats["minutes"])
    return {init: summarize(minutes) for init, minutes in sorted(by_init.items())}


def cost_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and cells per task: the minutes one fine-tuning run of each init took, mean ± std
    over seeds; pretraining, paid once for all tasks, is in the pretrain stage's stats."""
    arms = _arms(rows)
    cells = [[row["task"], *(f"{m['mean']:.1f} ± {m['std']:.1f}" if (m := row["minutes"].get(a))
                             else NO_VALUE for a in arms)]
             for row in rows if row.get("minutes")]
    return ["task", *(ARMS[a] for a in arms)], cells


# ------------------------------------------------------- plots (CSV for DVC, PNG for people)


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    """CSV through the csv module (labels may hold commas or quotes), written atomically."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    with atomic_file(path) as tmp:
        tmp.write_text(buffer.getvalue(), encoding="utf-8")


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _pyplot():
    """pyplot on the Agg backend (no display on servers and in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, png: Path) -> None:
    with atomic_file(png) as tmp:
        fig.savefig(tmp, dpi=100)


def write_confusion(metrics: dict, png: Path, csv: Path) -> None:
    """Confusion matrix as CSV (actual,predicted,count; one row per cell) and an annotated heatmap."""
    labels, matrix = metrics["labels"], np.asarray(metrics["confusion"], dtype=np.int64)
    _write_csv(csv, ["actual", "predicted", "count"],
               [[a, p, int(matrix[i, j])] for i, a in enumerate(labels) for j, p in enumerate(labels)])
    plt = _pyplot()
    size = max(4.0, 0.6 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="predicted", ylabel="actual")
    top = matrix.max() if matrix.size else 0
    for i in range(len(labels)):
        for j in range(len(labels)):  # dark cells get white text so the count stays readable
            ax.text(j, i, str(matrix[i, j]), ha="center", va="center",
                    color="white" if top and matrix[i, j] > top / 2 else "black")
    fig.tight_layout()
    _save(fig, png)
    plt.close(fig)


def write_per_class(per_class: dict, png: Path, csv: Path) -> None:
    """Per-class precision/recall/F1/support as CSV, and a bar chart of F1."""
    labels = list(per_class)
    _write_csv(csv, ["label", "precision", "recall", "f1", "support"],
               [[k, _num(m["precision"]), _num(m["recall"]), _num(m["f1"]), int(m["support"])]
                for k, m in per_class.items()])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(labels) + 2), 4))
    ax.bar(range(len(labels)), [per_class[k]["f1"] for k in labels])
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set(ylabel="F1", ylim=(0, 1))
    fig.tight_layout()
    _save(fig, png)
    plt.close(fig)


def write_curves(histories: dict[str, list[dict]], png: Path, csv: Path) -> None:
    """Validation curves of several runs: long-format CSV and one line per run vs step."""
    columns = ["step", "epoch", "val_metric", "train_loss"]
    _write_csv(csv, ["run", *columns],
               [[run, int(h["step"]), *(_num(h.get(c)) for c in columns[1:])]
                for run, history in histories.items() for h in history])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for run, history in histories.items():
        points = [(h["step"], h["val_metric"]) for h in history if h.get("val_metric") is not None]
        # Runs from scratch dashed, so the pretrained/scratch pairs read apart at a glance.
        ax.plot([s for s, _ in points], [v for _, v in points], marker="o", label=run,
                linestyle="--" if "scratch" in run else "-")
    ax.set(xlabel="fine-tuning step", ylabel="validation metric")
    if histories:
        ax.legend(fontsize="small")
    fig.tight_layout()
    _save(fig, png)
    plt.close(fig)


# ------------------------------------------------------------------------------- the stages


def primary_metric(kind: str) -> str:
    """What a task is judged on: accuracy for texts and pairs, entity F1 for token and span."""
    return "accuracy" if kind in ("classification", "pair") else "entity_f1"


def score_run(kind: str, labels: list[str], test: pa.Table, predictions: pa.Table) -> dict:
    """Metrics of one run's test predictions (pyarrow tables from tasks and finetune)."""
    if kind in ("classification", "pair"):
        return classification_metrics(test["label"].to_pylist(), predictions["pred"].to_pylist(), labels)
    gold = [bio_to_spans(t) for t in test["tags"].to_pylist()]
    if kind == "token":
        found = [bio_to_spans(t) for t in predictions["pred_tags"].to_pylist()]
    else:
        found = [[(s["start"], s["end"], s["label"]) for s in row]
                 for row in predictions["pred_spans"].to_pylist()]
    out = entity_metrics(gold, found)
    out["entity_f1"] = out["f1"]
    return out


def _texts(table: pa.Table, kind: str) -> list[str]:
    if kind == "pair":
        return [f"{a} [SEP] {b}" for a, b in zip(table["text_a"].to_pylist(), table["text_b"].to_pylist(),
                                                   strict=True)]
    return table["text"].to_pylist()


def evaluate_task(name: str, task: TaskConfig, cfg: EvaluateConfig, task_dir: Path, model_dir: Path,
                  out_dir: Path) -> dict:
    """Score every fine-tuning run of a task on its test split; the per-init summary over seeds,
    the TF-IDF reference, and plots (curves of all runs; confusion and per-class F1 of the
    first pretrained run) into out_dir."""
    import json

    import pyarrow.parquet as pq

    from components.tasks import read_meta, read_split

    meta = read_meta(task_dir)
    test = read_split(task_dir, "test")
    runs_dir = Path(model_dir) / "runs"
    names = sorted(p.stem for p in runs_dir.glob("*.parquet"))
    if not names:
        raise FileNotFoundError(f"{runs_dir}: no fine-tuning runs; run finetune@{name} first")
    metric = primary_metric(task.kind)
    runs, histories = {}, {}
    for run in names:
        runs[run] = score_run(task.kind, meta["labels"], test, pq.read_table(runs_dir / f"{run}.parquet"))
        histories[run] = json.loads((runs_dir / f"{run}.json").read_text())["history"]
    by_init: dict[str, list[float]] = {}
    for run, m in runs.items():
        by_init.setdefault(run.rsplit("-s", 1)[0], []).append(m[metric])
    stats = {"kind": task.kind, "metric": metric, "test_examples": test.num_rows,
             "primary": {init: summarize(values) for init, values in sorted(by_init.items())},
             "runs": {run: {k: v for k, v in m.items() if isinstance(v, float)} for run, m in runs.items()},
             "tfidf": None}
    if cfg.tfidf_baseline and task.kind in ("classification", "pair"):
        train = read_split(task_dir, "train")
        predicted = tfidf_baseline(_texts(train, task.kind), train["label"].to_pylist(),
                                   _texts(test, task.kind), seed=0)
        tfidf = classification_metrics(test["label"].to_pylist(), predicted, meta["labels"])
        stats["tfidf"] = {k: tfidf[k] for k in ("accuracy", "macro_f1", "mcc")}
    exported = Path(model_dir) / "model" / "bertflow.json"  # plots describe the exported run
    first = json.loads(exported.read_text()).get("run", names[0]) if exported.exists() else names[0]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_curves(histories, out_dir / "curves.png", out_dir / "curves.csv")
    write_per_class(runs[first]["per_class"], out_dir / "per_class.png", out_dir / "per_class.csv")
    if "confusion" in runs[first]:
        write_confusion(runs[first], out_dir / "confusion.png", out_dir / "confusion.csv")
    return stats


def compare_transfer(runs: dict[str, dict]) -> str:
    """Markdown table of several runs' transfer.json side by side: a column per run and init
    (`LABEL init`), tasks in the first run's order; the arms of runs with other encoders, e.g.
    the default encoder and a continued checkpoint, read as one table."""
    columns = [(label, arm) for label, table in runs.items() for arm in ARMS
               if any(t.get(arm) for t in table.values())]
    header = ["task", "metric", *(f"{label} {ARMS[arm]}" for label, arm in columns)]
    cells = []
    for task in dict.fromkeys(task for table in runs.values() for task in table):
        first = next(table[task] for table in runs.values() if task in table)
        cells.append([task, first["metric"], *(_pct(runs[label][task][arm])
                                               if runs[label].get(task, {}).get(arm) else NO_VALUE
                                               for label, arm in columns)])
    return markdown(header, cells)


def transfer_report(tasks: Sequence[str], tasks_dir: Path, md_path: Path, json_path: Path,
                    init_from: str = "") -> dict:
    """The transfer table over the tasks' evaluate stats: Markdown for people, JSON for tools."""
    import json

    rows = []
    for name in tasks:
        path = Path(tasks_dir) / name / "evaluate_stats.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: task {name} is not evaluated; run evaluate@{name} first")
        s = json.loads(path.read_text())
        tfidf = s["tfidf"]["accuracy"] if s.get("tfidf") else None
        rows.append({"task": name, "kind": s["kind"], "metric": s["metric"], "tfidf": tfidf,
                     "scratch": None, **s["primary"],
                     "minutes": arm_minutes(Path(tasks_dir) / name / "finetune_stats.json")})
    seeds = max((r["pretrained"]["n"] for r in rows), default=0)
    encoder = (f"continued pretraining of {init_from} on the corpus" if init_from
               else "pretrained here from random weights")
    legend = f"*pretrained*: the pretrain stage's encoder ({encoder}); "
    if any(r.get("checkpoint") for r in rows):
        legend += (f"*checkpoint as is*: {init_from} fine-tuned without continued pretraining; "
                   "*vs checkpoint*: pretrained minus checkpoint as is, in points, and "
                   "*continued pretraining helps* when it exceeds the larger seed std; ")
    text = ("# What pretraining bought\n\nTest-split scores, mean ± sample std over "
            f"{seeds} seeds, in percent. {legend}*gain*: pretrained minus from scratch, in "
            "points; *pretraining helps* when the gain exceeds the larger seed std.\n\n"
            + transfer_table(rows))
    cost = cost_cells(rows)
    if cost[1]:
        text += ("\n## What each start cost\n\nWall minutes of one fine-tuning run (mean ± std "
                 "over seeds) on the machine that ran it; pretraining, paid once for every task, "
                 "is in pretrain_stats.json.\n\n" + markdown(*cost))
    with atomic_file(md_path) as tmp:
        tmp.write_text(text)
    summary = {r["task"]: {**{k: v for k, v in r.items() if k != "task"},
                           "verdict": verdicts(r)} for r in rows}
    with atomic_file(json_path) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return {name: {"gain": r["pretrained"]["mean"] - r["scratch"]["mean"]} if r["scratch"] else {}
            for name, r in zip(tasks, rows, strict=True)}
