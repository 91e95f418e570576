"""The int8 recipe: onnxruntime's default dynamic quantization (one scale per weight matrix, the
embedding tables quantized too) against bertflow's (components.model.onnx_model.quantize: one
scale per output column, the matrix products only), on the same ONNX graph of each exported task
model and, with the distill preset, each teacher. Per model and recipe: the share of test
examples whose int8 answer equals the fp32 torch model's (the int8 check serves at >= 99%), the
test metric, and int8 sentences per second on the test split (median of interleaved repeats).

Usage:  python -m benchmarks.experiments.int8_recipe [--project DIR] [--params params-distill.yaml]
            [--repeats 3]
Writes the "int8 recipe: PARAMS" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.checks.int8_check import fp32_on_test
from benchmarks.exported import project_option
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.model.decoding import predict
from components.model.onnx_model import OnnxHead, _answer, export_graph, quantize
from components.training.finetune_module import score

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## int8 recipe"  # ": PARAMS" follows: one section per params file


def onnxruntime_default(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)


RECIPES = {"per matrix, embeddings too": onnxruntime_default, "per column, products only": quantize}


def models(project: Path, params: str) -> list[tuple[str, Path, Path]]:
    """(name, model folder, task data folder) of each exported task model (finetune.init's first
    start's, the one the registry takes) and teacher."""
    p = load_params(project / params)
    found = []
    for kind in ("tasks", "teachers"):
        for task in p.finetune.tasks:
            folder = project / p.paths.models / kind / task
            model = (folder / p.finetune.init[0] if kind == "tasks" else folder) / "model"
            if model.exists():
                found.append((f"{task} ({'teacher' if kind == 'teachers' else 'exported'})", model,
                              project / p.paths.tasks / task))
    return found


def compare(model_dir: Path, task_dir: Path, tmp: Path, repeats: int) -> tuple[float, dict[str, dict]]:
    """The fp32 torch model's test metric, and each recipe's agreement with its answers, int8
    metric and sentences per second on the test split."""
    tm, gold, test, decoding, fp32 = fp32_on_test(model_dir, task_dir)
    info, task = tm.info, tm.info.task
    export_graph(tm.model, task.kind, info.max_seq_len, tmp / "fp32.onnx")
    heads = {}
    for i, (name, recipe) in enumerate(RECIPES.items()):
        recipe(tmp / "fp32.onnx", tmp / f"int8-{i}.onnx")
        heads[name] = OnnxHead(tmp / f"int8-{i}.onnx", getattr(tm.model, "crf", None))
    rates: dict[str, list[float]] = {name: [] for name in heads}
    found: dict[str, list] = {}
    for _ in range(repeats):  # interleaved: a busy moment slows every recipe alike
        for name, head in heads.items():
            start = time.perf_counter()
            found[name] = predict(head, task.kind, test, info.space, 64, **decoding)
            rates[name].append(len(gold) / (time.perf_counter() - start))
    rows = {}
    for name, answers in found.items():  # the same answers on every pass: scored once
        same = [_answer(task.kind, a) == _answer(task.kind, b) for a, b in zip(fp32, answers, strict=True)]
        rows[name] = {"agreement": sum(same) / len(same), "rate": statistics.median(rates[name]),
                      "metric": score(task.kind, info.space, answers, gold, info.scheme)}
    return score(task.kind, info.space, fp32, gold, info.scheme), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    project_option(parser)
    parser.add_argument("--params", default="params.yaml", help="the params file of the run (a preset)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    a, b = RECIPES
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, task_dir in models(args.project, args.params):
            fp32, r = compare(model, task_dir, Path(tmp), args.repeats)
            cells = [f"{r[k]['agreement']:.2%} | {r[k]['metric'] * 100:.2f} | {r[k]['rate']:,.0f}"
                     for k in (a, b)]
            lines.append(f"| {name} | {fp32 * 100:.2f} | {' | '.join(cells)} |")
            print(lines[-1], flush=True)
    write_section("\n".join([
        f"{SECTION}: {args.params}", "", measured(), "",
        f"Reproduce: `python -m benchmarks.experiments.int8_recipe --project DIR --params {args.params}` "
        f"({torch.get_num_threads()} threads). Each model's ONNX graph quantized by onnxruntime's "
        f"default dynamic recipe (*{a}*) and by bertflow's (*{b}*: "
        "`components.model.onnx_model.quantize`), on its test split: agreement with the fp32 "
        "torch model's answers (the int8 check serves at ≥ 99%), the int8 metric, and int8 "
        "sentences (or texts) per second, the median of interleaved repeats.", "",
        f"| model | fp32 metric | {a}: agreement | metric | per s | {b}: agreement | metric | per s |",
        "|---|---|---|---|---|---|---|---|", *lines, ""]))


if __name__ == "__main__":
    main()
