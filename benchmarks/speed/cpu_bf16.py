"""bf16 autocast against fp32 on this CPU: a fine-tuning step of each head the pipeline trains,
interleaved in one run (the pretraining step's bf16 rows are pretrain_throughput.py's), with the
matrix-product rates and what `precision: auto` chose here and why.

With AMX (`amx_bf16`: Sapphire Rapids and later) bf16 matrix products run several times the fp32
rate; without bf16 instructions bf16 is emulated and far slower; with `avx512_bf16` alone it
depends on the CPU (components/training/precision.py). A section per such path: this CPU's
replaces only its own path's. Steps: the default preset's encoder with a classification head on a batch of
`finetune.batch_size` × `finetune.task_defaults.max_seq_len`, and the token head on the same batch; AdamW.

Usage:  python -m benchmarks.speed.cpu_bf16 [--steps 12]
Writes the "bf16 on CPU: PATH" section of benchmarks/RESULTS.md (PATH: AMX, avx512_bf16 without AMX,
no bf16 instructions).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.results import measured, write_section
from benchmarks.speed.pretrain_throughput import matmul_rate
from components.core.params import load_params
from components.model.build import task_model
from components.model.config import BertConfig
from components.training.precision import auto_precision, bf16_speedup, has_amx, has_avx512_bf16
from components.training.pretrain import bert_config

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## bf16 on CPU"


def path_name() -> str:
    """Which of `precision: auto`'s CPU paths this CPU takes."""
    return "AMX" if has_amx() else "avx512_bf16 without AMX" if has_avx512_bf16() else "no bf16 instructions"


def step_of(kind: str, cfg: BertConfig, B: int, T: int, bf16: bool):
    """One fine-tuning step (forward, backward, AdamW) of a `kind` head, as a closure."""
    space = ["a", "b", "c"] if kind == "classification" else ["O", "B-X", "I-X"]
    model = task_model(cfg, kind, space).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, cfg.vocab_size, (B, T), generator=g)
    types, mask = torch.zeros_like(ids), torch.ones(B, T, dtype=torch.bool)
    labels = torch.randint(0, 3, (B,) if kind == "classification" else (B, T), generator=g)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            logits = model(ids, types, mask)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, -2), labels.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    p = load_params(ROOT / "params-classic.yaml")  # the classic recipe these rows measure
    # The encoder as fine-tuning trains it: the fine-tuning dropout.
    cfg = replace(bert_config(p.model, p.tokenizer.vocab_size, p.pretrain), dropout=p.model.dropout)
    B, T = p.finetune.batch_size, p.finetune.task_defaults.max_seq_len
    rows = []
    for kind in ("classification", "token"):
        steps = {prec: step_of(kind, cfg, B, T, prec == "bf16") for prec in ("fp32", "bf16")}
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for prec in ("fp32", "bf16", "fp32", "bf16"):  # warm-up
            steps[prec]()
        for _ in range(args.steps):  # interleaved
            for prec, step in steps.items():
                start = time.perf_counter()
                step()
                times[prec].append(time.perf_counter() - start)
        fp32, bf16 = statistics.median(times["fp32"]), statistics.median(times["bf16"])
        rows.append(f"| fine-tuning step, {kind} head | {B * T / fp32:,.0f} | {B * T / bf16:,.0f} | "
                    f"**{fp32 / bf16:.2f}** |")
        print(rows[-1], flush=True)
    rates = {d: statistics.median(matmul_rate(d) for _ in range(3)) for d in (torch.float32, torch.bfloat16)}
    choice = auto_precision()
    text = "\n".join([
        f"{SECTION}: {path_name()}", "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.cpu_bf16` ({torch.get_num_threads()} threads).",
        "",
        f"`precision: auto` here: {choice.precision} ({choice.reason}); the product that decides "
        f"where the flags do not ran {bf16_speedup():.2f}× as fast in bf16 as in fp32.",
        "",
        f"Shape: preset `{p.model.preset}`, batch {B} × {T}, dropout {p.model.dropout}, AdamW; median "
        f"of {args.steps} interleaved steps each. 2048² matrix products: fp32 "
        f"{rates[torch.float32] / 1e9:,.0f} GFLOP/s, bf16 {rates[torch.bfloat16] / 1e9:,.0f} GFLOP/s.",
        "",
        "| step | fp32 tokens/s | bf16 autocast tokens/s | bf16 / fp32 |",
        "|---|---|---|---|",
        *rows,
        "",
    ])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
