"""Batch prediction throughput: our inference path on each backend (torch, and the model's ONNX
graph in ONNX Runtime, fp32 and int8) against transformers' text-classification pipeline, on the
same fine-tuned model and the same sentences, interleaved in one run; with the distill preset,
the task's teacher (MiniLM) beside it in torch fp32 and in int8.

Ours: `components.lifecycle.inference.predict_rows` (length-bucketed batches: sentences of similar length
share a batch, so little padding). The ONNX graphs are the ones `finetune.onnx` writes, with the
int8 check's test scores (written here into a copy of the model if it has none). Theirs: the
model exported with `bertflow export-hf`, run by `pipeline("text-classification")` with
truncation at the same length, once with its default (one sentence per call) and once batched
like ours (padding to the longest of each batch).

Usage:  python -m benchmarks.speed.predict_throughput [--task movie-sentiment] [--sentences 2000]
                                                [--params params-distill.yaml]
Needs the task model of finetune.init's first start (`make run`, or `bertflow run -p
params-distill.yaml`: its first start is the distilled student). Writes the "Batch prediction"
section of benchmarks/RESULTS.md (with --params params-distill.yaml, "Batch prediction:
distilled student and teacher").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.checks.int8_check import check
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.model.onnx_model import FP32, INT8, ONNX_DIR, quantize, read_check

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Batch prediction"


def sentences(task_dir: Path, n: int) -> list[str]:
    """The first n texts of the task's test, validation and training splits, in that order."""
    from components.data.tasks.folder import read_split

    texts: list[str] = []
    for split in ("test", "valid", "train"):
        texts += read_split(task_dir, split)["text"].to_pylist()
    return texts[:n]


def timed(fn, texts: list[str]) -> tuple[float, list[str]]:
    start = time.perf_counter()
    labels = fn(texts)
    return len(texts) / (time.perf_counter() - start), labels


def with_int8_check(model_dir: Path, task_dir: Path) -> tuple[Path, dict]:
    """A copy of an exported model folder with its ONNX graphs and the int8 check's scores."""
    copy = Path(tempfile.mkdtemp(prefix="bertflow-model-")) / "model"
    shutil.copytree(model_dir, copy)
    folder = copy / ONNX_DIR
    if not folder.exists():
        check(copy, task_dir, folder)
    if not (folder / INT8).exists():  # refused for serving; timed all the same, marked so
        quantize(folder / FP32, folder / INT8)
    return copy, read_check(folder)


