"""The spread between two encoders of one recipe, per task: how far a task's pretrained score
moves when only the pretraining seed changes. A verdict "pretraining helps" must clear it as well
as the fine-tuning seeds' spread (`evaluate.encoder_spread`, docs/finetuning.md).

The reference encoder is the project's (its `make run`); a second one is pretrained with
`pretrain.seed` + 1, the same steps, into --workdir (a stopped run resumes from its snapshots).
Each task's `pretrained` start is then fitted from the second encoder with the reference run's
protocol: its seeds, at the rate the run chose for that start, on validation only (the test split
is not read). The reference encoder's scores are its run's own fits (the same code, seeds and
rate give the same fits). Per task: both means over seeds, the larger seed std and the spread
|mean A - mean B|, in points; and the `evaluate.encoder_spread` block to paste into params.yaml.

Usage:  python -m benchmarks.experiments.encoder_spread [--project DIR] [--workdir DIR]
        (DIR: a project after `make run`; about the pretraining's minutes plus half the run's
        fine-tuning on its machine)
Writes the "Encoder spread" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.exported import project_option
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.training.finetune import probe_fits
from components.training.pretrain import pretrain

SECTION = "## Encoder spread"


def reference_fits(project: Path, models: str, task: str) -> tuple[float, dict[int, float]]:
    """The rate the reference run's pretrained start trained at, and its best validation
    metric per seed (from the start's fit records)."""
    fits = [json.loads(f.read_text()) for f in (project / models / "tasks" / task / "pretrained" / "fits")
            .glob("pretrained-s*.json") if f.stem.rpartition("-s")[2].isdigit()]  # not the search's
    return fits[0]["lr"], {f["seed"]: f["best_val_metric"] for f in fits}


def second_encoder(project: Path, work: Path) -> tuple[Path, dict]:
    """The recipe pretrained again with the next seed (resumed where a run stopped)."""
    p = load_params(project / "params.yaml")
    out = work / f"encoder-s{p.pretrain.seed + 1}"
    if (out / "bertflow.json").exists():
        return out, json.loads((out / "bertflow.json").read_text())
    stats = pretrain(model=p.model, cfg=p.pretrain.model_copy(update={"seed": p.pretrain.seed + 1}),
                     pairs_dir=project / p.paths.pairs, tokenizer_dir=project / p.paths.tokenizer,
                     out_dir=out, work_dir=work / "snapshots")
    return out, stats


def spread_of(project: Path, work: Path) -> list[dict]:
    """A record per task: both encoders' validation scores per seed and the spread."""
    p = load_params(project / "params.yaml")
    encoder, _ = second_encoder(project, work)
    records = []
    for name, task in p.finetune.tasks.items():
        record_path = work / f"{name}.json"
        if not record_path.exists():  # a stopped experiment keeps its finished tasks
            lr, reference = reference_fits(project, p.paths.models, name)
            cfg = p.finetune.model_copy(update={"seeds": sorted(reference)})
            fits = probe_fits(name, task.model_copy(update={"lr": [lr]}), cfg, project / p.paths.tasks / name,
                              encoder, work / "fits" / name)
            record = {"task": name, "lr": lr, "reference": reference,
                      "second": {f["seed"]: f["best_val_metric"] for f in fits}}
            record_path.write_text(json.dumps(record, indent=1))
        records.append(json.loads(record_path.read_text()))
    return records


def row(r: dict) -> tuple[str, float]:
    """The table row of a task's record, and its spread in points."""
    a, b = (list(r[k].values()) for k in ("reference", "second"))
    mean_a, mean_b = 100 * statistics.mean(a), 100 * statistics.mean(b)
    std = 100 * max(statistics.stdev(a), statistics.stdev(b)) if min(len(a), len(b)) > 1 else 0.0
    spread = abs(mean_a - mean_b)
    return (f"| {r['task']} | {r['lr']:g} | {mean_a:.1f} | {mean_b:.1f} | {std:.1f} | **{spread:.1f}** | "
            f"{spread / std if std else float('inf'):.1f} |"), spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    project_option(parser)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertflow-encoder-spread"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    p = load_params(args.project / "params.yaml")
    records = spread_of(args.project, args.workdir)
    rows = [row(r) for r in records]
    block = "\n".join(["evaluate:", "  encoder_spread:"] +
                      [f"    {r['task']}: {s:.1f}" for r, (_, s) in zip(records, rows, strict=True)])
    text = "\n".join([
        SECTION, "", measured(), "",
        "Reproduce: `python -m benchmarks.experiments.encoder_spread --project DIR`, DIR a project "
        "after `make run`.", "",
        f"Validation, in percent, mean over fine-tuning seeds {', '.join(map(str, p.finetune.seeds))} of "
        f"the `pretrained` start from the reference encoder (pretrain.seed {p.pretrain.seed}) and from "
        f"the same recipe pretrained with seed {p.pretrain.seed + 1}, at the rate the reference run "
        "chose; *seed std*: the larger fine-tuning seed std of the two; *spread*: the two means' "
        "difference, in points; *spread / std*: how many seed stds it is.", "",
        "| task | lr | reference encoder | second encoder | seed std | spread | spread / std |",
        "|---|---|---|---|---|---|---|", *(r for r, _ in rows), "",
        "As params (`evaluate.encoder_spread`):", "", "```yaml", block, "```", ""])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
