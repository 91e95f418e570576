"""One self-contained HTML report of a project's latest run, built from what the stages wrote
to the metrics folder (stats JSON, curves and confusion PNGs, the transfer table) and the
registry's state: images inline as data URIs, style inline, no script, nothing fetched.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from components.core.io import flatten
from components.evaluation.tables import cost_cells, transfer_cells

DATA_STAGES = ("ingest", "clean", "checkpoint", "tokenizer", "pairs")
NOT_SHOWN = ("problems", "train.length_histogram", "heldout.length_histogram")  # long lists
STYLE = " ".join("""
body{font:15px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left} th{background:#f3f3f3}
td.n{text-align:right;font-variant-numeric:tabular-nums} img{max-width:100%;margin:.3em 0}
h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em} .muted{color:#777}
""".split())


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f'<td class="n">{value:.4g}</td>'
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="n">{value:,}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def table(header: list[str], rows: list[list[Any]]) -> str:
    """An HTML table; numbers right-aligned."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def image(path: Path, alt: str) -> str:
    """A PNG inline as a data URI ('' if it is not there)."""
    if not path.exists():
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _stats(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _key_values(stats: dict, skip: tuple[str, ...] = ()) -> str:
    flat = {k: v for k, v in flatten(stats).items() if not k.startswith(skip)
            and not isinstance(v, list | dict)}
    return table(["stat", "value"], [[k, v] for k, v in sorted(flat.items())]) if flat else \
        '<p class="muted">not run yet</p>'


def _transfer(transfer: dict) -> str:
    rows = [{"task": task, **t} for task, t in transfer.items()]
    if not rows:
        return '<p class="muted">not run yet</p>'
    cost = cost_cells(rows)
    return table(*transfer_cells(rows)) + (
        "<h3>What each start cost</h3><p>Optimizer steps of one fit (one init, one seed), mean ± std over "
        "seeds.</p>" + table(*cost) if cost[1] else "")


def _task(name: str, folder: Path) -> str:
    data, evaluate = _stats(folder / "task_data_stats.json"), _stats(folder / "evaluate_stats.json")
    parts = [f"<h3>{html.escape(name)}</h3>"]
    if data:
        examples = data.get("examples", {})
        parts.append(f"<p>{html.escape(str(data.get('kind', '')))} task, source "
                     f"{html.escape(str(data.get('source', '')))}; examples "
                     + ", ".join(f"{s} {n:,}" for s, n in examples.items()) + "</p>")
    if evaluate:
        metric = evaluate["metric"]
        rows = [[fit, *(scores.get(m) for m in sorted(scores))]
                for fit, scores in sorted(evaluate["fits"].items())]
        names = sorted(next(iter(evaluate["fits"].values())))
        parts.append(f"<p>Test split ({evaluate.get('test_examples', '?'):,} examples), primary "
                     f"metric {html.escape(metric)}:</p>" + table(["fit", *names], rows))
    for png, alt in (("confusion.png", "confusion matrix"), ("per_class.png", "per-class scores"),
                     ("curves.png", "validation curves")):
        parts.append(image(folder / png, f"{name}: {alt}"))
    return "\n".join(parts)


def _stages(rows: list[dict]) -> str:
    """The latest run's stages: status, minutes and where each ran (its fits too)."""
    if not rows:
        return '<p class="muted">no run recorded yet</p>'
    return table(["stage", "status", "minutes", "ran on", "its fits ran on"],
                 [[r["stage"], r["status"], "" if r["minutes"] is None else f"{r['minutes']:.1f}", r["host"],
                   f"{r['fits']}: {r['fit_hosts']}" if r["fits"] else ""] for r in rows])


def build_report(metrics_dir: Path, title: str, registry_rows: list[dict] | None,
                 header: dict[str, str], stage_rows: list[dict]) -> str:
    """The report's HTML for the metrics folder of a project; `stage_rows`: the latest run's
    stages (components.core.tracking.latest_stages)."""
    metrics_dir = Path(metrics_dir)
    parts = [f"<h1>{html.escape(title)}</h1>",
             table(["", ""], [[k, v] for k, v in header.items()]),
             "<h2>Data</h2>"]
    for stage in DATA_STAGES:
        parts += [f"<h3>{stage}</h3>", _key_values(_stats(metrics_dir / f"{stage}_stats.json"),
                                                   skip=NOT_SHOWN)]
    parts += ["<h2>Pretraining</h2>", _key_values(_stats(metrics_dir / "pretrain_stats.json")),
              image(metrics_dir / "pretrain_curve.png", "pretraining curves")]
    transfer = _stats(metrics_dir / "transfer.json")
    parts.append("<h2>Fine-tuning: what pretraining bought</h2>")
    parts.append(_transfer(transfer) if transfer else '<p class="muted">not run yet</p>')
    task_dirs = sorted((metrics_dir / "tasks").glob("*/"))
    parts += [_task(folder.name, folder) for folder in task_dirs]
    parts += ["<h2>Where the latest run's stages ran</h2>", _stages(stage_rows)]
    parts.append("<h2>Registry</h2>")
    if registry_rows:
        parts.append(table(["model", "versions", "champion", "candidate", "champion's metric", "history"],
                           [[r["name"], r["versions"], r["champion"], r["candidate"],
                             f"{r['metric']} {float(r['value']):.4f}" if r["value"] else "",
                             " → ".join(r["history"])] for r in registry_rows]))
    else:
        parts.append('<p class="muted">the registry is empty</p>')
    body = "\n".join(p for p in parts if p)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
            f"</title><style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")
