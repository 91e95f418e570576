"""The AdamW step of a training step: torch's default CPU implementation (a loop over the
parameters) against its fused kernel, interleaved in one run.

Two shapes, each at the thread count the pipeline trains it with: a fine-tuning step of the
token head (NER-sized batches: 32 sentences of 32 subwords; one thread, as each of two fits at
once on two cores has) and a pretraining step (32 × 128, MLM + NSP; all threads). The
optimizer updates every parameter every step however few tokens the batch holds, the 8,192 ×
256 word embeddings included: the smaller the batch, the larger its share.

Usage:  python -m benchmarks.speed.optimizer_step [--preset mini] [--steps 30]
Writes the "Optimizer step" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.model.build import build_model
from components.model.config import IGNORE, BertConfig
from components.training.common import adamw
from components.training.finetune_module import loss_of
from components.training.pretrain import bert_config

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Optimizer step"


def batch(kind: str, B: int, T: int, V: int, labels: int) -> dict:
    """A random batch of the shape the model's head trains on."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (B, T), generator=g)
    inputs = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
              "attention_mask": torch.ones(B, T, dtype=torch.bool)}
    if kind == "token":
        return {**inputs, "labels": torch.randint(0, labels, (B, T), generator=g)}
    mlm = torch.where(torch.rand(B, T, generator=g) < 0.15, ids, torch.full_like(ids, IGNORE))
    return {**inputs, "mlm": mlm, "nsp": torch.randint(0, 2, (B,), generator=g)}


def loss(model: torch.nn.Module, kind: str, b: dict) -> torch.Tensor:
    """The token head's loss as fine-tuning computes it; pretraining's from its model."""
    if kind == "token":
        return loss_of(model, "token", b)
    return model(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["mlm"], b["nsp"])["loss"]


def measure(cfg: BertConfig, kind: str, B: int, T: int, threads: int, steps: int) -> dict:
    """Median step and optimizer seconds of each implementation, steps interleaved."""
    torch.set_num_threads(threads)
    head = "token" if kind == "token" else "pretraining"
    models = {impl: build_model(cfg, head, num_labels=9).train() for impl in ("loop", "fused")}
    optimizers = {impl: adamw(m.parameters(), 1e-4, 0.01, fused=impl == "fused")
                  for impl, m in models.items()}
    b = batch(kind, B, T, cfg.vocab_size, 9)
    times: dict[str, list[tuple[float, float]]] = {impl: [] for impl in models}
    for i in range(steps + 3):
        for impl, model in models.items():
            start = time.perf_counter()
            loss(model, kind, b).backward()
            middle = time.perf_counter()
            optimizers[impl].step()
            optimizers[impl].zero_grad(set_to_none=True)
            end = time.perf_counter()
            if i >= 3:  # warm-up
                times[impl].append((end - start, end - middle))
    return {impl: {"step": statistics.median(t for t, _ in ts), "opt": statistics.median(o for _, o in ts)}
            for impl, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p = load_params(ROOT / "params-classic.yaml")  # the classic recipe these rows measure
    parser.add_argument("--preset", default=p.model.preset)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per implementation")
    args = parser.parse_args()
    size = p.model.presets[args.preset]
    model = p.model.model_copy(update={"preset": args.preset})
    cfg = replace(bert_config(model, p.tokenizer.vocab_size, p.pretrain), dropout=0.1, norm="post")
    cores = torch.get_num_threads()
    shapes = [("fine-tuning, token head", "token", p.finetune.batch_size, 32, 1),
              ("pretraining, MLM + NSP", "pretraining", p.pretrain.batch_size, p.pairs.max_seq_len, cores)]
    rows = []
    for title, kind, B, T, threads in shapes:
        m = measure(cfg, kind, B, T, threads, args.steps)
        loop, fused = m["loop"], m["fused"]
        rows.append(f"| {title} ({B} × {T}, {threads} thread{'s' * (threads > 1)}) "
                    f"| {loop['step'] * 1e3:.1f} ms ({loop['opt'] / loop['step']:.0%}) "
                    f"| {fused['step'] * 1e3:.1f} ms ({fused['opt'] / fused['step']:.0%}) "
                    f"| **{loop['step'] / fused['step']:.2f}** |")
    text = "\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.optimizer_step --preset {args.preset}` (fp32, no GPU).",
        "",
        f"A training step (forward, backward, AdamW) of preset `{args.preset}` ({size.layers} layers × "
        f"{size.hidden}, vocab {cfg.vocab_size}), median of {args.steps} interleaved steps each; in "
        "brackets the optimizer's share of the step.",
        "",
        "| step | AdamW, torch's CPU default (loop) | AdamW fused | speed-up |",
        "|---|---|---|---|",
        *rows, "",
    ])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