def refused(check: dict) -> str:
    """A marker for an int8 graph the agreement check refused to serve (timed all the same)."""
    return f" (refused for serving: {check['agreement']:.2%} agreement)" if check.get("refused") else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="movie-sentiment")
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--project", type=Path, default=ROOT, help="the checkout that ran the pipeline")
    parser.add_argument("--params", default="params.yaml", help="the params file of the run (a preset)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # One call predicts every sentence: the serving limit on rows per call is raised to fit them.
    os.environ.setdefault("BERTFLOW_MAX_ROWS", str(args.sentences))

    from transformers import pipeline

    from components.lifecycle.hf_export import export_hf
    from components.lifecycle.inference import load_task_model, predict_rows

    p = load_params(args.project / args.params)
    task_dir = args.project / p.paths.tasks / args.task
    models_dir = args.project / p.paths.models
    start = p.finetune.init[0]  # the start whose task model the registry takes
    model_dir, scores = with_int8_check(models_dir / "tasks" / args.task / start / "model", task_dir)
    teacher = models_dir / "teachers" / args.task / "model"
    teacher_dir, teacher_scores = with_int8_check(teacher, task_dir) if teacher.exists() else (None, None)
    texts = sentences(task_dir, args.sentences)
    ours = load_task_model(model_dir)
    models = {"ours": ours, **{b: load_task_model(model_dir, b) for b in ("onnx", "onnx-int8")}}
    if teacher_dir is not None:
        models.update({"teacher": load_task_model(teacher_dir),
                       "teacher-int8": load_task_model(teacher_dir, "onnx-int8")})
    hf_dir = Path(tempfile.mkdtemp(prefix="bertflow-hf-")) / "model"
    export_hf(model_dir, hf_dir)
    clf = pipeline("text-classification", model=str(hf_dir), device=-1)
    cut = {"truncation": True, "max_length": ours.info.max_seq_len}

    def labels(tm):
        return lambda xs: [r["label"] for r in predict_rows(tm, [{"text": x} for x in xs], args.batch_size)]

    runs = {
        **{name: labels(tm) for name, tm in models.items()},
        "hf_default": lambda xs: [r["label"] for r in clf(xs, **cut)],
        "hf_batched": lambda xs: [r["label"] for r in clf(xs, batch_size=args.batch_size, **cut)],
    }
    for fn in runs.values():  # warm-up: first calls allocate and load kernels
        fn(texts[:64])
    rates: dict[str, list[float]] = {name: [] for name in runs}
    answers: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            rate, answers[name] = timed(fn, texts)
            rates[name].append(rate)
    median = {name: statistics.median(r) for name, r in rates.items()}

    def agreement(a: str, b: str) -> float:
        return sum(x == y for x, y in zip(answers[a], answers[b], strict=True)) / len(texts)

    agree, int8_agree = agreement("ours", "hf_batched"), agreement("ours", "onnx-int8")
    print({**median, "agreement": agree, "int8_agreement": int8_agree})
    lengths = [len(x.split()) for x in texts]
    b = args.batch_size
    reproduce = " ".join(["python -m benchmarks.speed.predict_throughput", f"--task {args.task}",
                          *([f"--params {args.params}"] if args.params != "params.yaml" else [])])
    lines = [
        SECTION if teacher_dir is None else f"{SECTION}: distilled student and teacher", "", measured(), "",
        f"Reproduce: `{reproduce}` ({args.threads} threads, no GPU; needs the run first).", "",
        f"Model: the exported `{args.task}` classifier ({len(ours.model.encoder.blocks)} layers × "
        f"{ours.model.classifier.in_features} hidden, fit `{ours.info.fit}`), max length "
        f"{ours.info.max_seq_len}. Sentences: "
        f"{len(texts):,} of the task's texts ({statistics.mean(lengths):.0f} words on average, "
        f"{min(lengths)}–{max(lengths)}). Median of {args.repeats} interleaved passes each; ours "
        f"and the batched pipeline agree on {agree:.1%} of the labels, ours in torch and in int8 "
        f"on {int8_agree:.1%}.", "",
        f"| measure | ours, torch fp32 (length-bucketed, batch {b}) | ours, ONNX Runtime fp32 | "
        f"ours, ONNX Runtime int8 | HF `pipeline(\"text-classification\")` default | HF pipeline, "
        f"`batch_size={b}` |",
        "|---|---|---|---|---|---|",
        f"| sentences/s | {median['ours']:,.0f} | {median['onnx']:,.0f} | {median['onnx-int8']:,.0f} | "
        f"{median['hf_default']:,.0f} | {median['hf_batched']:,.0f} |",
        f"| ÷ ours, torch fp32 | 1.00 | **{median['onnx'] / median['ours']:.2f}** | "
        f"**{median['onnx-int8'] / median['ours']:.2f}** (target ≥ 2) | "
        f"{median['hf_default'] / median['ours']:.2f} | {median['hf_batched'] / median['ours']:.2f} |",
        f"| test {scores['metric']} | {scores['fp32'] * 100:.2f} | {scores['fp32'] * 100:.2f} | "
        f"{scores['int8'] * 100:.2f}{refused(scores)} | (the same weights as torch fp32) | |", ""]
    if teacher_dir is not None:
        tm = models["teacher"]
        lines += [
            f"The teacher: `{args.task}`'s teacher ({len(tm.model.encoder.blocks)} layers × "
            f"{tm.model.classifier.in_features} hidden, fit `{tm.info.fit}`), the same sentences in "
            f"the same passes; it and the student agree on {agreement('teacher', 'ours'):.1%} of the "
            "labels.", "",
            "| measure | teacher, torch fp32 | teacher, ONNX Runtime int8 | student, ONNX Runtime int8 |",
            "|---|---|---|---|",
            f"| sentences/s | {median['teacher']:,.0f} | {median['teacher-int8']:,.0f} | "
            f"{median['onnx-int8']:,.0f} |",
            f"| ÷ teacher, torch fp32 | 1.00 | {median['teacher-int8'] / median['teacher']:.2f} | "
            f"**{median['onnx-int8'] / median['teacher']:.2f}** (target ≥ 5) |",
            f"| test {teacher_scores['metric']} | {teacher_scores['fp32'] * 100:.2f} | "
            f"{teacher_scores['int8'] * 100:.2f}{refused(teacher_scores)} | "
            f"{scores['int8'] * 100:.2f}{refused(scores)} |", ""]
    lines += [
        "The pipeline's default runs one sentence per forward pass; batched, it pads every batch "
        "to its longest sentence in input order. Ours sorts by length within chunks of 50 "
        "batches, so a batch holds sentences of similar length.", ""]
    write_section("\n".join(lines))


if __name__ == "__main__":
    main()
