"""bertflow's fine-tuning against transformers' Trainer, from the same public checkpoint.

Both fine-tune all-MiniLM-L6-v2 (the MiniLM preset's checkpoint, installed offline) on the same
task splits of a finished run (`data/tasks`), on the same cores, one fit at a time:
- Trainer as its documentation's token- and sequence-classification guides do it (AutoModelFor...,
  DataCollatorForTokenClassification / WithPadding, the first subword of a word labelled and -100
  elsewhere, 16 a batch, weight decay 0.01, evaluation each epoch and the best epoch kept), with
  the best learning rate of a small grid chosen on validation;
- bertflow's `finetune_start` with the MiniLM preset's settings for the task (params-minilm.yaml),
  starting from the same checkpoint.
Both are scored by the same functions on the test split (seqeval entity F1; accuracy), test
once per fit. Wall minutes include data preparation, validation and the test prediction.

Usage:  python -m benchmarks.checks.finetune_vs_hf [--project .] [--tasks conll2003-ner movie-sentiment]
        [--lrs 5e-5 1e-4 2e-4] [--seeds 1]
Writes the "Fine-tuning against transformers' Trainer" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

from benchmarks.results import read_section, write_section
from components.core.params import load_params

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Fine-tuning against transformers' Trainer"
CHECKPOINT = "all-minilm-l6-v2"
THREADS = 2  # both sides: the cores of the reference machine
HEADER = ("| task | bertflow test (minutes) | Trainer test (minutes) | lr: bertflow / Trainer (grid) | "
          "validation: bertflow / Trainer | bertflow time / Trainer's | seeds; run |")


def minilm_encoder(project: Path, packages: Path, work: Path) -> tuple[Path, Path]:
    """The checkpoint's own folder (transformers reads it) and the same weights as a bertflow
    encoder folder (what `finetune_start` starts from)."""
    from components.model.checkpoint import import_checkpoint
    from components.model.metadata import EncoderInfo, read_checkpoint_info, write_info
    from components.model.packaged import source_dir

    folder = work / "encoder"
    import_checkpoint(CHECKPOINT, project, packages, folder)
    write_info(folder, EncoderInfo(config=read_checkpoint_info(folder).config, init_from=CHECKPOINT))
    return source_dir(CHECKPOINT, project, packages), folder


def bertflow_fit(name: str, p, task_dir: Path, encoder: Path, seed: int, work: Path) -> dict:
    """One bertflow fit from the checkpoint: validation and test metric, wall minutes."""
    import pyarrow.parquet as pq

    from components.data.tasks.folder import read_meta, read_split
    from components.evaluation.metrics import primary_metric, score_predictions
    from components.training.finetune import finetune_start

    task = p.finetune.tasks[name]
    # fp32 like the Trainer beside it (`auto` would take bf16 on an AMX CPU)
    cfg = p.finetune.model_copy(update={"seeds": [seed], "workers": 1, "precision": "32-true"})
    out = work / f"bertflow-{name}-{seed}"
    start = time.perf_counter()
    stats = finetune_start(name, task, cfg, init="pretrained", task_dir=task_dir, encoder_dir=encoder,
                           out_dir=out)
    meta = read_meta(task_dir)
    scheme = meta.get("scheme", "")
    (fit,) = stats["fits"].values()
    predictions = pq.read_table(out / "fits" / f"pretrained-s{seed}.parquet")
    scores = score_predictions(task.kind, meta["labels"], read_split(task_dir, "test"), predictions, scheme)
    minutes = (time.perf_counter() - start) / 60
    shutil.rmtree(out)
    result = {"lr": fit["lr"], "epochs": stats["epochs"], "max_len": stats["max_seq_len"],
              "val": fit["best_val_metric"], "test": scores[primary_metric(task.kind, scheme)],
              "minutes": minutes}
    print("bertflow", name, json.dumps(result), flush=True)  # a long run's progress
    return result


def trainer_fit(kind: str, task_dir: Path, src: Path, lr: float, epochs: int, seed: int,
                max_len: int, work: Path) -> dict:
    """One fit with transformers' Trainer, as its guides do it: validation and test metric (the
    best epoch's model), wall minutes."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from components.data.tasks.folder import read_meta, read_split
    from components.evaluation.metrics import classification_metrics, tag_metrics

    start = time.perf_counter()
    meta = read_meta(task_dir)
    tokenizer = AutoTokenizer.from_pretrained(src)
    splits = {s: read_split(task_dir, s).to_pylist() for s in ("train", "valid", "test")}
    if kind == "token":
        space = ["O"] + [f"{b}-{t}" for t in meta["labels"] for b in "BI"]
        model = AutoModelForTokenClassification.from_pretrained(src, num_labels=len(space))
        data = {s: [_token_example(tokenizer, r["tokens"], [space.index(t) for t in r["tags"]], max_len)
                    for r in rows] for s, rows in splits.items()}
        collator = DataCollatorForTokenClassification(tokenizer)

        def metric(split: str, logits: np.ndarray, labels: np.ndarray) -> float:
            pred = []
            for row, lab, gold in zip(logits.argmax(-1), labels, splits[split], strict=True):
                tags = [space[i] for i in row[lab != -100]]  # first subwords, in word order
                pred.append(tags + ["O"] * (len(gold["tags"]) - len(tags)))  # words cut by max_len
            return tag_metrics([r["tags"] for r in splits[split]], pred)["f1"]
    else:
        space = meta["labels"]
        model = AutoModelForSequenceClassification.from_pretrained(src, num_labels=len(space))
        data = {s: [{**tokenizer(r["text"], truncation=True, max_length=max_len),
                     "labels": space.index(r["label"])} for r in rows] for s, rows in splits.items()}
        collator = DataCollatorWithPadding(tokenizer)

        def metric(split: str, logits: np.ndarray, labels: np.ndarray) -> float:
            pred = [space[i] for i in logits.argmax(-1)]
            return classification_metrics([r["label"] for r in splits[split]], pred, space)["accuracy"]

    args = TrainingArguments(
        output_dir=str(work / "trainer"), learning_rate=lr, num_train_epochs=epochs,
        per_device_train_batch_size=16, per_device_eval_batch_size=64, weight_decay=0.01,
        eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True,
        metric_for_best_model="score", save_total_limit=1, seed=seed, use_cpu=True,
        report_to="none", disable_tqdm=True, logging_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=data["train"], eval_dataset=data["valid"],
                      data_collator=collator, processing_class=tokenizer,
                      compute_metrics=lambda out: {"score": metric("valid", *out)})
    trainer.train()
    val = trainer.evaluate()["eval_score"]
    trainer.compute_metrics = None  # it scores the validation split; the test split is scored below
    test = trainer.predict(data["test"])
    score = metric("test", test.predictions, test.label_ids)
    minutes = (time.perf_counter() - start) / 60
    shutil.rmtree(work / "trainer")
    fit = {"lr": lr, "epochs": epochs, "val": val, "test": score, "minutes": minutes}
    print("trainer", task_dir.name, json.dumps(fit), flush=True)  # a long grid's progress
    return fit


