"""The precision `precision: auto` trains in: bf16 mixed precision where this device multiplies
bf16 natively and faster than fp32, fp32 elsewhere.

The CPU's flags alone do not say it. With AMX (`amx_bf16`) bf16 products run several times the
fp32 rate; without bf16 instructions bf16 is emulated, far slower. `avx512_bf16` without AMX is
ambiguous: the same torch multiplied bf16 at 2.2x the fp32 rate on a Zen 4 EPYC and at 0.5-0.7x
on a Xeon whose AMX the hypervisor hides (benchmarks/RESULTS.md, "bf16 on CPU: ..."). Where bf16 took
over (AMX), the transfer probe at equal minutes lost nothing ("bf16 against fp32"). There a short
product of the encoder's shape decides, measured once per run: the choice is passed to every
process the run starts (`BERTFLOW_AUTO_PRECISION`), so all its stages train in one precision.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

ENV = "BERTFLOW_AUTO_PRECISION"  # `precision|reason`: the run's choice, inherited by its processes
MIN_SPEEDUP = 1.3  # bf16 products must beat fp32 by this much: measured 0.5-0.7x or 2.2x so far
SHAPE = (4096, 256, 672)  # (tokens, hidden, GeGLU width): the default encoder's largest product


@dataclass(frozen=True)
class Choice:
    """What `auto` chose, and the rule that chose it (recorded with the outputs)."""

    precision: str
    reason: str


def resolve_precision(precision: str) -> str:
    """The Lightning precision to train in: `precision`, or `auto`'s choice on this device."""
    return precision if precision != "auto" else auto_precision().precision


def record(precision: str) -> dict[str, str]:
    """The precision for a stage's stats: what it trained in and, under `auto`, the rule that chose it."""
    if precision != "auto":
        return {"precision": precision}
    choice = auto_precision()
    return {"precision": choice.precision, "precision_rule": choice.reason}


def has_amx() -> bool:
    """Whether this CPU multiplies bf16 matrices in AMX tiles (Sapphire Rapids and later)."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def has_avx512_bf16() -> bool:
    """Whether this CPU has AVX-512's bf16 dot products (Cooper Lake, Sapphire Rapids, Zen 4)."""
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


@functools.cache
def auto_precision() -> Choice:
    """`auto`'s choice for this run: inherited from the process that started this one, or made
    here (once per process) and passed on to the processes this one starts."""
    if inherited := os.environ.get(ENV):
        precision, _, reason = inherited.partition("|")
        return Choice(precision, reason)
    choice = choose()
    os.environ[ENV] = f"{choice.precision}|{choice.reason}"
    log.info("precision auto: %s (%s)", choice.precision, choice.reason)
    return choice


def choose() -> Choice:
    """The rule: CUDA by its bf16 support; a CPU by its flags, and by a measured product where
    it has `avx512_bf16` without AMX."""
    if torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return Choice("bf16-mixed", "CUDA with bf16")
        return Choice("32-true", "CUDA without bf16")
    if has_amx():
        return Choice("bf16-mixed", "CPU with AMX: bf16 products in matrix tiles")
    if not has_avx512_bf16():
        return Choice("32-true", "CPU without bf16 instructions (AMX or avx512_bf16): bf16 is emulated")
    speedup = bf16_speedup()
    log.info("precision auto: avx512_bf16 without AMX; a %dx%d by %dx%d product runs %.2fx as fast "
             "in bf16 as in fp32 (bf16 needs %.1fx)", SHAPE[0], SHAPE[1], SHAPE[1], SHAPE[2], speedup,
             MIN_SPEEDUP)
    if speedup >= MIN_SPEEDUP:
        return Choice("bf16-mixed", f"avx512_bf16 without AMX: bf16 products measured >= {MIN_SPEEDUP}x fp32")
    return Choice("32-true", f"avx512_bf16 without AMX: bf16 products measured < {MIN_SPEEDUP}x fp32")


def bf16_speedup(reps: int = 5) -> float:
    """How many times faster a product of the encoder's shape runs in bf16 than in fp32 on this
    CPU now: the best of `reps` timings each, interleaved (about 0.1 s on 2 cores)."""
    m, k, n = SHAPE
    g = torch.Generator().manual_seed(0)
    pairs = {dtype: (torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype))
             for dtype in (torch.float32, torch.bfloat16)}
    best = {dtype: float("inf") for dtype in pairs}
    for _ in range(reps + 1):  # the first round warms the kernels up
        for dtype, (a, b) in pairs.items():
            start = time.perf_counter()
            a @ b
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]
