"""How a classic encoder's attention is exported, side by side: SDPA as torch.onnx traces it (a
NaN guard per layer) against plain products with an additive mask (components.model.onnx_model,
the export's form), each in ONNX Runtime fp32 and int8, against the fp32 torch forward. Timed
at the model (no tokenization), on padded batches of one shape, passes interleaved.

Models: a task's teacher (6 x 384, MiniLM fine-tuned) and its first two layers (2 x 384, the
size of a student cut by `distill.student_layers: [0, 1]`; its head as the teacher's).

Usage:  python -m benchmarks.speed.onnx_attention [--task movie-sentiment] [--params params-distill.yaml]
        [--project DIR]   (after `bertflow run -p params-distill.yaml --until teacher@TASK`)
Writes the "ONNX attention export" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.exported import project_option
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.lifecycle.inference import load_task_model
from components.model import onnx_model
from components.model.onnx_model import OnnxHead, export_graph, quantize

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

BATCH, TOKENS, PASSES, ROUNDS = 64, 40, 10, 3


def sentences_per_second(forward, inputs: dict) -> float:
    forward(**inputs)  # warm-up
    start = time.perf_counter()
    for _ in range(PASSES):
        forward(**inputs)
    return BATCH * PASSES / (time.perf_counter() - start)


def graphs(model: torch.nn.Module, work: Path) -> dict[str, OnnxHead]:
    """The model's four ONNX Runtime sessions: {sdpa, matmul} x {fp32, int8}."""
    export = onnx_model._for_export
    heads = {}
    for form in ("sdpa", "matmul"):
        if form == "sdpa":  # the export as it was: the model's own SDPA
            onnx_model._for_export = lambda m: m
        try:
            export_graph(model, "classification", 128, work / f"{form}.onnx")
        finally:
            onnx_model._for_export = export
        quantize(work / f"{form}.onnx", work / f"{form}-int8.onnx")
        heads |= {f"{form} fp32": OnnxHead(work / f"{form}.onnx"),
                  f"{form} int8": OnnxHead(work / f"{form}-int8.onnx")}
    return heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="movie-sentiment")
    parser.add_argument("--params", default="params-distill.yaml")
    project_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(2)
    p = load_params(args.project / args.params)
    teacher = load_task_model(args.project / p.paths.models / "teachers" / args.task / "model").model.eval()
    cut = copy.deepcopy(teacher)
    cut.encoder.blocks = torch.nn.ModuleList(list(cut.encoder.blocks)[:2])
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(TOKENS // 2, TOKENS + 1, (BATCH, 1), generator=g)
    inputs = {"input_ids": torch.randint(1000, 2000, (BATCH, TOKENS), generator=g),
              "token_type_ids": torch.zeros(BATCH, TOKENS, dtype=torch.long),
              "attention_mask": torch.arange(TOKENS)[None] < lengths}
    rows = []
    for label, model in (("2 × 384 (teacher's layers 0-1)", cut), ("6 × 384 (teacher)", teacher)):
        with tempfile.TemporaryDirectory() as work:
            runners = {"torch fp32": torch.inference_mode()(model.forward), **graphs(model, Path(work))}
            rates: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(ROUNDS):  # interleaved: a slow moment of the machine hits every form
                for name, run in runners.items():
                    rates[name].append(sentences_per_second(run, inputs))
        rate = {name: statistics.median(r) for name, r in rates.items()}
        base = rate["torch fp32"]
        forms = ("sdpa fp32", "sdpa int8", "matmul fp32", "matmul int8")
        cells = " | ".join(f"{rate[n]:,.0f} ({rate[n] / base:.2f})" for n in forms)
        gain = rate["matmul int8"] / rate["sdpa int8"]
        rows.append(f"| {label} | {base:,.0f} | {cells} | **{gain:.2f}** |")
        print(rows[-1], flush=True)
    write_section("\n".join([
        "## ONNX attention export", "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.onnx_attention --task {args.task} --params {args.params}` "
        f"(2 threads, no GPU; after `bertflow run -p {args.params} --until teacher@{args.task}`).", "",
        f"Sentences per second at the model (no tokenization), batches of {BATCH} padded to {TOKENS} tokens "
        f"(each row {TOKENS // 2}-{TOKENS} real), median of {ROUNDS} interleaved rounds of {PASSES} passes; "
        "in brackets, ÷ torch fp32.", "",
        "| model | torch fp32 | SDPA export, fp32 | SDPA export, int8 | plain products, fp32 | "
        "plain products, int8 | int8: plain ÷ SDPA |",
        "|---|---|---|---|---|---|---|", *rows, ""]))


if __name__ == "__main__":
    main()
