"""Distillation settings chosen on validation: the `distilled` start of one task under each
variant of `distill` (temperature, mix, augmentation copies, corpus text) or of the task's own
settings (epochs), beside the pretrained start, seeds 1-3, validation only.

The teacher and the pretrained encoder are the run's (`bertflow run -p params-distill.yaml
--until teacher@TASK`); each variant builds its transfer set (transfer_set@task's function,
with the variant's settings) and fits the student at the task's first rate (a student cut from the
teacher's checkpoint, `student_layers`, at the teacher's rates); the test split is never read.

Usage:  python -m benchmarks.experiments.distill_variants --task trec-6 \\
            --variant base='{}' soft='{"alpha": 1.0}' t4='{"temperature": 4.0, "alpha": 0.9}' \\
            copies6='{"augment_copies": 6}' epochs6='{"epochs": 6}' minilm01='{"student_layers": [0, 1]}'
        [--params params-distill.yaml] [--project DIR]
A variant is a JSON object of `distill` keys; `epochs`, `transfer_corpus`, `transfer_pairs` and
`pair_link` are the task's.
Writes the "Distillation settings: TASK, student STUDENT" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.exported import project_option
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.training.finetune import distill_student, finetune_start
from components.training.student import student_encoder
from components.training.transfer_set import build_transfer

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

TASK_KEYS = ("epochs", "transfer_corpus", "transfer_pairs", "pair_link")


def fit_variant(p, root: Path, name: str, init: str, change: dict, work: Path) -> dict:
    """One start's fits of task `name` (seeds of finetune.seeds) under `change`: their best
    validation scores, steps, and the minutes of the transfer set and the fits together."""
    task = p.finetune.tasks[name]
    task = task.model_copy(update={"lr": task.lr[:1], **{k: change[k] for k in TASK_KEYS if k in change}})
    distill = p.distill.model_copy(update={k: v for k, v in change.items() if k not in TASK_KEYS})
    cfg = p.finetune.model_copy(update={"onnx": []})  # no start's ONNX graph
    models, task_dir = root / p.paths.models, root / p.paths.tasks / name
    start = time.perf_counter()
    if init == "pretrained":
        stats = finetune_start(name, task, cfg, init=init, task_dir=task_dir, encoder_dir=models / "encoder",
                               out_dir=work / "fits")
    else:  # the distilled start, as transfer_set@task and distill@task run it
        transfer = work / "transfer"
        build_transfer(name, task, cfg, distill, task_dir, models / "encoder",
                       models / "teachers" / name, transfer, root / p.paths.clean)
        with student_encoder(distill, root, root / p.paths.packages, work) as student:
            stats = distill_student(name, task, cfg, distill, task_dir=task_dir,
                                    encoder_dir=models / "encoder", transfer_dir=transfer,
                                    out_dir=work / "fits", student_dir=student)
    fits = list(stats["fits"].values())
    return {"valid": [f["best_val_metric"] for f in fits], "steps": [f["steps"] for f in fits],
            "minutes": (time.perf_counter() - start) / 60}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--variant", nargs="+", required=True, metavar="NAME=JSON")
    parser.add_argument("--params", default="params-distill.yaml")
    project_option(parser)
    args = parser.parse_args()
    p = load_params(args.project / args.params)
    rows = []
    variants = {"(pretrained start)": None, **{v.split("=", 1)[0]: json.loads(v.split("=", 1)[1])
                                               for v in args.variant}}
    for label, change in variants.items():
        with tempfile.TemporaryDirectory(prefix="bertflow-distill-") as tmp:
            r = fit_variant(p, args.project, args.task, "pretrained" if change is None else "distilled",
                            change or {}, Path(tmp))
        v = [100 * x for x in r["valid"]]
        rows.append(f"| {label} | {'' if change is None else f'`{json.dumps(change)}`'} | "
                    f"{' / '.join(f'{x:.2f}' for x in v)} | **{statistics.mean(v):.2f}** ± "
                    f"{statistics.stdev(v) if len(v) > 1 else 0:.2f} | {statistics.mean(r['steps']):,.0f} | "
                    f"{r['minutes']:.1f} |")
        print(rows[-1], flush=True)
    seeds = " ".join(map(str, p.finetune.seeds))
    # The student the variants share (the params file's unless they all name another), so that a
    # run of other students gets a section of its own instead of replacing the params file's.
    cuts = [c.get("student_layers", p.distill.student_layers) for c in variants.values() if c is not None]
    layers = cuts[0] if all(c == cuts[0] for c in cuts) else p.distill.student_layers
    student = (f"layers {', '.join(map(str, layers))} of {p.distill.teacher}" if layers
               else "the pretrained encoder")
    write_section("\n".join([
        f"## Distillation settings: {args.task}, student {student}", "", measured(), "",
        f"Reproduce: `python -m benchmarks.experiments.distill_variants --task {args.task} --variant "
        + " ".join(f"{k}='{json.dumps(c)}'" for k, c in variants.items() if c is not None)
        + f"` after `bertflow run -p {args.params} --until teacher@{args.task}` (validation, "
        f"seeds {seeds}; the settings not named are {args.params}'s).", "",
        "| variant | settings | validation per seed | mean ± std | steps | minutes (transfer set, fits) |",
        "|---|---|---|---|---|---|", *rows, ""]))


if __name__ == "__main__":
    main()
