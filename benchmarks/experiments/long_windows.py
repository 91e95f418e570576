"""Long documents with longer windows: bbc-news fine-tuned from each encoder with its articles
cut into windows of each length, validation only (the test split is never read).

The classic encoder learned positions only up to its pretraining length (128); the modern one
has rotary positions, which take longer windows without new weights. Each (encoder, window)
pair is fit with 3 seeds at the task's own protocol (params.yaml: one epoch, its rate, windows
that overlap by `chunk_overlap`); the score of a row is that of the mean of its windows' logits.

Usage:  python -m benchmarks.experiments.long_windows --encoder classic=data/models/encoder \\
            modern=data/modern/models/encoder [--lengths 128 512] [--seeds 1 2 3]
Needs the task's data (`bertflow run --until task_data@bbc-news`). Writes the "Long documents"
section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.exported import project_option
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.training.finetune import probe_fits

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Long documents: longer windows"
TASK = "bbc-news"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", nargs="+", required=True, metavar="NAME=DIR")
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    project_option(parser)
    args = parser.parse_args()
    p = load_params(args.project / "params.yaml")
    # The probe's fits train at the task's first rate (no search).
    task, cfg = p.finetune.tasks[TASK], p.finetune.model_copy(update={"seeds": args.seeds})
    rows, encoders = [], dict(e.split("=", 1) for e in args.encoder)
    for name, folder in encoders.items():
        for length in args.lengths:
            start = time.perf_counter()
            with tempfile.TemporaryDirectory() as work:
                fits = probe_fits(TASK, task.model_copy(update={"max_seq_len": length}), cfg,
                                  args.project / p.paths.tasks / TASK, Path(folder), Path(work))
            scores = [f["best_val_metric"] * 100 for f in sorted(fits, key=lambda f: f["seed"])]
            rows.append(f"| {name} | {length} | {fits[0]['steps']:,} | "
                        + " / ".join(f"{s:.1f}" for s in scores)
                        + f" | **{statistics.mean(scores):.1f} ± {statistics.stdev(scores):.1f}** | "
                        f"{(time.perf_counter() - start) / 60:.1f} |")
            print(rows[-1], flush=True)
    write_section("\n".join([
        SECTION, "", measured(), "",
        "Reproduce: `python -m benchmarks.experiments.long_windows --encoder "
        f"{' '.join(n + '=DIR' for n in encoders)} "
        f"--lengths {' '.join(map(str, args.lengths))}` ({torch.get_num_threads()} threads, fits side by "
        "side as the finetune stage runs them; each DIR an encoder folder).",
        "",
        f"{TASK} (whole articles in overlapping windows, the mean of a row's windows' logits), each "
        f"encoder and window length fine-tuned at the task's protocol ({task.epochs} epoch, "
        f"lr {task.lr[0]:g}, overlap {task.chunk_overlap} tokens), seeds "
        f"{', '.join(map(str, args.seeds))}: best validation accuracy of each seed, their mean ± std. "
        "The test split is not read.",
        "",
        "| encoder | window (tokens) | steps | validation accuracy per seed | mean ± std | minutes |",
        "|---|---|---|---|---|---|",
        *rows, ""]))


if __name__ == "__main__":
    main()
