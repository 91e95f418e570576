"""Whether a training step runs through `torch.compile`: `compile: auto` compiles on CUDA (with
Triton), where eager PyTorch's separate elementwise kernels (rotary positions, GeGLU, LayerNorms,
the masked head's log-softmax and loss) each read and write the activations once more; `on`
compiles on CPU too (with a C++ compiler), `off` never.

Only the regions whose shapes the data does not decide are compiled: each encoder block and the
MLM head with its loss (the masked-position count is dynamic). On 2 CPU cores the pipeline's
pretraining step ran 0.96-1.04x eager compiled (benchmarks/RESULTS.md, "Pretraining step"): its
time is in the matrix products, which stay the same library calls, so `auto` leaves CPUs eager.
Same loss as eager to rounding (tests/test_compile.py).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

import torch
from torch import nn

from components.core.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compiled:
    """Whether the step is compiled, and why (recorded with the run's stats)."""

    compiled: bool
    reason: str

    def record(self) -> dict:
        return {"compiled": self.compiled, "compile_rule": self.reason}


def backend_missing(device: str) -> str | None:
    """What inductor lacks on `device` ("cpu" or "cuda"), or None where it can compile."""
    if device == "cuda":
        return None if importlib.util.find_spec("triton") else "no Triton"
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception:  # noqa: BLE001 - torch raises its own types; any means no compiler
        return "no C++ compiler"
    return None


def decide(setting: str, device: str) -> Compiled:
    """`setting` (auto, on, off) on `device`: compiled or not, and the rule that said so."""
    if setting == "off":
        return Compiled(False, "compile: off")
    if setting == "auto" and device != "cuda":
        return Compiled(False, "compile: auto, eager on CPU (compiled steps measured no faster)")
    missing = backend_missing(device)
    if missing and setting == "on":
        raise ConfigError(f"pretrain.compile: on, but torch.compile has {missing} on {device}: "
                          "install one, or set it to auto or off")
    if missing:
        return Compiled(False, f"compile: auto, eager: {missing}")
    return Compiled(True, "compile: on" if setting == "on" else "compile: auto, CUDA with Triton")


def step_device(accelerator: str) -> str:
    """The device type Lightning's `accelerator` trains on here."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def regions(network: nn.Module) -> list[tuple[nn.Module, bool]]:
    """What is compiled, each with whether its shapes are dynamic from the start: every encoder
    block (the batch's shape changes only with the phase) and the MLM head (N masked positions,
    a new count every step). Not the whole model: the attention masks and the masked-position
    selection depend on the data's values, which would break the graph at every step."""
    from components.model import encoder, modern
    from components.model.pretraining import MLMHead

    return [(m, isinstance(m, MLMHead)) for m in network.modules()
            if isinstance(m, (encoder.Block, modern.Block, MLMHead))]


def maybe_compile(network: nn.Module, setting: str, accelerator: str) -> Compiled:
    """Compile `network`'s regions in place (parameters and state_dict keys unchanged) where
    `setting` says so on the device `accelerator` trains on."""
    choice = decide(setting, step_device(accelerator))
    if choice.compiled:
        # A block's graphs: with and without its attention norm (the first block has none),
        # masks or none (rows of one document), training and evaluation (no grad), two phases:
        # more than dynamo's default 8 a function, after which it would run the rest eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        for module, dynamic in regions(network):
            module.compile(dynamic=dynamic or None)
    log.info("training step: %s (%s)", "compiled" if choice.compiled else "eager", choice.reason)
    return choice
