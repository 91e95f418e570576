"""Pretraining step throughput: our encoder against HF BertForPreTraining, interleaved in one run.

Both train the same shape (the preset from params.yaml), on the same masked batch, with the same
thread count, dropout and AdamW; HF uses its SDPA attention (`_from_config(cfg,
attn_implementation="sdpa")`). Also measured in the same run: the fp32 matrix-product rate of
this CPU, against which our model FLOPs utilisation (MFU) is computed.

Usage:  python benchmarks/pretrain_throughput.py [--preset mini] [--steps 6]
Writes the "Pretraining step" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from components.core.params import load_params  # noqa: E402
from components.model.build import build_model  # noqa: E402
from components.model.config import IGNORE, BertConfig  # noqa: E402
from components.model.pretraining import count_flops_per_token  # noqa: E402

SECTION = "## Pretraining step"


def matmul_rate(n: int = 2048, reps: int = 5) -> float:
    """fp32 FLOP/s of a square matrix product on this CPU, right now."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return reps * 2 * n**3 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p = load_params(ROOT / "params.yaml")
    parser.add_argument("--preset", default=p.model.preset)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per model")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import BertConfig as HFConfig
    from transformers import BertForPreTraining

    size = p.model.presets[args.preset]
    B, T, V = p.pretrain.batch_size, p.pairs.max_seq_len, p.tokenizer.vocab_size
    cfg = BertConfig(vocab_size=V, hidden=size.hidden, layers=size.layers, heads=size.heads,
                     intermediate=size.intermediate, dropout=p.pretrain.dropout, norm="post")
    ours = build_model(cfg).train()
    hf = BertForPreTraining._from_config(
        HFConfig(vocab_size=V, hidden_size=size.hidden, num_hidden_layers=size.layers,
                 num_attention_heads=size.heads, intermediate_size=size.intermediate,
                 hidden_dropout_prob=p.pretrain.dropout, attention_probs_dropout_prob=p.pretrain.dropout),
        attn_implementation="sdpa").train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (B, T), generator=g)
    types = (torch.arange(T) >= T // 2).long().expand(B, T).contiguous()
    attention = torch.ones(B, T, dtype=torch.bool)
    labels = torch.where(torch.rand(B, T, generator=g) < p.pretrain.mlm_probability, ids,
                         torch.full_like(ids, IGNORE))
    nsp = torch.randint(0, 2, (B,), generator=g)
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)

    def step_ours() -> None:
        ours(ids, types, attention, labels, nsp)["loss"].backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_hf() -> None:
        hf(input_ids=ids, token_type_ids=types, attention_mask=attention.long(), labels=labels,
           next_sentence_label=nsp).loss.backward()
        opt_hf.step()
        opt_hf.zero_grad(set_to_none=True)

    for step in (step_ours, step_hf, step_ours, step_hf):  # warm-up
        step()
    t_ours, t_hf, rates = [], [], []
    for _ in range(args.steps):  # interleaved: both see the same machine state
        start = time.perf_counter()
        step_ours()
        t_ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        step_hf()
        t_hf.append(time.perf_counter() - start)
        rates.append(matmul_rate())
    ours_s, hf_s, peak = statistics.median(t_ours), statistics.median(t_hf), statistics.median(rates)
    flops = count_flops_per_token(cfg, T, p.pretrain.mlm_probability) * B * T
    text = "\n".join([
        SECTION, "",
        f"Reproduce: `python benchmarks/pretrain_throughput.py --preset {args.preset}` "
        f"({args.threads} threads, fp32, no GPU).",
        "",
        f"Shape: preset `{args.preset}` ({size.layers} layers × {size.hidden} hidden, {size.heads} heads, "
        f"{size.intermediate} FFN), vocab {V}, batch {B} × {T}, dropout {p.pretrain.dropout}, "
        f"AdamW; median of {args.steps} interleaved steps each.",
        "",
        "| measure | ours | HF `BertForPreTraining` (sdpa) | ratio (target ≥ 2.0) |",
        "|---|---|---|---|",
        f"| tokens/s | {B * T / ours_s:,.0f} | {B * T / hf_s:,.0f} | **{hf_s / ours_s:.2f}** |",
        "",
        f"fp32 matmul rate measured in the same run (2048² products): {peak / 1e9:.0f} GFLOP/s. "
        f"Our model FLOPs per step: {flops / 1e9:.1f} G (matmuls and attention, forward and "
        f"backward, MLM head on the selected 15% only) → **MFU {flops / ours_s / peak:.0%}** "
        "(target ≥ 75%).",
        "",
    ])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