def _token_example(tokenizer, words: list[str], tags: list[int], max_len: int) -> dict:
    """The guide's alignment: a word's first subword carries its tag, the rest and the special
    tokens -100 (ignored by the loss)."""
    enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_len)
    labels, previous = [], None
    for word in enc.word_ids():
        labels.append(-100 if word is None or word == previous else tags[word])
        previous = word
    return {**enc, "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=ROOT)
    parser.add_argument("--tasks", nargs="+", default=["conll2003-ner", "movie-sentiment"])
    parser.add_argument("--lrs", nargs="+", type=float, default=[5e-5, 1e-4, 2e-4])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    args = parser.parse_args()
    import torch

    torch.set_num_threads(THREADS)
    project = args.project.resolve()
    p = load_params(ROOT / "params-minilm.yaml")  # the preset's task settings; data from --project
    rows = _rows_on_record()  # tasks not run now keep their row, each measured in one run
    with tempfile.TemporaryDirectory(prefix="finetune-vs-hf-") as tmp:
        work = Path(tmp)
        src, encoder = minilm_encoder(project, project / p.paths.packages, work)
        for name in args.tasks:
            task, task_dir = p.finetune.tasks[name], project / p.paths.tasks / name
            ours = [bertflow_fit(name, p, task_dir, encoder, s, work) for s in args.seeds]
            epochs, max_len = ours[0]["epochs"], ours[0]["max_len"]  # the Trainer's the same
            grid = {lr: [trainer_fit(task.kind, task_dir, src, lr, epochs, s, max_len, work)
                         for s in args.seeds] for lr in args.lrs}
            best = max(grid, key=lambda lr: np.mean([f["val"] for f in grid[lr]]))
            theirs = grid[best]
            ratio = np.mean([f["minutes"] for f in ours]) / np.mean([f["minutes"] for f in theirs])
            val = " / ".join(f"{100 * np.mean([f['val'] for f in fits]):.1f}" for fits in (ours, theirs))
            rows[name] = (f"| {name} | {_cell(ours)} | {_cell(theirs)} | {ours[0]['lr']:g} / {best:g} "
                          f"({', '.join(f'{lr:g}' for lr in args.lrs)}) | {val} | {ratio:.2f} | "
                          f"{', '.join(map(str, args.seeds))}; {date.today().isoformat()} |")
    text = "\n".join([
        SECTION, "",
        "all-MiniLM-L6-v2 fine-tuned by bertflow (the MiniLM preset's task settings) and by",
        "transformers' Trainer as its guides do it (batch 16, weight decay 0.01, the best epoch kept;",
        "the learning rate chosen on validation from the grid), same splits, same epochs, "
        f"{THREADS} threads each, one fit at a time; test score and wall minutes a fit (data",
        "preparation, validation and test prediction included), validation score, the seeds and",
        "the day of the row's run (each row is one run of the command, both sides in it).", "",
        HEADER, "|---|---|---|---|---|---|---|",
        *rows.values(), "",
        "Where bertflow's time goes: batches of 32 examples of similar length (the guides' 16,",
        "padded to the longest of a random draw), so an epoch is half the steps, each on less padding.",
        "",
        "Reproduce a row: `make run` (the task data), then",
        "`python -m benchmarks.checks.finetune_vs_hf --tasks TASK` (the others' rows stay as they are).",
    ])
    write_section(text)
    print(text)


def _rows_on_record() -> dict[str, str]:
    """The section's table rows in RESULTS.md, by task (rows under this HEADER only)."""
    section = read_section(SECTION)
    if HEADER not in section:
        return {}
    table = section.split(HEADER, 1)[1].split("\n\n", 1)[0]
    return {line.split("|")[1].strip(): line for line in table.splitlines()[1:] if line.startswith("| ")}


def _cell(fits: list[dict]) -> str:
    """`77.1 ± 0.8 (4.2 min)`: the test metric in percent over seeds, and minutes a fit."""
    test = [100 * f["test"] for f in fits]
    spread = f" ± {np.std(test, ddof=1):.1f}" if len(test) > 1 else ""
    return f"{np.mean(test):.1f}{spread} ({np.mean([f['minutes'] for f in fits]):.1f} min)"


if __name__ == "__main__":
    main()
