"""`bertflow metrics`: a screen-wide summary of a run's stats files, a few headline numbers per
stage and the transfer table (each task's pretrained and from-scratch means).

DVC declares only pretrain_stats.json and transfer_stats.json as metrics, so that `dvc metrics
show` stays readable; every other stage's stats file is a plain output read here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.core.io import flatten
from components.evaluation.tables import transfer_cells

HEADLINES: dict[str, tuple[str, ...]] = {
    "ingest": ("documents", "chars", "shards", "dropped.empty"),
    "clean": ("documents_out", "documents_heldout", "sentences_out"),
    "checkpoint": ("init_from",),
    "tokenizer": ("vocab_size", "tokens_per_word", "unk_rate"),
    "pairs": ("train.instances", "train.tokens", "heldout.instances"),
    "pretrain": ("steps", "stopped_by", "mlm_accuracy", "nsp_accuracy", "perplexity"),
}
"""The stats shown per stage, in run order (dotted keys of its `<stage>_stats.json`); each line
fits 130 columns (`stopped_by` says whether `steps` reached `max_steps`)."""


def _read(path: Path) -> dict[str, Any]:
    """A stats file as a flat dict (dotted keys); empty when the stage has not run."""
    return flatten(json.loads(path.read_text())) if path.exists() else {}


def _number(value: Any) -> str:
    """Integers with thousands separators, floats to four significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value) if value != "" else "none"
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def _columns(rows: list[list[str]]) -> list[str]:
    """Rows of cells as lines of left-aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def stage_lines(metrics_dir: Path) -> list[str]:
    """One line per stage: its headline stats, or that it has not run."""
    rows = []
    for stage, keys in HEADLINES.items():
        stats = _read(Path(metrics_dir) / f"{stage}_stats.json")
        shown = [f"{k} {_number(stats[k])}" for k in keys if k in stats]
        rows.append([stage, ", ".join(shown) if stats else "not run yet"])
    return _columns(rows)


def transfer_lines(metrics_dir: Path, order: Sequence[str] = ()) -> list[str]:
    """The transfer table, tasks in `order` first, or that it is not there."""
    path = Path(metrics_dir) / "transfer.json"
    if not path.exists():
        return ["transfer: not run yet"]
    found = json.loads(path.read_text())
    tasks = [t for t in order if t in found] + sorted(set(found) - set(order))
    header, cells = transfer_cells([{"task": task, **found[task]} for task in tasks])
    return ["test scores in percent, mean ± std over seeds (metrics/transfer.md says more):",
            *_columns([header, *cells])]


def summary(metrics_dir: Path, order: Sequence[str] = ()) -> str:
    """The whole summary: stage headlines, then the transfer table (tasks in `order` first)."""
    return "\n".join([*stage_lines(metrics_dir), "", *transfer_lines(metrics_dir, order)]) + "\n"
