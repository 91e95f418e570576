"""The int8 check of every task's exported model (finetune.init's first start's), as the
finetune stage runs it with `finetune.onnx` (components.model.onnx_model.write_onnx): the ONNX
graph, its int8 twin, and how the int8 model's answers on the test split compare with the fp32
torch model's; with the seconds the export, the quantization and the check took.

Usage:  python -m benchmarks.checks.int8_check [--project DIR]   (DIR: a project that ran `make run`)
Writes the "int8 check" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.exported import exported_models, project_option
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.data.tasks.folder import read_split
from components.evaluation.metrics import primary_metric
from components.lifecycle.inference import load_task_model
from components.model.decoding import predict
from components.model.inputs import encode
from components.model.onnx_model import write_onnx
from components.training.finetune_module import score

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## int8 check"


def fp32_on_test(model_dir: Path, task_dir: Path) -> tuple:
    """An exported task model, its task's test split (rows, and encoded for it), its decoding
    settings and the fp32 torch model's answers on that split."""
    tm = load_task_model(model_dir)
    info, task = tm.info, tm.info.task
    gold = read_split(task_dir, "test")
    test = encode(gold, task.kind, tm.tokenizer, info.labels, info.max_seq_len, task.long_text,
                  info.label_subwords, task.max_span_words, info.scheme, task.chunk_overlap)
    decoding = {"span_decoding": task.span_decoding, "threshold": info.threshold,
                "tag_decoding": task.tag_decoding}
    return tm, gold, test, decoding, predict(tm.model, task.kind, test, info.space, 64, **decoding)


def check(model_dir: Path, task_dir: Path, out: Path) -> dict:
    """write_onnx on one exported task model, its fp32 torch predictions of the test split first."""
    tm, gold, test, decoding, fp32 = fp32_on_test(model_dir, task_dir)
    info, task = tm.info, tm.info.task
    metric = (primary_metric(task.kind, info.scheme),
              lambda found: score(task.kind, info.space, found, gold, info.scheme))
    start = time.perf_counter()
    result = write_onnx(tm.model, task.kind, info.space, test, fp32, metric, info.max_seq_len, out, 64,
                        **decoding)
    return {**result, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    project_option(parser)
    args = parser.parse_args()
    start = load_params(args.project / "params.yaml").finetune.init[0]  # exported_models' start
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, _, model, task_dir in exported_models(args.project):
            r = check(model, task_dir, Path(tmp) / name)
            verdict = f"**refused**: {r['refused']}" if r["refused"] else "served"
            rows.append(f"| {name} | {r['examples']:,} | {r['agreement']:.2%} | {r['metric']} | "
                        f"{r['fp32'] * 100:.2f} | {r['int8'] * 100:.2f} | {verdict} | {r['seconds']:.0f} |")
            print(rows[-1], flush=True)
    write_section("\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.checks.int8_check` after `make run` ({torch.get_num_threads()} "
        "threads; the check the finetune stage runs with `finetune.onnx`). Each task's exported "
        f"model (finetune.init's first start, {start}; first seed) on its test split: the share of "
        "examples whose int8 answer (label, tag sequence, spans) equals the fp32 torch model's, and the "
        "metric of each. "
        "int8 is served only at ≥ 99% agreement and at most 0.5 point lower.", "",
        "| task | test examples | agreement | metric | fp32 | int8 | int8 | seconds (export, "
        "quantize, check) |",
        "|---|---|---|---|---|---|---|---|", *rows, ""]))


if __name__ == "__main__":
    main()
