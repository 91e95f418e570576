"""Valid-BIO against free tag decoding, on the validation split of each BIO token task: the
task's exported model (`make run` writes it) tags the split both ways, with its CRF where it
has one; entity F1 of each, and the share of sentences whose free tags no BIO reader accepts
(an I-X that follows neither B-X nor I-X). The same weights both ways: the difference is the
decoding's alone.

Usage:  python -m benchmarks.experiments.tag_decoding [--project DIR]   (DIR: a project that ran `make run`)
Writes the "Tag decoding" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.exported import exported_models, project_option
from benchmarks.results import measured, write_section
from components.evaluation.metrics import score_predictions
from components.lifecycle.inference import load_task_model
from components.model.decoding import predict, predictions_table
from components.model.inputs import encode

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Tag decoding"


def invalid(tags: list[str]) -> bool:
    """Whether a BIO reader would reject the sequence: an I-X after anything but B-X or I-X."""
    return any(t.startswith("I-") and (i == 0 or prev == "O" or prev[2:] != t[2:])
               for i, (prev, t) in enumerate(zip(["O", *tags], tags, strict=False)))


def compare(model_dir: Path, valid: Path) -> dict | None:
    """Entity F1 of free and valid decoding on the split, and the free paths' invalid share
    (None for plain tags, which have no BIO to keep)."""
    tm = load_task_model(model_dir)
    info, gold = tm.info, pq.read_table(valid)
    if info.scheme == "plain":
        return None
    examples = encode(gold, "token", tm.tokenizer, info.labels, info.max_seq_len,
                      label_subwords=info.label_subwords, scheme=info.scheme)
    out = {"crf": info.crf, "sentences": len(examples)}
    for decoding in ("free", "valid"):
        found = predict(tm.model, "token", examples, info.space, 64, tag_decoding=decoding)
        out[decoding] = score_predictions("token", info.labels, gold, predictions_table("token", found),
                                          info.scheme)["entity_f1"]
        out[f"{decoding}_invalid"] = sum(map(invalid, found)) / len(found)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    project_option(parser)
    args = parser.parse_args()
    rows = []
    for name, task, model, task_dir in exported_models(args.project):
        if task.kind != "token":
            continue
        r = compare(model, task_dir / "valid.parquet")
        if r is None:
            continue
        rows.append(f"| {name} | {'CRF' if r['crf'] else 'softmax'} | {r['sentences']:,} | "
                    f"{r['free_invalid']:.1%} | {r['free'] * 100:.2f} | {r['valid'] * 100:.2f} | "
                    f"{(r['valid'] - r['free']) * 100:+.2f} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        SECTION, "", measured(), "",
        "Reproduce: `python -m benchmarks.experiments.tag_decoding` after `make run` (the exported model of "
        "each BIO token task, its pretrained first seed; validation split).", "",
        "| task | decoder | sentences | free paths a BIO reader rejects | entity F1, free | "
        "entity F1, valid | gain |",
        "|---|---|---|---|---|---|---|", *rows, ""])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
