"""The facts of this machine that decide the last bits of a float result on CPU.

Two CPUs of different models can give different weights from the same inputs: torch's fp32
kernels (ATen's vectorised loops, MKL's and oneDNN's matrix products) pick their code path by
the instructions the CPU offers and, in MKL and oneDNN, by its model and cache sizes. These are
recorded with every training output, so that a run that differs from the reference can say
which of them differ (docs/reliability.md#reproducibility).
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

# Instruction-set flags that select kernels: vector width, bf16/int8 dot products, matrix tiles.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
# Environment variables that pin a library's code path (read when the library loads).
PINS = ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
        "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_facts() -> dict[str, object]:
    """CPU model, the kernel-selecting flags, torch's vector ISA and threads, the math libraries'
    versions and any pins set: a flat, JSON-ready dict (equal on two machines of one type)."""
    import numpy
    import torch

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", config)
    onednn = re.search(r"MKL-DNN v([\d.]+)", config)
    return {
        "cpu_model": info.get("model name") or platform.processor() or platform.machine(),
        # MKL and oneDNN choose kernels and blocking by these, not by the flags alone
        "cpu_id": " ".join(f"{k} {info[k]}" for k in ("cpu family", "model", "stepping") if k in info),
        "caches": " ".join(_cache_sizes()),
        "cpu_flags": " ".join(f for f in KERNEL_FLAGS if f in flags),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "mkl": mkl.group(1) if mkl else "none",
        "onednn": onednn.group(1) if onednn else "none",
        "numpy": numpy.__version__,
        "pins": " ".join(f"{k}={os.environ[k]}" for k in PINS if os.environ.get(k)) or "none",
    }


def differences(reference: dict, current: dict) -> list[str]:
    """`key: reference -> current` for each fact that differs (keys of either)."""
    return [f"{k}: {reference.get(k, '?')} -> {current.get(k, '?')}"
            for k in sorted(set(reference) | set(current)) if reference.get(k) != current.get(k)]


def _cpuinfo() -> dict[str, str]:
    """The fields of the first CPU in /proc/cpuinfo (Linux); {} elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def _cache_sizes() -> list[str]:
    """The first CPU's cache sizes, L1 to L3 (Linux sysfs); [] elsewhere."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        return [(d / "size").read_text().strip() for d in sorted(base.glob("index*"))]
    except OSError:
        return []
