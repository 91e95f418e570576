"""Fine-tuning throughput against pretraining throughput, both from one pipeline run.

For each task and start of finetune.init (pretrained, scratch, checkpoint, adapted): the subword
tokens its fits trained on (each training example's length, windows for `long_text: chunks`,
times the epochs each fit ran: steps over the steps of an epoch) over the wall seconds of its
`finetune@TASK-START` stage (its fits two at a time on two cores, validation, data and process
start-up included); against the pretrain stage's tokens over its wall seconds
(validation and snapshots included), on the same machine in the same run. A ratio near 1 means
fine-tuning spends its minutes training, as pretraining does; what it costs is where its steps go.

Usage:  python -m benchmarks.speed.finetune_throughput [--project .]
Needs a finished `make run` in the project (its MLflow store, metrics/ and data/). Writes the
"Fine-tuning throughput" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchmarks.results import write_section
from components.core.params import load_params
from components.training.finetune import STARTS

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Fine-tuning throughput"


def stage_seconds(project: Path, p) -> dict[str, float]:
    """Wall seconds of each stage's newest finished MLflow run (`this_run.seconds`)."""
    import mlflow

    from components.core.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri(p.tracking, project))
    runs = mlflow.search_runs(experiment_names=[p.tracking.experiment], order_by=["start_time ASC"],
                              filter_string="attributes.status = 'FINISHED'")
    seconds: dict[str, float] = {}
    for _, run in runs.iterrows():  # a later run of a stage replaces an earlier one
        value = run.get("metrics.this_run.seconds")
        if value is not None and not math.isnan(value):
            seconds[run["tags.mlflow.runName"]] = float(value)
    return seconds


def epoch_tokens(project: Path, name: str, p, max_len: int) -> tuple[int, int]:
    """Subword tokens of one epoch of the task's training split (as the encoder's tokenizer
    encodes it for the fits, at `max_len`), and the steps of an epoch."""
    from components.data.tasks.folder import read_meta, read_split
    from components.model.folders import load_tokenizer
    from components.model.inputs import encode
    from components.model.metadata import read_encoder_info

    task, cfg = p.finetune.tasks[name], p.finetune
    task_dir, encoder_dir = project / p.paths.tasks / name, project / p.paths.models / "encoder"
    bert = read_encoder_info(encoder_dir).config
    meta = read_meta(task_dir)
    tokenizer = load_tokenizer(encoder_dir, bert)
    train = encode(read_split(task_dir, "train"), task.kind, tokenizer, meta["labels"], max_len,
                   task.long_text, cfg.label_subwords, task.max_span_words, meta.get("scheme", ""),
                   task.chunk_overlap)
    return sum(len(e.ids) for e in train), math.ceil(len(train) / cfg.batch_size)


def trained_tokens(stats: dict, per_epoch: int, steps_per_epoch: int) -> tuple[float, int]:
    """Subword tokens a start's fits trained on (its stage's stats), summed over its fits, and
    the fit count; a learning-rate search's losing trials count as fits (the winner is the
    start's first fit)."""
    search = stats.get("search")
    fits = list(stats["fits"].values()) + [
        trial for rate, trial in (search["trials"].items() if search else ()) if rate != f"{search['lr']:g}"]
    return sum(per_epoch * f["steps"] / steps_per_epoch for f in fits), len(fits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=ROOT)
    args = parser.parse_args()
    project = args.project.resolve()
    p = load_params(project / "params.yaml")
    seconds = stage_seconds(project, p)
    pretrain = json.loads((project / p.paths.metrics / "pretrain_stats.json").read_text())
    base = pretrain["tokens"] / seconds["pretrain"]
    rows = [f"| pretrain | {pretrain['tokens'] / 1e6:.1f} M | {seconds['pretrain'] / 60:.1f} | "
            f"{base:,.0f} | 1.00 |"]
    total_tokens = total_seconds = 0.0
    for name in p.finetune.tasks:
        epoch = None  # the same for every start: the encoder's tokenizer and shape
        for start in p.finetune.init:
            stage = f"finetune@{name}-{start}"  # the distilled start trains on its transfer set: not here
            if start not in STARTS or stage not in seconds:
                continue
            stats = json.loads((project / p.paths.metrics / "tasks" / name / f"finetune-{start}_stats.json")
                               .read_text())
            epoch = epoch or epoch_tokens(project, name, p, stats["max_seq_len"])
            tokens, n = trained_tokens(stats, *epoch)
            rate = tokens / seconds[stage]
            total_tokens, total_seconds = total_tokens + tokens, total_seconds + seconds[stage]
            rows.append(f"| {stage} ({n} fits) | {tokens / 1e6:.1f} M | {seconds[stage] / 60:.1f} | "
                        f"{rate:,.0f} | {rate / base:.2f} |")
    rows.append(f"| all fine-tuning | {total_tokens / 1e6:.1f} M | {total_seconds / 60:.1f} | "
                f"{total_tokens / total_seconds:,.0f} | **{total_tokens / total_seconds / base:.2f}** |")
    text = "\n".join([
        SECTION, "",
        "Training tokens a second of each fine-tuning stage against the pretrain stage of the same run",
        f"(`{p.model.preset}` encoder, the run in `{project.name}`; stage wall time from MLflow, with",
        "validation, data and process start-up; fits two at a time on two cores). Target: ≥ 0.8.", "",
        "| stage | tokens trained | minutes | tokens/s | vs pretraining |",
        "|---|---|---|---|---|",
        *rows, "",
        "Reproduce: `make run`, then `python -m benchmarks.speed.finetune_throughput`.",
    ])
    write_section(text)
    print(text)


if __name__ == "__main__":
    main()
