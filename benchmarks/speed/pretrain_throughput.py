"""Pretraining step throughput: our encoders against transformers', interleaved in one run.

Each pair trains the same shape (params-classic.yaml's preset unless --preset) on the same
masked batch, with the same thread count, dropout and AdamW: our classic encoder against
`BertForPreTraining`, our modern one against `ModernBertForMaskedLM` (both
`attn_implementation="sdpa"`; ModernBERT with `sparse_prediction`, so it too decodes only the
masked positions). In fp32, and in bf16 autocast where the CPU has AMX (`amx_bf16` in
/proc/cpuinfo), where bf16 matrix products run several times the fp32 rate. Each precision's
matrix-product rate is measured in the same run; model FLOPs utilisation (MFU) is against it.

Usage:  python -m benchmarks.speed.pretrain_throughput [--preset mini] [--steps 12] [--bf16 auto|yes|no]
Writes the "Pretraining step" section of benchmarks/RESULTS.md.
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
from components.core.params import load_params
from components.model.arch import arch_of
from components.model.build import build_model
from components.model.config import IGNORE, BertConfig
from components.model.pretraining import count_flops_per_token
from components.training.compiling import maybe_compile
from components.training.precision import resolve_precision
from components.training.pretrain import bert_config
from pipeline.ops.env import keep_freed_memory

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Pretraining step"


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so that a clock is fair."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_rate(dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 5,
                device: str = "cpu") -> float:
    """FLOP/s of a square matrix product in `dtype` on `device`, right now."""
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return reps * 2 * n**3 / (time.perf_counter() - start)


def transformers_twin(cfg: BertConfig):
    """transformers' model of our config's shape: BertForPreTraining or ModernBertForMaskedLM."""
    from transformers import BertConfig as HFBert
    from transformers import BertForPreTraining, ModernBertConfig, ModernBertForMaskedLM

    if cfg.arch == "modern":
        hf = ModernBertConfig(**{**arch_of(cfg).hf_config(cfg), "sparse_prediction": True})
        return ModernBertForMaskedLM._from_config(hf, attn_implementation="sdpa")
    return BertForPreTraining._from_config(HFBert(**arch_of(cfg).hf_config(cfg)), attn_implementation="sdpa")


def pair_steps(cfg: BertConfig, B: int, T: int, mlm_probability: float, bf16: bool, device: str = "cpu",
               compiled: bool = False):
    """One training step of ours (`compiled`: through torch.compile) and one of transformers'
    (closures), on the same batch."""
    ours, hf = build_model(cfg).to(device).train(), transformers_twin(cfg).to(device).train()
    if compiled:  # as pretrain.compile does it; compiled in the warm-up steps
        maybe_compile(ours, "on", device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, cfg.vocab_size, (B, T), generator=g)
    types = (torch.arange(T) >= T // 2).long().expand(B, T).contiguous()
    attention = torch.ones(B, T, dtype=torch.bool)
    labels = torch.where(torch.rand(B, T, generator=g) < mlm_probability, ids, torch.full_like(ids, IGNORE))
    nsp = torch.randint(0, 2, (B,), generator=g)
    ids, types, attention, labels, nsp = (x.to(device) for x in (ids, types, attention, labels, nsp))
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)

    def cast():
        kind = torch.device(device).type
        return torch.autocast(kind, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step_ours() -> None:
        with cast():
            # the modern recipe has no NSP (packing): the classic one trains it
            loss = ours(ids, types, attention, labels, None if cfg.arch == "modern" else nsp)["loss"]
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_hf() -> None:
        with cast():
            if cfg.arch == "modern":
                loss = hf(input_ids=ids, attention_mask=attention.long(), labels=labels).loss
            else:
                loss = hf(input_ids=ids, token_type_ids=types, attention_mask=attention.long(),
                          labels=labels, next_sentence_label=nsp).loss
        loss.backward()
        opt_hf.step()
        opt_hf.zero_grad(set_to_none=True)

    return step_ours, step_hf


def measure(cfg: BertConfig, B: int, T: int, mlm_probability: float, bf16: bool, steps: int,
            device: str = "cpu", matmul_n: int = 2048, compiled: bool = False) -> dict:
    """Median step times of ours and transformers' (interleaved) and the matmul rate between;
    `first_step_s`: our first step, compiling included when `compiled`."""
    step_ours, step_hf = pair_steps(cfg, B, T, mlm_probability, bf16, device, compiled)
    sync(device)
    start = time.perf_counter()
    step_ours()  # compiled: where the compiling happens
    sync(device)
    first_s = time.perf_counter() - start
    for step in (step_hf, step_ours, step_hf):  # warm-up
        step()
    t_ours, t_hf, rates = [], [], []
    for _ in range(steps):  # interleaved: both see the same machine state
        for step, times in ((step_ours, t_ours), (step_hf, t_hf)):
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            times.append(time.perf_counter() - start)
        rates.append(matmul_rate(torch.bfloat16 if bf16 else torch.float32, matmul_n, device=device))
    ours_s, hf_s, peak = statistics.median(t_ours), statistics.median(t_hf), statistics.median(rates)
    flops = count_flops_per_token(cfg, T, mlm_probability) * B * T
    return {"ours": B * T / ours_s, "hf": B * T / hf_s, "ratio": hf_s / ours_s, "peak": peak,
            "mfu": flops / ours_s / peak, "flops": flops, "first_step_s": first_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p = load_params(ROOT / "params-classic.yaml")  # the classic recipe these rows measure
    parser.add_argument("--preset", default=p.model.preset)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per model")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--bf16", choices=["auto", "yes", "no"], default="auto",
                        help="also measure bf16 autocast (auto: where precision auto trains in bf16)")
    parser.add_argument("--compile", action="store_true",
                        help="also measure our modern step through torch.compile (C++ compiler needed)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # glibc as the pipeline keeps it (pipeline/ops/env.py), for both models
    bf16 = args.bf16 == "yes" or (args.bf16 == "auto" and resolve_precision("auto") == "bf16-mixed")

    size = p.model.presets[args.preset]
    B, T, V = p.pretrain.batch_size, p.pairs.max_seq_len, p.tokenizer.vocab_size
    classic = replace(bert_config(p.model.model_copy(update={"preset": args.preset}), V, p.pretrain),
                      norm="post", sbo=False, rtd=False)
    m = p.model
    modern = replace(classic, arch="modern", layer_norm_eps=1e-5, local_window=m.local_window,
                     global_every=m.global_every, rope_base_global=m.rope_base_global,
                     rope_base_local=m.rope_base_local)
    rows = []
    for precision in ("fp32", "bf16") if bf16 else ("fp32",):
        pairs = ((classic, "classic", "BertForPreTraining", p.pretrain.mlm_probability),
                 (modern, "modern", "ModernBertForMaskedLM", 0.3))
        if args.compile:
            pairs += ((modern, "modern, compiled", "ModernBertForMaskedLM", 0.3),)
        for cfg, name, theirs, masking in pairs:
            r = measure(cfg, B, T, masking, precision == "bf16", args.steps, compiled="compiled" in name)
            rows.append(f"| {name} | {precision} | {masking:.0%} | {r['ours']:,.0f} | `{theirs}` "
                        f"{r['hf']:,.0f} | **{r['ratio']:.2f}** | {r['peak'] / 1e9:,.0f} | "
                        f"**{r['mfu']:.0%}** |")
            print(rows[-1], flush=True)
    text = "\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.pretrain_throughput --preset {args.preset}"
        f"{' --compile' if args.compile else ''}` ({args.threads} threads, no GPU; bf16 rows where "
        "`precision: auto` trains in bf16).",
        "",
        f"Shape: preset `{args.preset}` ({size.layers} layers × {size.hidden} hidden, {size.heads} heads, "
        f"{size.intermediate} FFN), vocab {V}, batch {B} × {T}, dropout {p.pretrain.dropout}, "
        f"AdamW; median of {args.steps} interleaved steps each. Classic trains MLM + NSP, modern "
        f"MLM only at ModernBERT's 30% (window {m.local_window}, a global layer every "
        f"{m.global_every}). MFU: model FLOPs (matmuls and attention, forward and backward, the "
        "MLM head on the selected positions only) per second against the matrix-product rate "
        "of the same precision (2048² products) measured in the same run. glibc keeps freed memory "
        "for both models, as the pipeline's processes do. *compiled*: our encoder blocks and MLM "
        "head with its loss through `torch.compile`, as `pretrain.compile: on` (compiled in the "
        "warm-up).",
        "",
        "| encoder | precision | masked | ours tokens/s | transformers (sdpa) tokens/s | "
        "ratio (modern's target ≥ 1.3) | matmul GFLOP/s | MFU (modern's target ≥ 65%) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
