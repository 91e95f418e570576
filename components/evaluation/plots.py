"""Plots: CSV for DVC (its HTML needs a CDN) and PNG for people, each written atomically."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from components.core.io import atomic_file


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
    image = ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="predicted", ylabel="actual")
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(j, i, str(matrix[i, j]), ha="center", va="center",
                    color=count_colour(image.cmap(image.norm(matrix[i, j]))))
    fig.tight_layout()
    _save(fig, png)
    plt.close(fig)


def count_colour(cell: tuple[float, float, float, float]) -> str:
    """The colour of a count drawn on a cell of RGBA colour `cell`: white on a dark cell, black
    on a light one, by the cell's luminance (the colour scale runs from the matrix's minimum, so
    a rule on the counts themselves put white on near-white cells)."""
    red, green, blue, _ = cell
    return "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 else "black"


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
    """Validation curves of several fits: long-format CSV and one line per fit vs step."""
    columns = ["step", "epoch", "val_metric", "train_loss"]
    _write_csv(csv, ["fit", *columns],
               [[fit, int(h["step"]), *(_num(h.get(c)) for c in columns[1:])]
                for fit, history in histories.items() for h in history])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for fit, history in histories.items():
        points = [(h["step"], h["val_metric"]) for h in history if h.get("val_metric") is not None]
        # Runs from scratch dashed, so the pretrained/scratch pairs read apart at a glance.
        ax.plot([s for s, _ in points], [v for _, v in points], marker="o", label=fit,
                linestyle="--" if "scratch" in fit else "-")
    ax.set(xlabel="fine-tuning step", ylabel="validation metric")
    if histories:
        ax.legend(fontsize="small")
    fig.tight_layout()
    _save(fig, png)
    plt.close(fig)


CURVE_COLUMNS = ("step", "tokens", "val/mlm_accuracy", "val/mlm_loss", "val/perplexity",
                 "val/nsp_accuracy")


def write_pretrain_curve(history: list[dict], csv_path: Path, png_path: Path) -> None:
    """The held-out curve as CSV (DVC plots) and PNG (for people; DVC's HTML needs a CDN)."""
    plt = _pyplot()
    header = [c.split("/")[-1] for c in CURVE_COLUMNS]
    rows = [",".join(header)] + [",".join("" if h.get(c) is None else f"{h[c]:.6g}" for c in CURVE_COLUMNS)
                                 for h in history]
    with atomic_file(csv_path) as tmp:
        tmp.write_text("\n".join(rows) + "\n")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    tokens = [h["tokens"] / 1e6 for h in history]
    left.plot(tokens, [h["val/mlm_accuracy"] for h in history], marker="o", label="MLM accuracy")
    if history and "val/nsp_accuracy" in history[0]:
        left.plot(tokens, [h["val/nsp_accuracy"] for h in history], marker="s", label="NSP accuracy")
    left.set(xlabel="training tokens (M)", ylabel="held-out accuracy", ylim=(0, 1))
    left.legend()
    right.plot(tokens, [h["val/mlm_loss"] for h in history], marker="o")
    right.set(xlabel="training tokens (M)", ylabel="held-out MLM loss")
    fig.tight_layout()
    _save(fig, png_path)
    plt.close(fig)
