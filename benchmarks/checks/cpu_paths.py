"""Which math-library code paths decide the bits of a pretraining step on this CPU, and what
pinning them costs.

The default shape trains for --steps steps on fixed seeded batches, in a fresh process per
setting (the libraries read their pins when they load): the default, MKL's conditional
numerical reproducibility (MKL_CBWR), oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA), ATen's CPU
capability (ATEN_CPU_CAPABILITY), and combinations. Per setting: sha256 of the weights after
the steps, the last loss, and the step time against the default's (median of the timed steps).
Two settings with one hash take the same code path here; whether a pin makes two CPU *models*
agree needs this run on both (compare the hashes of the same setting across machines).

Usage:  python -m benchmarks.checks.cpu_paths [--steps 30]
Writes the section "CPU code paths (<cpu id>)" of benchmarks/RESULTS.md: one per CPU model, so
that runs on other machines add theirs beside it and the hashes of one setting can be compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.results import measured, write_section

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## CPU code paths"
SETTINGS = {
    "default": {},
    "MKL_CBWR=AVX512": {"MKL_CBWR": "AVX512"},
    "MKL_CBWR=AVX512,STRICT": {"MKL_CBWR": "AVX512,STRICT"},
    "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "ONEDNN_MAX_CPU_ISA=AVX512_CORE": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "ONEDNN_MAX_CPU_ISA=AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "ATEN_CPU_CAPABILITY=avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "all three at AVX2": {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
}


def train(steps: int) -> dict:
    """`steps` AdamW steps of the default shape on fixed batches; the weights' hash and times."""
    import torch

    from components.core.machine import cpu_facts
    from components.core.params import load_params
    from components.model.build import build_model
    from components.model.config import IGNORE
    from components.training.pretrain import bert_config

    p = load_params(ROOT / "params-classic.yaml")  # the classic recipe these rows measure
    B, T, V = p.pretrain.batch_size, p.pairs.max_seq_len, p.tokenizer.vocab_size
    torch.manual_seed(0)
    model = build_model(bert_config(p.model, V, p.pretrain)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    times, loss = [], 0.0
    for _ in range(steps):
        ids = torch.randint(5, V, (B, T), generator=g)  # (B, T)
        types = (torch.arange(T) >= T // 2).long().expand(B, T).contiguous()
        labels = torch.where(torch.rand(B, T, generator=g) < p.pretrain.mlm_probability, ids,
                             torch.full_like(ids, IGNORE))
        nsp = torch.randint(0, 2, (B,), generator=g)
        start = time.perf_counter()
        out = model(ids, types, torch.ones(B, T, dtype=torch.bool), labels, nsp)["loss"]
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        loss = out.item()
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().contiguous().numpy().tobytes())
    return {"sha256": digest.hexdigest()[:16], "loss": loss, "step_s": statistics.median(times[2:]),
            "facts": cpu_facts()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(train(args.steps)))
        return
    pins = ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
    base = {k: v for k, v in os.environ.items() if k not in pins}
    results = {}
    for name, env in SETTINGS.items():
        proc = subprocess.run([sys.executable, "-m", __spec__.name, "--worker", "--steps", str(args.steps)],
                              env={**base, **env}, capture_output=True, text=True, check=True)
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(name, results[name]["sha256"], f"{results[name]['step_s']:.3f} s", flush=True)
    facts = results["default"]["facts"]
    ref = results["default"]
    rows = [f"| {name} | `{r['sha256']}` | {'same' if r['sha256'] == ref['sha256'] else 'differs'} | "
            f"{r['loss']:.6f} | {r['step_s'] / ref['step_s']:.2f} |" for name, r in results.items()]
    text = "\n".join([
        f"{SECTION} ({facts['cpu_id'] or facts['cpu_model']})", "", measured(), "",
        f"Reproduce: `python -m benchmarks.checks.cpu_paths --steps {args.steps}` (a fresh process per "
        "setting; the default shape, fixed seeded batches, AdamW).",
        "",
        f"CPU: {facts['cpu_model']} ({facts['cpu_id']}; caches {facts['caches']}), flags "
        f"{facts['cpu_flags']}; torch {facts['torch']}, MKL {facts['mkl']}, oneDNN "
        f"{facts['onednn']}, {facts['threads']} threads.",
        "",
        f"| setting | weights after {args.steps} steps (sha256) | vs default | last loss | "
        "step time vs default |",
        "|---|---|---|---|---|",
        *rows, "",
    ])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
